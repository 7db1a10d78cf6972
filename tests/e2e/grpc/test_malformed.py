"""Malformed and hostile input: clean statuses, never a crash, never a stuck stream.

Ends with a check that the server still serves the official client correctly.
"""

from __future__ import annotations

import contextlib
import random
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from broker.server.codes import Code
from protocol.pb import service_pb2, service_pb2_grpc
from tests.e2e.grpc import official
from tests.e2e.grpc.server_process import ServerProcess


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[Any]:
    channel = grpc.insecure_channel(server.endpoint)
    yield service_pb2_grpc.MessagingServiceStub(channel)
    channel.close()


def md(client_id: str = "malformed-test") -> list[tuple[str, str]]:
    return [("x-mq-client-id", client_id), ("x-mq-namespace", "")]


def send_request(topic: str = "t-bad", body: bytes = b"x", **sp: Any) -> Any:
    request = service_pb2.SendMessageRequest()
    msg = request.messages.add()
    msg.topic.name = topic
    msg.body = body
    msg.system_properties.message_id = sp.pop("message_id", uuid.uuid4().hex.upper())
    msg.system_properties.message_type = sp.pop("message_type", 1)
    for name, value in sp.pop("user", {}).items():
        msg.user_properties[name] = value
    for name, value in sp.items():
        setattr(msg.system_properties, name, value)
    return request


def code_of_send(stub: Any, request: Any, metadata: Any = None) -> int:
    return int(stub.SendMessage(request, metadata=metadata or md(), timeout=10).status.code)


def test_garbage_bytes_on_the_port(server: ServerProcess, seed: int) -> None:
    rng = random.Random(seed)
    payloads = [bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 4096))) for _ in range(20)]
    payloads += [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        + b"\x00\x00\x12\x04\x00\x00\x00\x00\x00"
        + b"\xff" * 40,
        b"\x16\x03\x01\x02\x00",
    ]
    for payload in payloads:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(payload)
            sock.settimeout(0.5)
            with contextlib.suppress(TimeoutError, ConnectionError):
                sock.recv(1024)
    assert server.alive()


def test_undecodable_and_mistyped_requests(server: ServerProcess) -> None:
    channel = grpc.insecure_channel(server.endpoint)
    try:
        raw = channel.unary_unary(
            "/apache.rocketmq.v2.MessagingService/SendMessage",
            request_serializer=None,
            response_deserializer=None,
        )

        def send_code(body: bytes) -> int:
            return int(
                service_pb2.SendMessageResponse.FromString(
                    raw(body, metadata=md(), timeout=5)
                ).status.code
            )

        # not protobuf at all: answered in-band, like any bad request
        assert send_code(b"\xff\xff\xff\xff\x0f garbage") == Code.BAD_REQUEST
        # another message's bytes whose wire types clash: likewise
        query = service_pb2.QueryRouteRequest()
        query.topic.name = "t-bad"
        assert send_code(query.SerializeToString()) == Code.BAD_REQUEST
        # another message's bytes that parse into nonsense: answered in-band
        heartbeat = service_pb2.HeartbeatRequest(client_type=1)
        reply = service_pb2.SendMessageResponse.FromString(
            raw(heartbeat.SerializeToString(), metadata=md(), timeout=5)
        )
        assert reply.status.code == Code.BAD_REQUEST
        recv = channel.unary_stream(
            "/apache.rocketmq.v2.MessagingService/ReceiveMessage",
            request_serializer=None,
            response_deserializer=None,
        )
        replies = [
            service_pb2.ReceiveMessageResponse.FromString(r)
            for r in recv(send_request().SerializeToString(), metadata=md(), timeout=10)
        ]
        assert replies[0].status.code != Code.OK
        assert replies[-1].HasField("delivery_timestamp")  # the stream still ends properly
    finally:
        channel.close()
    assert server.alive()


