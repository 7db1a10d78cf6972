"""Deliver one stored message to one client and wait for its verdict (RocketMQ's
CONSUME_MESSAGE_DIRECTLY, the dashboard's "resend to this client").

In the RocketMQ 5 gRPC protocol the server asks a client on that client's own Telemetry
stream: `TelemetryCommand{verify_message_command{nonce, message}}`. A push consumer runs
its listener on the message (no ack, no offset moves: the message is not leased, the
delivery is outside the group's bookkeeping) and answers on the same stream with
`TelemetryCommand{status, verify_message_result{nonce}}`: `OK` when its listener succeeded,
`FAILED_TO_CONSUME_MESSAGE` (or any other code, with a message) when it did not. A client
that cannot consume (a producer, a simple consumer) answers `NOT_IMPLEMENTED`; some clients
never answer at all (the official Python client ignores the command).

`DirectDeliveries` holds the questions waiting for an answer, by nonce, on the server's
event loop: `deliver` sends one and awaits its answer for at most `timeout_ms`; the
Telemetry reader hands each `verify_message_result` to `answer`. An answer counts only from
the client that was asked; a stream that ends while its client owes answers fails them at
once. The admin service's `ReconsumeMessage` with a `client_id` runs `deliver`.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass
from typing import Any

from broker.server import convert
from broker.server.codes import Code
from broker.server.errors import ServerError
from broker.server.sessions import ClientSession, SessionRegistry, TelemetryStream
from broker.server.status import ok
from broker.store.message import MessageExt
from protocol.pb import definition_pb2, service_pb2
from protocol.props import Prop

DEFAULT_TIMEOUT_MS = 5_000
MAX_TIMEOUT_MS = 60_000
MAX_ANSWER_TEXT = 512  # of a client's status message, kept in the answer


class ClientNotInGroup(ServerError):
    """The client named is not a live client of the group (unknown, gone, or another
    group's); `details["live_clients"]` lists the group's live clients."""

    status_code = Code.NOT_FOUND

    def __init__(self, message: str, live_clients: list[str]) -> None:
        super().__init__(message)
        self.details = {"live_clients": live_clients}


class ClientDidNotAnswer(ServerError):
    """The client was asked but gave no answer in time (or its stream ended first)."""

    status_code = Code.PROXY_TIMEOUT


@dataclass(eq=False)
class _Question:
    client_id: str
    stream: TelemetryStream
    answer: asyncio.Future[tuple[int, str]]


def _code_name(code: int) -> str:
    try:
        return str(definition_pb2.Code.Name(definition_pb2.Code.ValueType(code)))
    except ValueError:
        return str(code)


def live_clients(sessions: SessionRegistry, group: str) -> list[str]:
    """Client ids of `group`'s consumers with an open Telemetry stream, sorted."""
    return sorted(
        s.client_id
        for s in sessions
        if s.group == group and s.kind.consumer and s.stream is not None and not s.stream.cut
    )


def origin_topic(ext: MessageExt) -> str:
    """The topic a consumer sees the message under: a retry or dead-letter copy's original
    topic, else its own."""
    props = ext.properties
    return props.get(Prop.RETRY_TOPIC) or props.get(Prop.DLQ_ORIGIN_TOPIC) or ext.topic


class DirectDeliveries:
    """The direct deliveries waiting for their client's answer (event loop only)."""

    def __init__(self, sessions: SessionRegistry) -> None:
        self._sessions = sessions
        self._waiting: dict[str, _Question] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def client(self, group: str, client_id: str) -> ClientSession:
        """The session of `client_id` when it is a live consumer of `group`; else
        `ClientNotInGroup` naming the group's live clients."""
        session = self._sessions.get(client_id)
        live = live_clients(self._sessions, group)
        listed = ", ".join(live[:20]) + (f" and {len(live) - 20} more" if len(live) > 20 else "")
        known = f"its live clients: {listed}" if live else "it has no live client"
        if session is None or session.stream is None or session.stream.cut:
            raise ClientNotInGroup(
                f"client {client_id[:128]!r} is not connected to this broker; group "
                f"{group!r}: {known}",
                live,
            )
        if session.group != group or not session.kind.consumer:
            what = (
                f"a consumer of group {session.group!r}"
                if session.kind.consumer and session.group
                else f"a {session.kind.name.lower()} client"
            )
            raise ClientNotInGroup(
                f"client {client_id[:128]!r} is {what}, not a consumer of group {group!r}; {known}",
                live,
            )
        return session

    async def deliver(
        self, session: ClientSession, ext: MessageExt, timeout_ms: int
    ) -> dict[str, Any]:
        """Send `ext` to `session`'s client and await its answer: `{consumed, status,
        message, elapsed_ms}`; `ClientDidNotAnswer` when none comes within `timeout_ms`."""
        stream = session.stream
        if stream is None:  # closed since `client` looked
            raise ClientDidNotAnswer(f"client {session.client_id!r} disconnected")
        nonce = secrets.token_hex(16)
        command = service_pb2.TelemetryCommand()
        command.status.CopyFrom(ok())
        verify = command.verify_message_command
        verify.nonce = nonce
        verify.message.CopyFrom(
            convert.to_proto(
                ext,
                topic=origin_topic(ext),
                namespace="",
                receipt_handle=None,
                delivery_attempt=ext.reconsume_times + 1,
            )
        )
        answer: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()
        self._waiting[nonce] = _Question(session.client_id, stream, answer)
        started = time.monotonic()
        try:
            if not stream.push(command):
                raise ClientDidNotAnswer(
                    f"client {session.client_id!r} is not reading its telemetry stream: "
                    "the message was not sent"
                )
            try:
                code, text = await asyncio.wait_for(answer, timeout_ms / 1000)
            except TimeoutError:
                raise ClientDidNotAnswer(
                    f"client {session.client_id!r} did not answer within {timeout_ms} ms: "
                    "it may not support direct delivery (only the framework's push "
                    "consumer does; the official RocketMQ Python client ignores "
                    "verify_message_command), or its handler is still running"
                ) from None
        finally:
            self._waiting.pop(nonce, None)
        return {
            "consumed": code == Code.OK,
            "status": _code_name(code),
            "message": text,
            "elapsed_ms": int((time.monotonic() - started) * 1000),
        }

    def answer(self, client_id: str, nonce: str, status: definition_pb2.Status) -> bool:
        """A client's answer to `nonce`; False (ignored) when nothing waits for it from
        that client."""
        question = self._waiting.get(nonce)
        if question is None or question.client_id != client_id or question.answer.done():
            return False
        question.answer.set_result((int(status.code), str(status.message)[:MAX_ANSWER_TEXT]))
        return True

    def stream_closed(self, stream: TelemetryStream) -> None:
        """Fail at once the questions asked on a stream that ended."""
        for question in list(self._waiting.values()):
            if question.stream is stream and not question.answer.done():
                question.answer.set_exception(
                    ClientDidNotAnswer(
                        f"client {question.client_id!r} disconnected before it answered"
                    )
                )
