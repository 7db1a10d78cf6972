"""Who is connected: one session per `x-mq-client-id`.

A client's Telemetry stream, its Settings, its heartbeats and its other calls all carry the
same client id; the session ties them together. It holds the outbound telemetry queue (for
orphaned-transaction checks), the last time the client was heard from, and the messages it
received with `auto_renew` (push consumers): the server keeps those invisible while the client
lives, and maps the receipt handle the client keeps to the one the broker currently honours.

With access keys on, a client id belongs to the access key that opened its session: a call
signed with another key that names the same id is `FORBIDDEN` while the session lives (so a
stranger cannot end another client's session, nor release or renew its messages). A session
is forgotten `session_expiry_ms` after its client's last call and stream; the id is free then.

Everything here is touched only from the server's event loop thread.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from broker.server.errors import Forbidden, UnrecognizedClientType
from protocol.pb import definition_pb2, service_pb2


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
        """The kind for a protocol number; `UnrecognizedClientType` for a number it lacks."""
        try:
            return cls(number)
        except ValueError:
            raise UnrecognizedClientType(f"client type {number} is unknown") from None

    @property
    def consumer(self) -> bool:
        return self in (
            ClientKind.PUSH_CONSUMER,
            ClientKind.SIMPLE_CONSUMER,
            ClientKind.PULL_CONSUMER,
            ClientKind.LITE_PUSH_CONSUMER,
            ClientKind.LITE_SIMPLE_CONSUMER,
        )


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


class TelemetryStream:
    """One open Telemetry stream's outbound queue, bounded by `limit` commands.

    The stream's writer takes commands off the queue and waits for gRPC to send each; a
    client that sends but never reads stops the writer, and an unbounded queue would keep
    every reply. Past `limit` the stream is cut off instead: the server answers the call
    with a final status and `cut_off` cancels the call's task, so nothing of the stream
    stays on our side but what gRPC's flow-control window holds.
    """

    def __init__(self, limit: int, task: asyncio.Task[Any] | None) -> None:
        # the commands to write, then None: the writer finishes
        self.queue: asyncio.Queue[service_pb2.TelemetryCommand | None] = asyncio.Queue(
            maxsize=limit
        )
        self.task = task
        self.cut = False
        self.closed = False  # the session's bookkeeping for this stream is done

    def push(self, command: service_pb2.TelemetryCommand) -> bool:
        """Queue `command`; False when the queue is full or the stream was cut off."""
        if self.cut:
            return False
        try:
            self.queue.put_nowait(command)
        except asyncio.QueueFull:
            return False
        return True

    def cut_off(self) -> None:
        if not self.cut:
            self.cut = True
            if self.task is not None and not self.task.done():
                self.task.cancel()

    def end(self) -> None:
        """Ask the writer to finish after what is queued (server shutdown)."""
        try:
            self.queue.put_nowait(None)
        except asyncio.QueueFull:  # not read for a while: no point waiting for it
            self.cut_off()


@dataclass(eq=False)
class ClientSession:
    client_id: str
    last_seen_ms: int
    owner: str = ""  # the access key that opened the session ("" with authentication off)
    kind: ClientKind = ClientKind.UNSPECIFIED
    group: str | None = None
    settings: definition_pb2.Settings | None = None  # the client's own, as last received
    publishing: frozenset[str] = frozenset()
    subscriptions: dict[str, frozenset[str] | None] = field(default_factory=dict)
    # every open Telemetry stream, oldest first: one client identity may hold several to
    # one server (its access point's and its group master's, when they are the same server)
    open_streams: list[TelemetryStream] = field(default_factory=list)
    disconnected_ms: int = 0  # when the last telemetry stream closed
    renewals: dict[str, Renewal] = field(default_factory=dict)

    @property
    def stream(self) -> TelemetryStream | None:
        """The latest stream still open: commands go there, so a client whose newer
        stream ended keeps being reached on its older one."""
        return self.open_streams[-1] if self.open_streams else None

    @property
    def connected(self) -> bool:
        return bool(self.open_streams)

    def stream_opened(self, stream: TelemetryStream) -> None:
        self.open_streams.append(stream)

    def stream_closed(self, stream: TelemetryStream) -> None:
        if stream in self.open_streams:
            self.open_streams.remove(stream)

    def end_streams(self) -> None:
        """Ask every open telemetry stream to finish (server shutdown)."""
        for stream in list(self.open_streams):
            stream.end()

    def push(self, command: service_pb2.TelemetryCommand) -> bool:
        """Queue a command on the client's telemetry stream; False when it has none or the
        client is not reading it (its queue is full)."""
        return self.stream is not None and self.stream.push(command)


def _not_yours(client_id: str) -> Forbidden:
    return Forbidden(f"client id {client_id[:64]!r} belongs to another access key")


class SessionRegistry:
    """All sessions, by client id."""

    def __init__(self) -> None:
        self._sessions: dict[str, ClientSession] = {}

    def touch(self, client_id: str, now_ms: int, owner: str = "") -> ClientSession:
        session = self._sessions.get(client_id)
        if session is None:
            session = ClientSession(client_id=client_id, last_seen_ms=now_ms, owner=owner)
            self._sessions[client_id] = session
        else:
            if session.owner != owner:
                raise _not_yours(client_id)
            session.last_seen_ms = now_ms
        return session

    def check_owner(self, client_id: str, access_key: str) -> None:
        """`Forbidden` when a live session of `client_id` belongs to another access key."""
        session = self._sessions.get(client_id)
        if session is not None and session.owner != access_key:
            raise _not_yours(client_id)

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
        found = [
            s
            for s in self._sessions.values()
            if s.kind is ClientKind.PRODUCER and s.stream is not None and topic in s.publishing
        ]
        return sorted(found, key=lambda s: -s.last_seen_ms)

    def expired(self, now_ms: int, expiry_ms: int) -> list[ClientSession]:
        return [
            s
            for s in self._sessions.values()
            if not s.connected and now_ms - s.last_seen_ms > expiry_ms
        ]