def test_validation_codes(stub: Any) -> None:
    assert code_of_send(stub, send_request(topic="bad topic!")) == Code.ILLEGAL_TOPIC
    assert code_of_send(stub, send_request(topic="SCHEDULE_TOPIC_XXXX")) == Code.ILLEGAL_TOPIC
    assert code_of_send(stub, send_request(body=b"")) == Code.MESSAGE_BODY_EMPTY
    assert (
        code_of_send(stub, send_request(body=b"x" * (4 * 1024 * 1024 + 1)))
        == Code.MESSAGE_BODY_TOO_LARGE
    )
    assert code_of_send(stub, send_request(message_id="")) == Code.ILLEGAL_MESSAGE_ID
    assert code_of_send(stub, send_request(message_id="A" * 129)) == Code.ILLEGAL_MESSAGE_ID
    assert code_of_send(stub, send_request(message_id="AB\x01CD")) == Code.ILLEGAL_MESSAGE_ID
    assert code_of_send(stub, send_request(message_id="   ")) == Code.ILLEGAL_MESSAGE_ID
    assert code_of_send(stub, send_request(message_id="A" * 128)) == Code.OK
    assert code_of_send(stub, send_request(tag="a|b")) == Code.ILLEGAL_MESSAGE_TAG
    assert code_of_send(stub, send_request(tag="a\x07")) == Code.ILLEGAL_MESSAGE_TAG
    assert code_of_send(stub, send_request(user={"KEYS": "x"})) == Code.ILLEGAL_MESSAGE_PROPERTY_KEY
    assert (
        code_of_send(stub, send_request(user={f"p{i}": "v" for i in range(200)}))
        == Code.MESSAGE_PROPERTIES_TOO_LARGE
    )
    assert (
        code_of_send(stub, send_request(message_group="g" * 80, message_type=2))
        == Code.ILLEGAL_MESSAGE_GROUP
    )
    far = send_request(message_type=3)
    far.messages[0].system_properties.delivery_timestamp.seconds = int(time.time()) + 3 * 86400
    assert code_of_send(stub, far) == Code.ILLEGAL_DELIVERY_TIME
    assert (
        code_of_send(stub, send_request(), metadata=[("x-mq-namespace", "")])
        == Code.CLIENT_ID_REQUIRED
    )
    end = service_pb2.EndTransactionRequest(transaction_id="not-ours", resolution=1)
    end.topic.name = "t-bad"
    assert (
        stub.EndTransaction(end, metadata=md(), timeout=5).status.code
        == Code.INVALID_TRANSACTION_ID
    )


def test_type_conflict_with_topic(server: ServerProcess, stub: Any) -> None:
    from reliable.admin import AdminClient

    admin = AdminClient(server.endpoint)
    admin.call("CreateTopic", name="t-normal-only", type="NORMAL")
    admin.close()
    fifo = send_request(topic="t-normal-only", message_group="g", message_type=2)
    assert code_of_send(stub, fifo) == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE


