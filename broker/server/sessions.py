"""Who is connected: one session per `x-mq-client-id`.

A client's Telemetry stream, its Settings, its heartbeats and its other calls all carry the
same client id; the session ties them together. It holds the outbound telemetry queue (for
orphaned-transaction checks), the last time the client was heard from, and the messages it
received with `auto_renew` (push consumers): the server keeps those invisible while the client
lives, and maps the receipt handle the client keeps to the one the broker currently honours.

Everything here is touched only from the server's event loop thread.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


class ClientKind(enum.Enum):
    """The protocol's ClientType, by number."""

    UNSPECIFIED = 0
    PRODUCER = 1
    PUSH_CONSUMER = 2
    SIMPLE_CONSUMER = 3
    PULL_CONSUMER = 4
    LITE_PUSH_CONSUMER = 5
    LITE_SIMPLE_CONSUMER = 6

    @classmethod
    def of(cls, number: int) -> ClientKind:
        try:
            return cls(number)
        except ValueError:
            return cls.UNSPECIFIED

    @property
    def consumer(self) -> bool:
        return self in (ClientKind.PUSH_CONSUMER, ClientKind.SIMPLE_CONSUMER,
                        ClientKind.PULL_CONSUMER, ClientKind.LITE_PUSH_CONSUMER,
                        ClientKind.LITE_SIMPLE_CONSUMER)


@dataclass(eq=False)
class Renewal:
    """One auto-renewed in-flight message: the handle the client holds -> the live one."""

    group: str
    topic: str
    original: str
    current: str
    expires_ms: int
    first_ms: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(eq=False)
class ClientSession:
    client_id: str
    last_seen_ms: int
    kind: ClientKind = ClientKind.UNSPECIFIED
    group: str | None = None
    settings: Any = None  # the client's own Settings, as last received
    publishing: frozenset[str] = frozenset()
    subscriptions: dict[str, frozenset[str] | None] = field(default_factory=dict)
    outbox: asyncio.Queue[Any] | None = None  # set while a Telemetry stream is open
    streams: int = 0
    disconnected_ms: int = 0  # when the last telemetry stream closed
    renewals: dict[str, Renewal] = field(default_factory=dict)

    @property
    def connected(self) -> bool:
        return self.streams > 0

    def end_stream(self) -> None:
        """Ask the open telemetry stream, if any, to finish (server shutdown)."""
        if self.outbox is not None:
            self.outbox.put_nowait(None)

    def push(self, command: Any) -> bool:
        """Queue a command on the client's telemetry stream; False when it has none."""
        if self.outbox is None:
            return False
        self.outbox.put_nowait(command)
        return True


class SessionRegistry:
    """All sessions, by client id."""

    def __init__(self) -> None:
        self._sessions: dict[str, ClientSession] = {}

    def touch(self, client_id: str, now_ms: int) -> ClientSession:
        session = self._sessions.get(client_id)
        if session is None:
            session = ClientSession(client_id=client_id, last_seen_ms=now_ms)
            self._sessions[client_id] = session
        else:
            session.last_seen_ms = now_ms
        return session

    def get(self, client_id: str) -> ClientSession | None:
        return self._sessions.get(client_id)

    def remove(self, client_id: str) -> ClientSession | None:
        return self._sessions.pop(client_id, None)

    def __iter__(self) -> Iterator[ClientSession]:
        return iter(list(self._sessions.values()))

    def __len__(self) -> int:
        return len(self._sessions)

    def publishers_of(self, topic: str) -> list[ClientSession]:
        """Producers with an open stream that declared `topic`, most recently seen first."""
        found = [s for s in self._sessions.values()
                 if s.kind is ClientKind.PRODUCER and s.outbox is not None
                 and topic in s.publishing]
        return sorted(found, key=lambda s: -s.last_seen_ms)

    def expired(self, now_ms: int, expiry_ms: int) -> list[ClientSession]:
        return [s for s in self._sessions.values()
                if not s.connected and now_ms - s.last_seen_ms > expiry_ms]
