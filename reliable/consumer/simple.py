"""SimpleConsumer: the application pulls messages with an invisible time and acks each."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from reliable import tracing
from reliable._acks import AckBatcher, change_invisible_async
from reliable.consumer.push import new_client_id
from reliable.consumer.receive_engine import ReportsGroupFifo
from reliable.errors import ClientStateError, ConfigurationError
from reliable.message import ReceivedMessage
from reliable.naming import check_group, check_topic
from reliable.transport import Transport, connect
from reliable.transport.base import parse_tags


class SimpleConsumer:
    """`receive` hides messages for `invisible_duration_s`; `ack` finishes one;
    `change_invisible_duration` extends (or shortens) the lease and replaces the receipt
    handle; an unacked message comes back with `delivery_attempt + 1`."""

    def __init__(
        self,
        group: str,
        subscriptions: Mapping[str, str | None],
        *,
        transport: Transport | str = "embedded",
        await_duration_s: float = 0.0,
        invisible_duration_s: float = 30.0,
        fifo: bool = False,
        **transport_options: Any,
    ) -> None:
        check_group(group)
        if not subscriptions:
            raise ConfigurationError("a consumer needs at least one subscription")
        for topic in subscriptions:
            check_topic(topic, allow_system=True)
        if await_duration_s < 0 or invisible_duration_s <= 0:
            raise ConfigurationError("durations must be positive")
        self._owns_transport = isinstance(transport, str)
        self._transport: Transport = (
            connect(transport, **transport_options) if isinstance(transport, str) else transport
        )
        self.group = group
        self.client_id = new_client_id()
        self.subscriptions = {t: parse_tags(e) for t, e in subscriptions.items()}
        self.await_duration_s = await_duration_s
        self.invisible_duration_s = invisible_duration_s
        self.fifo = fifo
        self._topics = itertools.cycle(list(self.subscriptions))
        self._started = False
        self._acks: AckBatcher | None = None
        self._acks_lock = threading.Lock()

    def start(self) -> SimpleConsumer:
        if not self._started:
            if self._owns_transport:
                self._transport.start()
            self._transport.heartbeat(self.client_id, self.group, self.subscriptions)
            if (
                self.fifo
                and isinstance(self._transport, ReportsGroupFifo)
                and self._transport.group_is_fifo(self.group) is False
            ):
                self._transport.unregister(self.client_id, self.group)
                if self._owns_transport:
                    self._transport.close()
                raise ConfigurationError(
                    f"fifo consumer of {self.group!r}: the server's group is not FIFO, so it "
                    "would deliver each message group out of order; make the group FIFO "
                    f"(mqadmin updateSubGroup -g {self.group} -o true; reliable admin group "
                    f"create {self.group} --fifo) or receive with fifo=False"
                )
            self._started = True
        return self

    def shutdown(self) -> None:
        if self._started:
            self._started = False
            if self._acks is not None:
                self._acks.close()
                self._acks = None
            self._transport.unregister(self.client_id, self.group)
            if self._owns_transport:
                self._transport.close()

    def __enter__(self) -> SimpleConsumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def receive(
        self, max_messages: int = 16, invisible_duration_s: float | None = None
    ) -> list[ReceivedMessage]:
        """Up to `max_messages` from the next subscribed topic (round-robin), waiting up to
        `await_duration_s` for one to arrive."""
        self._check()
        if max_messages < 1:
            raise ConfigurationError("max_messages must be >= 1")
        invisible = invisible_duration_s or self.invisible_duration_s
        if invisible <= 0:
            raise ConfigurationError("invisible_duration_s must be positive")
        for _ in range(len(self.subscriptions)):
            topic = next(self._topics)
            started_ns = time.time_ns()
            msgs = self._transport.receive(
                self.group,
                topic,
                max_messages,
                int(invisible * 1000),
                self.subscriptions[topic],
                long_poll_ms=int(self.await_duration_s * 1000),
                fifo=self.fifo,
            )
            if msgs:
                for m in msgs:
                    m.consumer_group = self.group
                if tracing.enabled():
                    tracing.received(topic, self.group, [m.message_id for m in msgs], started_ns)
                return msgs
        return []

    def ack(self, message: ReceivedMessage) -> None:
        self._check()
        self._transport.ack(self.group, message)

    def ack_async(self, message: ReceivedMessage) -> Future[None]:
        """Ack without waiting: acks made close together leave as one request (a short
        linger; one AckMessage with repeated entries over gRPC). The future fails with the
        error of this message's own entry (e.g. `ReceiptHandleError`) while the others of
        the batch succeed. `shutdown` sends what waits first."""
        self._check()
        with self._acks_lock:
            if self._acks is None:
                self._acks = AckBatcher(self._transport, self.group)
            acks = self._acks
        return acks.ack(message)

    def ack_many(self, messages: Sequence[ReceivedMessage]) -> list[BaseException | None]:
        """Ack `messages` in as few requests as the transport allows and wait: per message
        None or its own error (the others are acked)."""
        self._check()
        futures = [self.ack_async(m) for m in messages]
        acks = self._acks
        if acks is not None:
            acks.flush()  # in process: now, not after the linger
        return [f.exception() for f in futures]

    def change_invisible_duration(self, message: ReceivedMessage, seconds: float) -> str:
        """Hide the message for `seconds` from now; returns (and stores) the new handle."""
        self._check()
        if seconds < 0:
            raise ConfigurationError("seconds must be >= 0")
        return self._transport.change_invisible_duration(self.group, message, int(seconds * 1000))

    def change_invisible_duration_async(
        self, message: ReceivedMessage, seconds: float
    ) -> Future[str]:
        """`change_invisible_duration` without waiting (many in flight): the future gets
        the new handle (also stored on `message`) or this message's error."""
        self._check()
        if seconds < 0:
            raise ConfigurationError("seconds must be >= 0")
        return change_invisible_async(self._transport, self.group, message, int(seconds * 1000))

    def _check(self) -> None:
        if not self._started:
            raise ClientStateError("the consumer is not started")
