"""The grpc transport's Telemetry streams: the protocol's one bidirectional call per client
identity, on which the client sends its Settings and the server sends its own Settings,
orphaned-transaction checks and direct deliveries.

- `TelemetryStream`: one stream to one server; it reconnects until closed.
- `IdentityStreams`: one client identity's streams, to the access point and to each broker
  group's master a route names (what the official clients keep).
- `Telemetry`: the transport's collaborator that opens an identity's streams, opens one more
  for every identity when a route names a new group master, and ends an identity.

The producer side opens an identity for its transaction checks, the consumer side one per
consumer group; neither keeps a stream of its own.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Protocol

import grpc

from reliable.transport._grpc_convert import SUCCESS_CODES
from reliable.transport._grpc_session import GrpcSession, Metadata, Stub
from reliable.transport._pb import definition_pb2, service_pb2

log = logging.getLogger("reliable.transport.grpc")

# a direct delivery's verdict: (protocol code, message)
Verdict = tuple[int, str]
OK = int(definition_pb2.Code.Value("OK"))
NOT_IMPLEMENTED = int(definition_pb2.Code.Value("NOT_IMPLEMENTED"))
FAILED_TO_CONSUME = int(definition_pb2.Code.Value("FAILED_TO_CONSUME_MESSAGE"))

Settings = Callable[[], definition_pb2.Settings]
Check = service_pb2.RecoverOrphanedTransactionCommand
OnCheck = Callable[[Check, str | None], None]  # a check and the target that sent it
OnVerify = Callable[[definition_pb2.Message], Verdict]


class TelemetryHost(Protocol):
    """What a Telemetry stream needs of one server's channel: the stub and the metadata."""

    @property
    def stub(self) -> Stub: ...

    def metadata(self, client_id: str) -> Metadata: ...


class TelemetryStream:
    """One Telemetry stream for one client identity; reconnects until closed.

    A `verify_message_command` (the server's direct delivery of one message) is answered on
    the stream with `verify_message_result{nonce}` and the status `on_verify` returns for
    the message (run on its own thread, so the stream keeps being read meanwhile); without
    `on_verify` the answer is NOT_IMPLEMENTED: this identity has no listener to run.
    """

    def __init__(
        self,
        host: TelemetryHost,
        client_id: str,
        settings: Settings,
        on_command: Callable[[Check], None],
        on_verify: OnVerify | None = None,
    ) -> None:
        self._host = host
        self.client_id = client_id
        self._settings = settings
        self._on_command = on_command
        self._on_verify = on_verify
        self._queue: queue.Queue[service_pb2.TelemetryCommand | None] = queue.Queue()
        # Settings are made and queued under this lock, so they leave in the order they
        # were made: a Settings made before a change (a topic noted) and queued after the
        # one made for that change would be the server's last word, and the change lost
        self._settings_lock = threading.Lock()
        self._closed = threading.Event()
        self.ready = threading.Event()
        self.reply: definition_pb2.Settings | None = None
        self._call: grpc.Call | None = None  # the stream now open (cancelled on close)
        self._thread = threading.Thread(
            target=self._run, name=f"telemetry-{client_id}", daemon=True
        )
        self._thread.start()

    def resend_settings(self) -> None:
        """Send the client's Settings as they are now (after a topic or subscription
        changed); a stream that is (re)connecting sends them as part of its opening."""
        with self._settings_lock:
            self._queue.put(self._settings_command())

    def _settings_command(self) -> service_pb2.TelemetryCommand:
        command = service_pb2.TelemetryCommand()
        command.settings.CopyFrom(self._settings())
        return command

    def _requests(self) -> Iterator[service_pb2.TelemetryCommand]:
        while not self._closed.is_set():
            item = self._queue.get()
            if item is None:
                return
            yield item

    def _run(self) -> None:
        backoff = 0.5
        while not self._closed.is_set():
            with self._settings_lock:  # a new queue opening with the Settings of now
                self._queue = queue.Queue()
                self._queue.put(self._settings_command())
            try:
                call = self._host.stub.Telemetry(
                    self._requests(), metadata=self._host.metadata(self.client_id)
                )
                self._call = call
                for reply in call:
                    backoff = 0.5
                    self._on_reply(reply)
            except grpc.RpcError as exc:
                if self._closed.is_set():
                    return
                log.info("telemetry stream %s broke (%s); reconnecting", self.client_id, exc.code())
            if self._closed.wait(backoff):
                return
            backoff = min(backoff * 2, 30.0)

    def _on_reply(self, reply: service_pb2.TelemetryCommand) -> None:
        kind = reply.WhichOneof("command")
        if kind == "settings" and int(reply.status.code) in SUCCESS_CODES:
            self.reply = reply.settings
            self.ready.set()
        elif kind == "recover_orphaned_transaction_command":
            self._on_command(reply.recover_orphaned_transaction_command)
        elif kind == "verify_message_command":
            threading.Thread(
                target=self._verify,
                args=(reply.verify_message_command,),
                name=f"verify-{self.client_id}",
                daemon=True,
            ).start()

    def _verify(self, command: service_pb2.VerifyMessageCommand) -> None:
        """Run the direct delivery `command` asks for and send the verdict back."""
        if self._on_verify is None:
            code, text = (
                NOT_IMPLEMENTED,
                f"client {self.client_id} has no message listener: only a push consumer "
                "can consume a message directly",
            )
        else:
            try:
                code, text = self._on_verify(command.message)
            except Exception as exc:  # a malformed message, a conversion error
                code, text = FAILED_TO_CONSUME, f"{type(exc).__name__}: {exc}"
        answer = service_pb2.TelemetryCommand()
        answer.status.code = definition_pb2.Code.ValueType(code)
        answer.status.message = text
        answer.verify_message_result.nonce = command.nonce
        if not self._closed.is_set():
            self._queue.put(answer)

    def close(self) -> None:
        self._closed.set()
        self._queue.put(None)
        if self._call is not None:
            self._call.cancel()
        self._thread.join(5)