def test_huge_batches(server: ServerProcess, stub: Any) -> None:
    request = service_pb2.SendMessageRequest()
    for i in range(5000):
        m = request.messages.add()
        m.topic.name = "t-batch"
        m.body = b"x"
        m.system_properties.message_id = f"ID{i}"
    assert code_of_send(stub, request) == Code.PAYLOAD_TOO_LARGE
    big = service_pb2.SendMessageRequest()
    for i in range(20):
        m = big.messages.add()
        m.topic.name = "t-batch"
        m.body = b"x" * (4 * 1024 * 1024)
        m.system_properties.message_id = f"BIG{i}"
    with pytest.raises(grpc.RpcError) as info:  # over the transport's request limit
        stub.SendMessage(big, metadata=md(), timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert server.alive()


def test_unknown_receipt_handles(stub: Any) -> None:
    ack = service_pb2.AckMessageRequest()
    ack.group.name, ack.topic.name = "g-bad", "t-bad"
    for handle in ("garbage", "", "1~t-bad~0~0~ff~0~1~00000000", "x" * 10_000):
        entry = ack.entries.add()
        entry.message_id, entry.receipt_handle = "ID", handle
    reply = stub.AckMessage(ack, metadata=md(), timeout=5)
    assert [e.status.code for e in reply.entries] == [Code.INVALID_RECEIPT_HANDLE] * 4
    assert reply.status.code == Code.INVALID_RECEIPT_HANDLE
    change = service_pb2.ChangeInvisibleDurationRequest(receipt_handle="nope", message_id="ID")
    change.group.name, change.topic.name = "g-bad", "t-bad"
    change.invisible_duration.seconds = 10
    assert (
        stub.ChangeInvisibleDuration(change, metadata=md(), timeout=5).status.code
        == Code.INVALID_RECEIPT_HANDLE
    )
    dlq = service_pb2.ForwardMessageToDeadLetterQueueRequest(receipt_handle="nope")
    dlq.group.name, dlq.topic.name = "g-bad", "t-bad"
    assert (
        stub.ForwardMessageToDeadLetterQueue(dlq, metadata=md(), timeout=5).status.code
        == Code.INVALID_RECEIPT_HANDLE
    )


def receive_request(
    group: str,
    topic: str,
    invisible_s: int = 60,
    poll_s: int = 5,
    filter_type: int = 1,
    expression: str = "*",
) -> Any:
    request = service_pb2.ReceiveMessageRequest(batch_size=16)
    request.group.name = group
    request.message_queue.topic.name = topic
    request.filter_expression.type = filter_type
    request.filter_expression.expression = expression
    request.invisible_duration.seconds = invisible_s
    request.long_polling_timeout.seconds = poll_s
    return request


def test_receive_argument_codes(stub: Any) -> None:
    def first_code(request: Any, timeout: float = 10) -> int:
        replies = list(stub.ReceiveMessage(request, metadata=md(), timeout=timeout))
        assert replies[-1].HasField("delivery_timestamp")
        return int(replies[0].status.code)

    assert (
        first_code(receive_request("g-args", "t-args", invisible_s=0))
        == Code.ILLEGAL_INVISIBLE_TIME
    )
    assert (
        first_code(receive_request("g-args", "t-args", invisible_s=100_000))
        == Code.ILLEGAL_INVISIBLE_TIME
    )
    assert (
        first_code(receive_request("g-args", "t-args", filter_type=2, expression="a > 1"))
        == Code.ILLEGAL_FILTER_EXPRESSION
    )
    assert first_code(receive_request("bad group!", "t-args")) == Code.ILLEGAL_CONSUMER_GROUP
    assert first_code(receive_request("g-args", "t-args"), timeout=0.9) == Code.ILLEGAL_POLLING_TIME


def test_abrupt_stream_cancellations_release_messages(server: ServerProcess, stub: Any) -> None:
    for _ in range(20):  # parked polls cancelled at once
        call = stub.ReceiveMessage(
            receive_request("g-cancel", "t-cancel"), metadata=md(), timeout=30
        )
        call.cancel()
    for _ in range(10):  # telemetry streams opened and dropped
        settings = service_pb2.TelemetryCommand()
        settings.settings.client_type = 1
        settings.settings.publishing.topics.add().name = "t-cancel"
        stream = stub.Telemetry(
            iter([settings]), metadata=md(f"tele-{uuid.uuid4().hex}"), timeout=30
        )
        next(stream)
        stream.cancel()
    producer = official.producer(server.endpoint, ["t-cancel"])
    consumer = official.simple_consumer(server.endpoint, "g-cancel", "t-cancel")
    try:
        # receives parked with a 60 s invisible time, abandoned by their callers: whatever
        # they would have taken must not stay hidden
        calls = [
            stub.ReceiveMessage(receive_request("g-cancel", "t-cancel"), metadata=md(), timeout=30)
            for _ in range(5)
        ]
        for call in calls:
            call.cancel()
        mid = producer.send(official.message("t-cancel", b"survivor")).message_id
        got = official.receive_until(consumer, lambda g: len(g) >= 1, timeout_s=30)
        assert [m.message_id for m in got] == [mid]  # not hidden for 60 s
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_still_serving_correctly_afterwards(server: ServerProcess) -> None:
    consumer = official.simple_consumer(server.endpoint, "g-after", "t-after")
    producer = official.producer(server.endpoint, ["t-after"])
    try:
        sent = {
            producer.send(official.message("t-after", f"{i}".encode())).message_id
            for i in range(50)
        }
        got = official.receive_until(consumer, lambda g: len(g) >= 50)
        assert sorted(m.message_id for m in got) == sorted(sent)
    finally:
        producer.shutdown()
        consumer.shutdown()
    assert server.alive()
