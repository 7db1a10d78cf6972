"""Wire helpers of the grpc transport: status checks, conversions, the Telemetry stream.

Everything here speaks the protocol's generated types; `reliable.transport.grpc` builds the
transport on top.
"""

from __future__ import annotations

import functools
import gzip
import logging
import queue
import socket
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import grpc

from reliable.errors import (
    BadRequest,
    BrokerBusy,
    BrokerCallError,
    ConfigurationError,
    FailureKind,
    ReceiptHandleError,
)
from reliable.message import ReceivedMessage
from reliable.transport._pb import definition_pb2, service_pb2

if TYPE_CHECKING:
    from reliable.transport.grpc import GrpcTransport

log = logging.getLogger("reliable.transport.grpc")

DEFAULT_DELAY_LEVELS_MS = (1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000,
                           300_000, 360_000, 420_000, 480_000, 540_000, 600_000, 1_200_000,
                           1_800_000, 3_600_000, 7_200_000)
MIN_LONG_POLL_MS = 5_000  # the proxy never polls for less, whatever the request says
VERSION = "reliable-0.1"

# protocol enum numbers
PRODUCER, SIMPLE_CONSUMER = 1, 3
NORMAL, FIFO, DELAY, TRANSACTION = 1, 2, 3, 4
READ, WRITE, READ_WRITE = 2, 3, 4
COMMIT, ROLLBACK = 1, 2
SOURCE_CLIENT, SOURCE_SERVER_CHECK = 1, 2
TAG = 1
IDENTITY, GZIP = 1, 2
OFFSET_BEGINNING, OFFSET_END, OFFSET_TIMESTAMP = 0, 1, 2  # QueryOffsetPolicy

_SUCCESS = {20000, 30000, 40401}
_BUSY = {42900}
_RECEIPT = {40013}
_NOT_STORED_OK = {50401, 50402, 50002}
_TRY_ELSEWHERE_4XX = {40300, 40400, 40402, 40403, 40800}


def _code_name(code: int) -> str:
    try:
        return str(definition_pb2.Code.Name(code))
    except ValueError:
        return str(code)


def check_status(status: Any, what: str) -> None:
    """Raise the client's typed error for a non-success protocol status."""
    code = int(status.code)
    if code in _SUCCESS:
        return
    name, message = _code_name(code), f"{what}: {status.message}"
    if code == 0:
        raise BrokerCallError(FailureKind.TRY_ELSEWHERE, f"{what}: response without status")
    if code in _BUSY:
        raise BrokerBusy(message, code=name)
    if code in _RECEIPT:
        raise ReceiptHandleError("", message)
    if code in _NOT_STORED_OK:
        raise BrokerCallError(FailureKind.NOT_STORED_OK, message, code=name)
    if code >= 50000 or code in _TRY_ELSEWHERE_4XX:
        raise BrokerCallError(FailureKind.TRY_ELSEWHERE, message, code=name)
    raise BadRequest(message, code=name)


def ms_of(ts: Any) -> int:
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000


def set_ms(ts: Any, ms: int) -> None:
    ts.seconds, ts.nanos = ms // 1000, (ms % 1000) * 1_000_000


@functools.cache  # the born host of every message: resolved once, not per message
def local_ip() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def parse_endpoint(endpoint: str) -> Any:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigurationError(f"endpoint {endpoint!r} must be host:port")
    out = definition_pb2.Endpoints()
    try:
        socket.inet_aton(host)
        out.scheme = 1
    except OSError:
        out.scheme = 3
    address = out.addresses.add()
    address.host, address.port = host, int(port)
    return out


def to_received(pm: Any, group: str | None) -> ReceivedMessage:
    sp = pm.system_properties
    body = bytes(pm.body)
    if sp.body_encoding == GZIP:
        body = gzip.decompress(body) if body[:2] == b"\x1f\x8b" else zlib.decompress(body)
    attempt = int(sp.delivery_attempt) if sp.HasField("delivery_attempt") else 1
    return ReceivedMessage(
        message_id=sp.message_id, topic=pm.topic.name, body=body, queue_id=int(sp.queue_id),
        queue_offset=int(sp.queue_offset), tags=sp.tag or None, keys=list(sp.keys),
        properties=dict(pm.user_properties), reconsume_times=max(attempt - 1, 0),
        born_timestamp=ms_of(sp.born_timestamp), store_timestamp=ms_of(sp.store_timestamp),
        message_group=sp.message_group or None, consumer_group=group,
        receipt_handle=sp.receipt_handle or None,
        deliver_at_ms=ms_of(sp.delivery_timestamp) if sp.HasField("delivery_timestamp")
        else None)


class Telemetry:
    """One Telemetry stream for one client identity; reconnects until closed."""

    def __init__(self, transport: GrpcTransport, client_id: str,
                 settings: Callable[[], Any], on_command: Callable[[Any], None]) -> None:
        self._t = transport
        self.client_id = client_id
        self._settings = settings
        self._on_command = on_command
        self._queue: queue.Queue[Any] = queue.Queue()
        self._closed = threading.Event()
        self.ready = threading.Event()
        self.reply: Any = None
        self._call: Any = None
        self._thread = threading.Thread(target=self._run, name=f"telemetry-{client_id}",
                                        daemon=True)
        self._thread.start()

    def resend_settings(self) -> None:
        command = service_pb2.TelemetryCommand()
        command.settings.CopyFrom(self._settings())
        self._queue.put(command)

    def _requests(self) -> Iterator[Any]:
        while not self._closed.is_set():
            item = self._queue.get()
            if item is None:
                return
            yield item

    def _run(self) -> None:
        backoff = 0.5
        while not self._closed.is_set():
            self._queue = queue.Queue()
            self.resend_settings()
            try:
                self._call = self._t.stub.Telemetry(self._requests(),
                                                    metadata=self._t.metadata(self.client_id))
                for reply in self._call:
                    backoff = 0.5
                    kind = reply.WhichOneof("command")
                    if kind == "settings" and int(reply.status.code) in _SUCCESS:
                        self.reply = reply.settings
                        self.ready.set()
                    elif kind == "recover_orphaned_transaction_command":
                        self._on_command(reply.recover_orphaned_transaction_command)
            except grpc.RpcError as exc:
                if self._closed.is_set():
                    return
                log.info("telemetry stream %s broke (%s); reconnecting", self.client_id,
                         exc.code())
            if self._closed.wait(backoff):
                return
            backoff = min(backoff * 2, 30.0)

    def close(self) -> None:
        self._closed.set()
        self._queue.put(None)
        if self._call is not None:
            self._call.cancel()
        self._thread.join(5)
