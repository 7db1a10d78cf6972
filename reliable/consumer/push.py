"""PushConsumer: the broker's messages pushed to a listener on a thread pool."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import uuid
from collections.abc import Mapping
from typing import Any

from reliable.consumer.listener import MessageListener, MessageModel
from reliable.consumer.pull_engine import PullEngine
from reliable.consumer.receive_engine import ReceiveEngine
from reliable.consumer.settings import ConsumerSettings
from reliable.errors import ClientStateError, ConfigurationError
from reliable.naming import check_group, check_topic
from reliable.transport import Transport, connect
from reliable.transport.base import QueueRef, can_pull, parse_tags

_SETTINGS = {f.name for f in dataclasses.fields(ConsumerSettings)}
ENGINES = ("auto", "pull", "receive")


def new_client_id() -> str:
    return f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"


class PushConsumer:
    """Consume `subscriptions` ({topic: tag expression}) as `group`, calling `listener`.

    Settings are `ConsumerSettings` fields given as keywords (`orderly=True`,
    `message_model=MessageModel.BROADCASTING`, `consume_threads=8`, ...). Transport options
    (`store_dir=`, `broker=`, `endpoint=`) build a transport when `transport` is a name.
    """

    def __init__(
        self,
        group: str,
        listener: MessageListener,
        subscriptions: Mapping[str, str | None],
        *,
        transport: Transport | str = "embedded",
        engine: str = "auto",
        client_id: str | None = None,
        settings: ConsumerSettings | None = None,
        **options: Any,
    ) -> None:
        check_group(group)
        if not subscriptions:
            raise ConfigurationError("a consumer needs at least one subscription")
        for topic in subscriptions:
            check_topic(topic, allow_system=False)
        if engine not in ENGINES:
            raise ConfigurationError(f"engine must be one of {ENGINES}, got {engine!r}")
        setting_opts = {k: v for k, v in options.items() if k in _SETTINGS}
        transport_opts = {k: v for k, v in options.items() if k not in _SETTINGS}
        if settings is not None and setting_opts:
            raise ConfigurationError("give settings= or setting keywords, not both")
        self.settings = settings or ConsumerSettings(**setting_opts)
        self._owns_transport = isinstance(transport, str)
        if transport_opts and not self._owns_transport:
            raise ConfigurationError(f"unknown consumer options: {sorted(transport_opts)}")
        self._transport: Transport = (
            connect(transport, **transport_opts) if isinstance(transport, str) else transport
        )
        self.group = group
        self.client_id = client_id or new_client_id()
        self.subscriptions = {t: parse_tags(e) for t, e in subscriptions.items()}
        self._listener = listener
        use_pull = engine == "pull" or (engine == "auto" and can_pull(self._transport))
        if use_pull and not can_pull(self._transport):
            raise ConfigurationError(f"the {self._transport.name} transport cannot pull")
        if not use_pull and self.settings.message_model is MessageModel.BROADCASTING:
            if can_pull(self._transport):
                raise ConfigurationError(
                    "broadcasting needs the pull engine (engine='auto' "
                    "or 'pull'), not engine='receive'"
                )
            raise ConfigurationError(
                f"broadcasting needs a transport that can pull (the embedded one); the "
                f"{self._transport.name} transport only receives, so every message goes to "
                f"one consumer of group {group!r}. To give every instance every message, "
                f"give each instance its own consumer group (e.g. {group}-<instance name>, "
                f"with consume_from='last'); see docs/client.md, Broadcasting"
            )
        self._use_pull = use_pull
        self._engine: PullEngine | ReceiveEngine | None = None

    @property
    def transport(self) -> Transport:
        return self._transport

    def start(self) -> PushConsumer:
        if self._engine is not None:
            return self
        if self._owns_transport:
            self._transport.start()
        if self._use_pull:
            self._engine = PullEngine(
                self._transport,  # type: ignore[arg-type]
                self.group,
                self.client_id,
                self.subscriptions,
                self._listener,
                self.settings,
            )
        else:
            self._engine = ReceiveEngine(
                self._transport,
                self.group,
                self.client_id,
                self.subscriptions,
                self._listener,
                self.settings,
            )
        try:
            self._engine.start()
        except BaseException:  # refused at start (e.g. orderly on a group that is not FIFO)
            self._engine = None
            with contextlib.suppress(Exception):
                self._transport.unregister(self.client_id, self.group)
            if self._owns_transport:
                self._transport.close()
            raise
        return self

    def shutdown(self) -> None:
        """Stop pulling, let running handlers finish, commit offsets, leave the group."""
        engine, self._engine = self._engine, None
        if engine is None:
            return
        engine.shutdown()
        if self._owns_transport:
            self._transport.close()

    def rebalance(self) -> None:
        """Recompute this consumer's queues now (it also happens periodically)."""
        if not isinstance(self._engine, PullEngine):
            raise ClientStateError("rebalance needs a started pull-engine consumer")
        self._engine.rebalance()

    @property
    def assigned_queues(self) -> list[QueueRef]:
        if isinstance(self._engine, PullEngine):
            return self._engine.assigned
        return []

    def __enter__(self) -> PushConsumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