class _Host:
    """A Telemetry stream's view of one server's channel."""

    def __init__(self, stub: Stub, metadata: Callable[[str], Metadata]) -> None:
        self.stub = stub
        self.metadata = metadata


class IdentityStreams:
    """One client identity's Telemetry streams: to the access point's server and to each
    broker group's master (target -> stream). Its Settings go to every one of them."""

    def __init__(
        self,
        session: GrpcSession,
        client_id: str,
        settings: Settings,
        on_check: OnCheck | None = None,
        on_verify: OnVerify | None = None,
    ) -> None:
        self._session = session
        self.client_id = client_id
        self._settings = settings
        self._on_check = on_check
        self._on_verify = on_verify
        self.access_point = self._open(None)
        self.masters: dict[str, TelemetryStream] = {}

    def _open(self, target: str | None) -> TelemetryStream:
        on_check = self._on_check
        stub, _ = self._session.stub_at(target)
        return TelemetryStream(
            _Host(stub, self._session.metadata),
            self.client_id,
            self._settings,
            (lambda command: on_check(command, target)) if on_check else lambda _c: None,
            self._on_verify,
        )

    def reach(self, target: str) -> None:
        """Open a stream to a group master's `target` unless there is one (lock held)."""
        if target not in self.masters:
            self.masters[target] = self._open(target)

    @property
    def reply(self) -> definition_pb2.Settings | None:
        """The access point's server's Settings for this identity (None before its reply)."""
        return self.access_point.reply

    def wait_ready(self, timeout_s: float) -> None:
        self.access_point.ready.wait(timeout_s)

    def resend_settings(self) -> None:
        for stream in (self.access_point, *self.masters.values()):
            stream.resend_settings()

    def close(self) -> None:
        for stream in (self.access_point, *self.masters.values()):
            stream.close()


class Telemetry:
    """The transport's client identities' Telemetry streams (docs: the module's)."""

    def __init__(self, session: GrpcSession) -> None:
        self._session = session
        self._open: dict[str, IdentityStreams] = {}  # client id -> its streams
        session.on_target_learned(self._target_learned)

    def open(
        self,
        client_id: str,
        settings: Settings,
        on_check: OnCheck | None = None,
        on_verify: OnVerify | None = None,
    ) -> IdentityStreams:
        """Open the identity's streams: to the access point and to every group master the
        routes named so far (the transport must be started)."""
        with self._session.lock:
            self._session.require()
            streams = IdentityStreams(self._session, client_id, settings, on_check, on_verify)
            for target in self._session.group_targets():
                streams.reach(target)
            self._open[client_id] = streams
            return streams

    def _target_learned(self, target: str) -> None:
        with self._session.lock:
            for streams in self._open.values():
                streams.reach(target)

    def end(self, streams: IdentityStreams, group: str | None) -> None:
        """Tell each server with one of the identity's streams that it is gone, then close
        them."""
        with self._session.lock:
            self._open.pop(streams.client_id, None)
        self._session.notify_termination(streams.client_id, group, list(streams.masters))
        streams.close()
