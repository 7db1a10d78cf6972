"""The grpc transport's protocol conversions: the protocol's enums by name, a status or a
failed call as the client's typed error, times, endpoints, and a delivered message as the
consumer's `ReceivedMessage`.

Pure functions over the protocol's generated types; every other `_grpc_*` module uses them
and this one imports none of those.
"""

from __future__ import annotations

import functools
import gzip
import socket
import zlib

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from protocol import codes
from reliable.errors import (
    BrokerBusy,
    BrokerCallError,
    ConfigurationError,
    FailureKind,
    ReceiptHandleError,
    ReliableError,
    TransportError,
    call_error,
)
from reliable.message import ReceivedMessage
from reliable.transport._pb import definition_pb2, service_pb2

MIN_LONG_POLL_MS = 5_000  # the proxy never polls for less, whatever the request says
VERSION = "reliable-0.1"

# the protocol's enums, by their generated names
_pb = definition_pb2
PRODUCER, SIMPLE_CONSUMER = (
    _pb.ClientType.Value("PRODUCER"),
    _pb.ClientType.Value("SIMPLE_CONSUMER"),
)
NORMAL, FIFO, DELAY, TRANSACTION = (
    _pb.MessageType.Value(n) for n in ("NORMAL", "FIFO", "DELAY", "TRANSACTION")
)
READ, WRITE, READ_WRITE = (_pb.Permission.Value(n) for n in ("READ", "WRITE", "READ_WRITE"))
RESOLUTION_UNSPECIFIED, COMMIT, ROLLBACK = (
    _pb.TransactionResolution.Value(n)
    for n in ("TRANSACTION_RESOLUTION_UNSPECIFIED", "COMMIT", "ROLLBACK")
)
SOURCE_CLIENT, SOURCE_SERVER_CHECK = (
    _pb.TransactionSource.Value(n) for n in ("SOURCE_CLIENT", "SOURCE_SERVER_CHECK")
)
TAG = _pb.FilterType.Value("TAG")
IDENTITY, GZIP = _pb.Encoding.Value("IDENTITY"), _pb.Encoding.Value("GZIP")
OFFSET_BEGINNING, OFFSET_END, OFFSET_TIMESTAMP = (
    _pb.QueryOffsetPolicy.Value(n) for n in ("BEGINNING", "END", "TIMESTAMP")
)
IPV4, DOMAIN_NAME = _pb.AddressScheme.Value("IPv4"), _pb.AddressScheme.Value("DOMAIN_NAME")
PYTHON = _pb.Language.Value("PYTHON")


SUCCESS_CODES = frozenset(int(c) for c in codes.SUCCESS_CODES)  # what `check_status` passes
_RECEIPT = int(codes.Code.INVALID_RECEIPT_HANDLE)
_NO_STATUS = int(codes.Code.CODE_UNSPECIFIED)


def _code_name(code: int) -> str:
    try:
        return str(definition_pb2.Code.Name(definition_pb2.Code.ValueType(code)))
    except ValueError:
        return str(code)


def check_status(status: definition_pb2.Status, what: str) -> None:
    """Raise the client's typed error for a non-success protocol status: of the kind
    `protocol.codes.failure_kind` gives the code (the one table the embedded transport
    classifies the broker's exceptions by too)."""
    code = int(status.code)
    if code in SUCCESS_CODES:
        return
    name, message = _code_name(code), f"{what}: {status.message}"
    if code == _NO_STATUS:
        message = f"{what}: response without status"
        raise BrokerCallError(codes.failure_kind(code), message)
    if code == _RECEIPT:
        raise ReceiptHandleError("", message)
    raise call_error(codes.failure_kind(code), message, code=name)


