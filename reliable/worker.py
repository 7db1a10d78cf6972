"""Run declared handlers: one transport, one `PushConsumer` per handler."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterable
from typing import Any

from reliable.consumer.push import PushConsumer
from reliable.decorators import Handler
from reliable.errors import ConfigurationError
from reliable.producer import Producer
from reliable.transport import Transport, connect

log = logging.getLogger(__name__)


class Worker:
    """Start every handler's consumer over one transport; stop them all gracefully.

    `Worker(h1, h2, transport="embedded", store_dir="/var/lib/app/store")`, or pass a
    `Transport`; consumer options (`engine=`, ...) go in `consumer_options`.
    """

    def __init__(
        self,
        *handlers: Handler | Iterable[Handler],
        transport: Transport | str = "embedded",
        consumer_options: dict[str, Any] | None = None,
        **transport_options: Any,
    ) -> None:
        flat: list[Handler] = []
        for h in handlers:
            flat.extend([h] if isinstance(h, Handler) else h)
        for h in flat:
            if not isinstance(h, Handler):
                raise ConfigurationError(f"{h!r} is not a declared handler")
        keys = [(h.topic, h.group) for h in flat]
        if len(set(keys)) != len(keys):
            raise ConfigurationError("two handlers share one (topic, group)")
        self.handlers = flat
        self._owns = isinstance(transport, str)
        self.transport: Transport = (
            connect(transport, **transport_options) if isinstance(transport, str) else transport
        )
        self._consumer_options = dict(consumer_options or {})
        self.consumers: list[PushConsumer] = []
        self._stop = threading.Event()

    def start(self) -> Worker:
        if self.consumers:
            return self
        if self._owns:
            self.transport.start()
        for h in self.handlers:
            c = h.consumer(self.transport, **self._consumer_options)
            c.start()
            self.consumers.append(c)
        return self

    def shutdown(self) -> None:
        consumers, self.consumers = self.consumers, []
        for c in consumers:
            c.shutdown()
        if consumers and self._owns:
            self.transport.close()
        self._stop.set()

    def producer(self, **options: Any) -> Producer:
        """A producer over this worker's transport (start it, or use it as a context manager)."""
        return Producer(self.transport, **options)

    def run(self) -> None:
        """Start, then block until SIGINT/SIGTERM; shut down gracefully."""

        def stop(signum: int, frame: object) -> None:
            log.info("signal %d: shutting down", signum)
            self._stop.set()

        previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.start()
            self._stop.wait()
        finally:
            self.shutdown()
            for s, h in previous.items():
                signal.signal(s, h)

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
