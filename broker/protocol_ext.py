"""The server's one extension of the RocketMQ 5 protocol: a receive answered in one message.

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
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from broker.protocol_pb import definition_pb2, service_pb2

SERVICE = "reliable.v1.BatchMessaging"
RECEIVE_MESSAGES = "ReceiveMessages"
RECEIVE_MESSAGES_PATH = f"/{SERVICE}/{RECEIVE_MESSAGES}"
_FILE = "reliable/v1/batch_messaging.proto"


def _build() -> Any:
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


ReceiveMessagesResponse: Any = _build()

__all__ = ["RECEIVE_MESSAGES", "RECEIVE_MESSAGES_PATH", "SERVICE", "ReceiveMessagesResponse"]