def call_failure(method: str, where: str, exc: grpc.RpcError) -> BrokerCallError:
    """The client's error for a call gRPC itself failed: `RESOURCE_EXHAUSTED` (the server's
    limit on calls or streams) is flow control, retried after a back-off like the protocol's
    `TOO_MANY_REQUESTS`; any other code is a transport failure."""
    code = exc.code()
    message = f"{method} to {where}: {code.name}: {exc.details()}"
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return BrokerBusy(message, code=code.name)
    return TransportError(message)


def miscounted(
    response: service_pb2.SendMessageResponse | service_pb2.AckMessageResponse,
    method: str,
    expected: int,
) -> ReliableError:
    """The error of a whole request whose answer has not one entry per item: the status's
    own error when it reports one, else a broker fault worth trying elsewhere."""
    try:
        check_status(response.status, method)
    except ReliableError as exc:
        return exc
    return BrokerCallError(
        FailureKind.TRY_ELSEWHERE,
        f"{method} answered {len(response.entries)} entries for {expected} items",
    )


def ms_of(ts: Timestamp | Duration) -> int:
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000


def set_ms(ts: Timestamp | Duration, ms: int) -> None:
    ts.seconds, ts.nanos = ms // 1000, (ms % 1000) * 1_000_000


@functools.cache  # the born host of every message: resolved once, not per message
def local_ip() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def parse_endpoint(endpoint: str) -> definition_pb2.Endpoints:
    """'host:port', or several IPv4 'host:port' separated by ';' (as the official client
    takes them): the protocol's Endpoints."""
    out = definition_pb2.Endpoints()
    parts = [p.strip() for p in endpoint.split(";") if p.strip()]
    if not parts:
        raise ConfigurationError(f"endpoint {endpoint!r} must be host:port")
    for part in parts:
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigurationError(f"endpoint {part!r} must be host:port")
        try:
            socket.inet_aton(host)
            out.scheme = IPV4
        except OSError:
            if len(parts) > 1:
                raise ConfigurationError(
                    f"endpoint {endpoint!r}: several addresses must be IPv4 literals"
                ) from None
            out.scheme = DOMAIN_NAME
        address = out.addresses.add()
        address.host, address.port = host, int(port)
    return out


def channel_target(endpoints: definition_pb2.Endpoints) -> str:
    """The gRPC target that dials `endpoints`: 'host:port', or 'ipv4:h:p,h:p' for several
    addresses (gRPC's pick-first then takes the first that answers)."""
    addresses = [f"{a.host}:{a.port}" for a in endpoints.addresses]
    if len(addresses) == 1:
        return addresses[0]
    return "ipv4:" + ",".join(addresses)


def to_received(pm: definition_pb2.Message, group: str | None) -> ReceivedMessage:
    """The consumer's view of a delivered protocol message (called per message: each
    field is read once, and empty repeated fields and maps are not copied)."""
    sp = pm.system_properties
    body = pm.body
    if sp.body_encoding == GZIP:
        body = gzip.decompress(body) if body[:2] == b"\x1f\x8b" else zlib.decompress(body)
    attempt = sp.delivery_attempt if sp.HasField("delivery_attempt") else 1
    keys = sp.keys
    user = pm.user_properties
    born, stored = sp.born_timestamp, sp.store_timestamp
    return ReceivedMessage(
        message_id=sp.message_id,
        topic=pm.topic.name,
        body=body,
        queue_id=sp.queue_id,
        queue_offset=sp.queue_offset,
        tags=sp.tag or None,
        keys=list(keys) if keys else [],
        properties=dict(user) if user else {},
        reconsume_times=attempt - 1 if attempt > 1 else 0,
        born_timestamp=born.seconds * 1000 + born.nanos // 1_000_000,
        store_timestamp=stored.seconds * 1000 + stored.nanos // 1_000_000,
        message_group=sp.message_group or None,
        consumer_group=group,
        receipt_handle=sp.receipt_handle or None,
        deliver_at_ms=ms_of(sp.delivery_timestamp) if sp.HasField("delivery_timestamp") else None,
    )
