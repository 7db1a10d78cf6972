"""The native wire: the MessagingService's unary calls over one framed TCP connection.

One gRPC unary call costs grpc's Python layer about 0.4-0.6 ms of CPU on each side, which
caps a client sending one message at a time near 1,100-1,500 calls/s whatever the server
does. The framework's own clients can instead send the same protobuf requests over a plain
TCP connection to the server's wire port (`reliable broker start --wire-port P`); the
server dispatches each to the same servicer method a gRPC call reaches, so every check,
status and behaviour is the same. The frame format is described in docs/wire.md:

    header (16 bytes, big-endian): length u32 | request id u32 | method u16 | flags u16 |
                                   timeout ms u32
    request body:  client id length u16 | client id (UTF-8) | protobuf request
    response body: protobuf response (flags 0), or an error (flags ERROR):
                   UTF-8 "<grpc status code name>\\n<details>"

`length` counts the body only. The first frame of a connection is HELLO (its body a JSON
object of the gRPC metadata headers the calls carry: date, namespace, signature); a
request before it is refused and the connection closed.
"""

from __future__ import annotations

import struct
from typing import NamedTuple, Protocol

from google.protobuf.message import Message

from protocol import ext as protocol_ext
from protocol.pb import service_pb2

HEADER = struct.Struct("!IIHHI")
HEADER_SIZE = HEADER.size  # 16
CLIENT_ID = struct.Struct("!H")
VERSION = 1

# flags of a response
ERROR = 0x1  # the body is "<status code name>\n<details>", not a protobuf response

# methods that are not RPCs
HELLO = 0  # the connection's metadata; answered with a JSON object {"version", "max_frame"}
CANCEL = 0xFFFF  # the request with this id is abandoned by its caller (no answer)


class Method(NamedTuple):
    code: int
    name: str  # the servicer's method
    request: type[Message]
    response: type[Message]


def _m(code: int, name: str, response: type[Message] | None = None) -> Method:
    return Method(
        code,
        name,
        getattr(service_pb2, f"{name}Request"),
        response if response is not None else getattr(service_pb2, f"{name}Response"),
    )


METHODS: tuple[Method, ...] = (
    _m(1, "QueryRoute"),
    _m(2, "Heartbeat"),
    _m(3, "SendMessage"),
    _m(4, "QueryAssignment"),
    _m(5, "AckMessage"),
    _m(6, "ForwardMessageToDeadLetterQueue"),
    _m(7, "EndTransaction"),
    _m(8, "NotifyClientTermination"),
    _m(9, "ChangeInvisibleDuration"),
    _m(10, "RecallMessage"),
    _m(11, "GetOffset"),
    _m(12, "QueryOffset"),
    Method(
        13,
        protocol_ext.RECEIVE_MESSAGES,
        service_pb2.ReceiveMessageRequest,
        protocol_ext.ReceiveMessagesResponse,
    ),
)
BY_CODE = {m.code: m for m in METHODS}
BY_NAME = {m.name: m for m in METHODS}

# the gRPC extension method a client asks for the wire port: empty request, UTF-8 JSON
# answer {"port": P} (0: no wire port)
WIRE_ENDPOINT = "WireEndpoint"
WIRE_ENDPOINT_PATH = f"/{protocol_ext.SERVICE}/{WIRE_ENDPOINT}"


def frame(request_id: int, method: int, flags: int, body: bytes, timeout_ms: int = 0) -> bytes:
    return HEADER.pack(len(body), request_id, method, flags, timeout_ms) + body


class Frame(NamedTuple):
    request_id: int
    method: int
    flags: int
    body: bytes


class Readable(Protocol):
    """A blocking byte stream: a socket, or the client's TLS stream over one."""

    def recv(self, n: int, /) -> bytes: ...


def read_frame(sock: Readable) -> Frame:
    """The next whole frame from a blocking stream; ConnectionError when it closes first."""

    def exactly(n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the connection was closed")
            out += chunk
        return bytes(out)

    length, request_id, method, flags, _ = HEADER.unpack(exactly(HEADER_SIZE))
    return Frame(request_id, method, flags, exactly(length))


def request_body(client_id: bytes, payload: bytes) -> bytes:
    return CLIENT_ID.pack(len(client_id)) + client_id + payload


__all__ = [
    "BY_CODE",
    "BY_NAME",
    "CANCEL",
    "CLIENT_ID",
    "ERROR",
    "HEADER",
    "HEADER_SIZE",
    "HELLO",
    "METHODS",
    "WIRE_ENDPOINT",
    "WIRE_ENDPOINT_PATH",
    "Frame",
    "Method",
    "frame",
    "read_frame",
    "request_body",
]
