"""The server's extensions of the RocketMQ 5 protocol: a receive answered in one message,
the queue of a sent message, and the capabilities a client may ask about.

`apache.rocketmq.v2.MessagingService/ReceiveMessage` streams one `ReceiveMessageResponse`
per message, so a batch of 32 costs the server 34 stream writes and the client 34 stream
reads; on this server those writes, not the store, bound receive throughput. The extension
service `reliable.v1.BatchMessaging` offers the same receive answered by one message:

    rpc ReceiveMessages(apache.rocketmq.v2.ReceiveMessageRequest)
        returns (ReceiveMessagesResponse);

    message ReceiveMessagesResponse {
      apache.rocketmq.v2.Status status = 1;           // as ReceiveMessage's first response
      repeated apache.rocketmq.v2.Message messages = 2;
      google.protobuf.Timestamp delivery_timestamp = 3;
    }

Same request, same validation, same long polling, same statuses as ReceiveMessage. The
framework's grpc transport calls it first and, on `UNIMPLEMENTED` (an Apache RocketMQ proxy),
falls back to ReceiveMessage for that endpoint; the official clients never call it. The
message type is built here from a descriptor at import time, so there is no generated file
to keep in step with the protobuf runtime.

**Where a sent message went.** `SendResultEntry` carries the queue offset (`offset`) but no
queue id. This server appends one field the protocol does not define to each entry of a
message it stored in a queue:

    SendResultEntry { ... ; int32 queue_id = 1001; }   // varint, wire type 0

A client built from the official `.proto` keeps it as an unknown field and ignores it (the
official clients read only message_id, transaction_id, offset and recall_handle); the
framework reads it with `queue_id_of`. An entry without it (an Apache RocketMQ proxy; a
delayed or half message, which is not in its queue yet) names no queue: -1.

**Where the native wire is.** A route's `Broker` entries of the server that answers carry
its native wire's port (docs/wire.md), when it serves one, in one more field:

    Broker { ... ; int32 wire_port = 1002; }   // varint, wire type 0

so a client that learns a broker group from a route (a cluster's other groups) dials its
wire without asking; the official clients ignore it as an unknown field.

**Capabilities.** `reliable.v1.BatchMessaging/Capabilities` (request: empty bytes; answer: a
JSON object, `{"capabilities": [...]}`) says what this server accepts beyond the protocol:

- `group-resend`: a send to `%RETRY%<group>` carrying the `RETRY_TOPIC` property (the
  original topic) is a per-group resend: stored for that group alone and delivered to it
  under the original topic (`broker.server.group_resend`). The protocol reserves the
  property; a server without the capability refuses it (`ILLEGAL_MESSAGE_PROPERTY_KEY`).
- `send-queue`: its send results carry the queue id (above).

A server that does not know the call (an Apache RocketMQ proxy) answers `UNIMPLEMENTED`: no
capabilities. Clients choose by capability, never by the text of a refusal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, unknown_fields
from google.protobuf.message import Message

from protocol.pb import definition_pb2, service_pb2

SERVICE = "reliable.v1.BatchMessaging"
RECEIVE_MESSAGES = "ReceiveMessages"
RECEIVE_MESSAGES_PATH = f"/{SERVICE}/{RECEIVE_MESSAGES}"
_FILE = "reliable/v1/batch_messaging.proto"
CAPABILITIES = "Capabilities"
CAPABILITIES_PATH = f"/{SERVICE}/{CAPABILITIES}"
GROUP_RESEND = "group-resend"
SEND_QUEUE = "send-queue"

# SendResultEntry's queue id, a field the protocol does not define (see above)
QUEUE_ID_FIELD = 1001
_QUEUE_ID_TAG = bytes([((QUEUE_ID_FIELD << 3) & 0x7F) | 0x80, QUEUE_ID_FIELD >> 4])
_QUEUE_ID_BYTES: dict[int, bytes] = {}


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def queue_id_field(queue_id: int) -> bytes:
    """The encoded field that tells a SendResultEntry's queue id (`entry.MergeFromString`
    of it appends it as an unknown field); `queue_id` >= 0."""
    raw = _QUEUE_ID_BYTES.get(queue_id)
    if raw is None:
        raw = _QUEUE_ID_TAG + _varint(queue_id)
        if len(_QUEUE_ID_BYTES) < 4096:
            _QUEUE_ID_BYTES[queue_id] = raw
    return raw


# Broker's native wire port, a field the protocol does not define (see above)
WIRE_PORT_FIELD = 1002
_WIRE_PORT_TAG = bytes([((WIRE_PORT_FIELD << 3) & 0x7F) | 0x80, WIRE_PORT_FIELD >> 4])


def wire_port_field(port: int) -> bytes:
    """The encoded field that tells a route's Broker its native wire port (1..65535)."""
    return _WIRE_PORT_TAG + _varint(port)


