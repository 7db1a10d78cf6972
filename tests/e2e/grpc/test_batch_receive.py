"""The server's batch receive, `reliable.v1.BatchMessaging/ReceiveMessages`: the same receive
as ReceiveMessage, the whole batch in one response; and the framework's transport, which
uses it where offered and falls back to ReceiveMessage where not (an Apache proxy)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from bench.grpc import serving
from broker.server.codes import Code
from protocol import ext as protocol_ext
from protocol.pb import service_pb2
from reliable import Message, Producer, SimpleConsumer, connect
from tests.e2e.grpc.server_process import ServerProcess
from tests.e2e.grpc.test_batched_rpcs import MD, send_request, stub  # noqa: F401 (fixture)


@pytest.fixture
def receive_messages(server: ServerProcess) -> Iterator[Any]:
    channel = grpc.insecure_channel(server.endpoint)
    yield channel.unary_unary(
        protocol_ext.RECEIVE_MESSAGES_PATH,
        request_serializer=service_pb2.ReceiveMessageRequest.SerializeToString,
        response_deserializer=protocol_ext.ReceiveMessagesResponse.FromString,
    )
    channel.close()


def receive_request(group: str, topic: str, batch: int = 32, poll_s: int = 1) -> Any:
    request = service_pb2.ReceiveMessageRequest(batch_size=batch)
    request.group.name = group
    request.message_queue.topic.name = topic
    request.filter_expression.type = 1
    request.filter_expression.expression = "*"
    request.invisible_duration.seconds = 30
    request.long_polling_timeout.seconds = poll_s
    return request


def test_a_batch_comes_whole_in_one_response_and_each_message_acks(
    stub: Any,  # noqa: F811
    receive_messages: Any,
) -> None:
    topic, group = "batch-receive", "batch-receive-g"
    empty = receive_messages(receive_request(group, topic), metadata=MD, timeout=10)
    assert empty.status.code == Code.MESSAGE_NOT_FOUND and not empty.messages
    assert empty.HasField("delivery_timestamp")

    bodies = [f"b{i}".encode() for i in range(20)]
    sent = stub.SendMessage(send_request(topic, bodies), metadata=MD, timeout=10)
    assert sent.status.code == Code.OK
    ids = [e.message_id for e in sent.entries]

    got: list[Any] = []
    for _ in range(10):
        reply = receive_messages(receive_request(group, topic, batch=32), metadata=MD, timeout=10)
        if reply.status.code == Code.MESSAGE_NOT_FOUND:
            continue
        assert reply.status.code == Code.OK
        got.extend(reply.messages)
        if len(got) >= len(bodies):
            break
    assert sorted(m.system_properties.message_id for m in got) == sorted(ids)
    assert sorted(m.body for m in got) == sorted(bodies)
    assert all(m.system_properties.receipt_handle for m in got)
    assert all(m.system_properties.delivery_attempt == 1 for m in got)

    ack = service_pb2.AckMessageRequest()
    ack.group.name, ack.topic.name = group, topic
    for m in got:
        entry = ack.entries.add()
        entry.message_id = m.system_properties.message_id
        entry.receipt_handle = m.system_properties.receipt_handle
    acked = stub.AckMessage(ack, metadata=MD, timeout=10)
    assert [e.status.code for e in acked.entries] == [Code.OK] * len(got)
    again = receive_messages(receive_request(group, topic), metadata=MD, timeout=10)
    assert again.status.code == Code.MESSAGE_NOT_FOUND and not again.messages


def test_a_batch_is_bounded_by_its_batch_size(stub: Any, receive_messages: Any) -> None:  # noqa: F811
    topic, group = "batch-receive-size", "batch-receive-size-g"
    stub.SendMessage(send_request(topic, [b"x"] * 10), metadata=MD, timeout=10)
    sizes: list[int] = []
    while sum(sizes) < 10 and len(sizes) < 30:
        reply = receive_messages(receive_request(group, topic, batch=4), metadata=MD, timeout=10)
        assert reply.status.code in (Code.OK, Code.MESSAGE_NOT_FOUND)
        sizes.append(len(reply.messages))
    assert sum(sizes) == 10 and max(sizes) == 4  # never more than asked, all of them in time


def test_bad_requests_are_answered_in_band(receive_messages: Any, server: ServerProcess) -> None:
    bad_group = receive_messages(receive_request("bad group!", "t"), metadata=MD, timeout=10)
    assert bad_group.status.code == Code.ILLEGAL_CONSUMER_GROUP and not bad_group.messages
    no_client = receive_messages(receive_request("g", "t"), timeout=10)
    assert no_client.status.code == Code.CLIENT_ID_REQUIRED
    raw = grpc.insecure_channel(server.endpoint)
    try:
        garbage = raw.unary_unary(
            protocol_ext.RECEIVE_MESSAGES_PATH,
            request_serializer=lambda b: b,
            response_deserializer=protocol_ext.ReceiveMessagesResponse.FromString,
        )(b"\xff\xff\xff\x07 not a protobuf", metadata=MD, timeout=10)
    finally:
        raw.close()
    assert garbage.status.code == Code.BAD_REQUEST


def test_the_framework_receives_in_batches_from_this_server(server: ServerProcess) -> None:
    topic = f"fw-batch-{uuid.uuid4().hex[:8]}"
    transport = connect("grpc", endpoint=server.endpoint)
    transport.start()
    try:
        with (
            SimpleConsumer(f"{topic}-g", {topic: "*"}, transport=transport) as consumer,
            Producer(transport) as producer,
        ):
            consumer.receive(max_messages=1)  # the group starts at the queue's end
            sent = [producer.send(Message(topic, f"m{i}".encode())) for i in range(40)]
            got: list[Any] = []
            for _ in range(20):
                got.extend(consumer.receive(max_messages=32))
                if len(got) >= 40:
                    break
            assert sorted(m.message_id for m in got) == sorted(r.message_id for r in sent)
            consumer.ack_many(got)
        assert transport.batch_receive is True  # type: ignore[attr-defined]
    finally:
        transport.close()


@pytest.fixture
def proxy_like_stub(tmp_path: Path) -> Iterator[str]:
    """The no-work server without the batch receive, as an Apache RocketMQ proxy."""
    argv = ["-m", "bench._stub", "--port", "0", "--without-batch-receive"]
    with serving(argv, tmp_path, "stub server") as endpoint:
        yield endpoint


def test_the_framework_falls_back_to_receive_message_where_not_offered(
    proxy_like_stub: str,
) -> None:
    transport = connect("grpc", endpoint=proxy_like_stub)
    transport.start()
    try:
        with SimpleConsumer("g", {"t": "*"}, transport=transport) as consumer:
            first = consumer.receive(max_messages=5)
            second = consumer.receive(max_messages=3)
        assert [len(first), len(second)] == [5, 3]  # the stub's canned batch, streamed
        assert transport.batch_receive is False  # type: ignore[attr-defined]
    finally:
        transport.close()
