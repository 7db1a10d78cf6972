"""Answers held while the served loop is busy (`broker.server.answers`), over real gRPC: many
single-message sends in flight at once each get their own answer (their own message id and
offset), every message is stored once, answers were held along the way; concurrent single
acks likewise; a client sending one call at a time never has its answer held."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from broker.broker import Broker
from broker.protocol_pb import service_pb2, service_pb2_grpc
from broker.server.codes import Code
from broker.server.config import ServerConfig
from broker.server.server import MessagingServer
from broker.store.config import StoreConfig
from tests.e2e.grpc.server_process import cli
from tests.e2e.grpc.test_batched_rpcs import MD, receive_all, send_request

IN_FLIGHT = 600
QUEUES = 4


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Broker, MessagingServer]]:
    broker = Broker(
        StoreConfig(store_dir=tmp_path, mapped_file_size_commitlog=8 << 20, warm_mapped_file=False)
    )
    broker.start()
    server = MessagingServer(
        broker, ServerConfig(port=0, answer_batch=16, answer_linger_ms=50, min_invisible_ms=1000)
    )
    server.start()
    try:
        yield broker, server
    finally:
        server.stop()
        broker.shutdown()


def _concurrently(endpoint: str, requests: list[object], method: str) -> list[object]:
    """Every request at once on one channel (grpc.aio), the replies in request order."""

    async def main() -> list[object]:
        async with grpc.aio.insecure_channel(endpoint) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            call = getattr(stub, method)
            return list(await asyncio.gather(*(call(r, metadata=MD, timeout=30) for r in requests)))

    return asyncio.run(main())


def test_many_sends_in_flight_each_get_their_own_answer_and_are_stored_once(
    served: tuple[Broker, MessagingServer],
) -> None:
    broker, server = served
    broker.create_topic("held", queues=QUEUES)
    requests = [send_request("held", [b"m%d" % i]) for i in range(IN_FLIGHT)]
    replies = _concurrently(f"127.0.0.1:{server.port}", requests, "SendMessage")
    answers = server.ctx.answers
    assert answers.held_total > 0 and answers.rounds > 0  # the loop was busy: some were held
    assert answers.held == 0  # and every one was released
    for request, reply in zip(requests, replies, strict=True):
        assert isinstance(reply, service_pb2.SendMessageResponse)
        assert reply.status.code == Code.OK, reply
        [entry] = reply.entries
        assert entry.message_id == request.messages[0].system_properties.message_id
    assert broker.store.wait_dispatched(timeout_s=10.0)
    # every message stored once, and each answer names its own record
    stored: dict[str, tuple[int, bytes]] = {}  # message id -> (queue offset, body)
    for queue in range(QUEUES):
        for offset in range(broker.store.get_max_offset_in_queue("held", queue)):
            ext = broker.store.get_message_by_queue_offset("held", queue, offset)
            assert ext is not None and ext.msg_id not in stored
            stored[ext.msg_id] = (offset, ext.body)
    assert len(stored) == IN_FLIGHT
    for request, reply in zip(requests, replies, strict=True):
        entry = reply.entries[0]  # type: ignore[attr-defined]
        assert stored[entry.message_id] == (entry.offset, request.messages[0].body)


def test_concurrent_single_acks_each_get_their_own_answer(
    served: tuple[Broker, MessagingServer],
) -> None:
    broker, server = served
    broker.create_topic("held-acks", queues=1)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    try:
        bodies = [b"a%d" % i for i in range(96)]
        for start in range(0, len(bodies), 32):
            reply = stub.SendMessage(
                send_request("held-acks", bodies[start : start + 32]), metadata=MD, timeout=10
            )
            assert reply.status.code == Code.OK
        got = receive_all(stub, "held-acks-g", "held-acks", len(bodies), invisible_s=4)
        assert sorted(m.body for m in got) == sorted(bodies)
        acks = []
        for m in got:
            ack = service_pb2.AckMessageRequest()
            ack.group.name, ack.topic.name = "held-acks-g", "held-acks"
            entry = ack.entries.add()
            entry.message_id = m.system_properties.message_id
            entry.receipt_handle = m.system_properties.receipt_handle
            acks.append(ack)
        acks[5].entries[0].receipt_handle = "not-a-handle"  # this one fails, alone
        replies = _concurrently(f"127.0.0.1:{server.port}", acks, "AckMessage")
        for i, (ack, reply) in enumerate(zip(acks, replies, strict=True)):
            assert isinstance(reply, service_pb2.AckMessageResponse)
            assert reply.entries[0].message_id == ack.entries[0].message_id
            want = Code.INVALID_RECEIPT_HANDLE if i == 5 else Code.OK
            assert reply.entries[0].status.code == want, (i, reply)
        # only the message whose ack failed comes back
        back = receive_all(stub, "held-acks-g", "held-acks", 1, within_s=25)
        assert [m.body for m in back] == [got[5].body]
    finally:
        channel.close()


def test_a_client_sending_one_call_at_a_time_never_waits_for_a_batch(
    served: tuple[Broker, MessagingServer],
) -> None:
    broker, server = served
    broker.create_topic("held-lone", queues=1)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    try:
        offsets = []
        for _ in range(40):
            request = send_request("held-lone", [uuid.uuid4().bytes])
            reply = stub.SendMessage(request, metadata=MD, timeout=10)
            assert reply.status.code == Code.OK
            offsets.append(reply.entries[0].offset)
        assert offsets == list(range(40))
        assert server.ctx.answers.held_total == 0
    finally:
        channel.close()


@pytest.mark.parametrize(
    ("flag", "value"), [("--answer-batch", "-1"), ("--answer-linger-ms", "5000")]
)
def test_an_answer_bound_out_of_range_is_refused_before_the_store_opens(
    tmp_path: Path, flag: str, value: str
) -> None:
    broker = Broker(StoreConfig(store_dir=tmp_path / "own", mapped_file_size_commitlog=8 << 20))
    try:
        with pytest.raises(ValueError, match="answer"):
            MessagingServer(broker, ServerConfig(port=0, answer_batch=-1))
    finally:
        broker.shutdown()
    done = cli("broker", "start", "--store", str(tmp_path / "store"), "--port", "0", flag, value)
    assert done.returncode == 2, done.stderr
    assert flag in done.stderr and "answer" in done.stderr
    assert not (tmp_path / "store").exists()