def wire_port_of(broker: definition_pb2.Broker) -> int:
    """The native wire port a server put in a route's Broker (`wire_port_field`), else 0."""
    found = 0
    fields = unknown_fields.UnknownFieldSet(broker)
    for field in (fields[i] for i in range(len(fields))):
        if field.field_number == WIRE_PORT_FIELD and field.wire_type == 0:
            found = int(field.data)
    return found if 0 < found <= 65535 else 0


def queue_id_of(entry: service_pb2.SendResultEntry) -> int:
    """The queue id a server put in a SendResultEntry (`queue_id_field`), else -1."""
    found = -1
    fields = unknown_fields.UnknownFieldSet(entry)
    for field in (fields[i] for i in range(len(fields))):
        if field.field_number == QUEUE_ID_FIELD and field.wire_type == 0:
            found = int(field.data)
    return found if 0 <= found < 1 << 31 else -1


def _build() -> type[Message]:
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(_FILE)
    except KeyError:
        f = descriptor_pb2.FileDescriptorProto(name=_FILE, package="reliable.v1", syntax="proto3")
        f.dependency.extend(
            [
                definition_pb2.DESCRIPTOR.name,
                service_pb2.DESCRIPTOR.name,
                "google/protobuf/timestamp.proto",
            ]
        )
        m = f.message_type.add(name="ReceiveMessagesResponse")
        field = descriptor_pb2.FieldDescriptorProto
        for number, (name, label, type_name) in enumerate(
            (
                ("status", field.LABEL_OPTIONAL, ".apache.rocketmq.v2.Status"),
                ("messages", field.LABEL_REPEATED, ".apache.rocketmq.v2.Message"),
                ("delivery_timestamp", field.LABEL_OPTIONAL, ".google.protobuf.Timestamp"),
            ),
            start=1,
        ):
            m.field.add(
                name=name,
                number=number,
                label=label,
                type=field.TYPE_MESSAGE,
                type_name=type_name,
            )
        s = f.service.add(name="BatchMessaging")
        s.method.add(
            name=RECEIVE_MESSAGES,
            input_type=".apache.rocketmq.v2.ReceiveMessageRequest",
            output_type=".reliable.v1.ReceiveMessagesResponse",
        )
        pool.Add(f)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("reliable.v1.ReceiveMessagesResponse")
    )


if TYPE_CHECKING:  # the stub scripts/protocol_stubs.py makes from the descriptor above
    from protocol._stubs.batch_messaging_pb2 import ReceiveMessagesResponse
else:
    ReceiveMessagesResponse = _build()

__all__ = [
    "CAPABILITIES",
    "CAPABILITIES_PATH",
    "GROUP_RESEND",
    "QUEUE_ID_FIELD",
    "RECEIVE_MESSAGES",
    "RECEIVE_MESSAGES_PATH",
    "SEND_QUEUE",
    "SERVICE",
    "ReceiveMessagesResponse",
    "queue_id_field",
    "queue_id_of",
    "wire_port_field",
    "wire_port_of",
]
