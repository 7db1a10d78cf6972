"""A busy served loop over real gRPC: answers held and sent together (`broker.server.answers`)
and single sends stored together (`broker.server.send_groups`). Many single-message sends
in flight at once each get their own answer (their own message id and offset), every
message is stored once, exactly as it was sent (tag, keys, born time), resends of a send
get its first answer, and under `--flush sync` no answer comes before its record is on
disk; concurrent single acks each get their own answer; a client sending one call at a
time never waits for a batch."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from broker.broker import Broker
from broker.metrics import BrokerCollector
from broker.server.codes import Code
from broker.server.config import ServerConfig
from broker.server.server import MessagingServer
from broker.store.config import StoreConfig
from protocol.pb import service_pb2, service_pb2_grpc
from tests.e2e.grpc.server_process import cli
from tests.e2e.grpc.test_batched_rpcs import MD, receive_all, send_request, sync_flush_broker

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


def _records(broker: Broker, topic: str) -> dict[str, tuple[int, Any]]:
    """Every record of `topic` by message id: (queue offset, record); each id once."""
    assert broker.store.wait_dispatched(timeout_s=10.0)
    records: dict[str, tuple[int, Any]] = {}
    for queue in range(QUEUES):
        for offset in range(broker.store.get_max_offset_in_queue(topic, queue)):
            ext = broker.store.get_message_by_queue_offset(topic, queue, offset)
            assert ext is not None and ext.msg_id not in records
            records[ext.msg_id] = (offset, ext)
    return records


@pytest.fixture
def stub(served: tuple[Broker, MessagingServer]) -> Iterator[Any]:
    """A blocking stub of the served server."""
    channel = grpc.insecure_channel(f"127.0.0.1:{served[1].port}")
    try:
        yield service_pb2_grpc.MessagingServiceStub(channel)
    finally:
        channel.close()


def _request(i: int) -> Any:
    """A single-message send; every third with a tag and keys (another record batch shape)."""
    request = send_request("held", [b"m%d" % i])
    if i % 3 == 0:
        sp = request.messages[0].system_properties
        sp.tag = "T"
        sp.keys.extend([f"k{i}", "shared"])
    return request


def test_many_sends_in_flight_each_get_their_own_answer_and_are_stored_once(
    served: tuple[Broker, MessagingServer],
) -> None:
    broker, server = served
    broker.create_topic("held", queues=QUEUES)
    requests = [_request(i) for i in range(IN_FLIGHT)]
    resends = requests[100:150]  # the same sends again, in the same burst
    replies = _concurrently(f"127.0.0.1:{server.port}", requests + resends, "SendMessage")
    answers, groups = server.ctx.answers, server.ctx.send_groups
    assert answers.held_total > 0 and answers.rounds > 0  # the loop was busy: some were held
    assert answers.held == 0  # and every one was released
    assert groups.sends_joined > 0 and groups.groups_stored < groups.sends_joined  # grouped
    # what an operator scrapes says as much
    registry = CollectorRegistry()
    registry.register(BrokerCollector(broker, busy_turns=server.ctx.busy_turns))
    scraped = {s.name: s.value for family in registry.collect() for s in family.samples}
    assert scraped["reliable_broker_answers_held_total"] == answers.held_total
    assert scraped["reliable_broker_grouped_sends_total"] == groups.sends_joined
    assert scraped["reliable_broker_send_groups_total"] == groups.groups_stored
    for request, reply in zip(requests + resends, replies, strict=True):
        assert isinstance(reply, service_pb2.SendMessageResponse)
        assert reply.status.code == Code.OK, reply
        [entry] = reply.entries
        assert entry.message_id == request.messages[0].system_properties.message_id
    assert (
        [r.entries[0].offset for r in replies[IN_FLIGHT:]]
        == [  # type: ignore[attr-defined]
            r.entries[0].offset  # type: ignore[attr-defined]
            for r in replies[100:150]
        ]
    )
    # every message stored once, as it was sent, and each answer names its own record
    stored = _records(broker, "held")
    assert len(stored) == IN_FLIGHT
    for i, (request, reply) in enumerate(zip(requests, replies[:IN_FLIGHT], strict=True)):
        entry = reply.entries[0]  # type: ignore[attr-defined]
        sent = request.messages[0]
        offset, ext = stored[entry.message_id]
        assert offset == entry.offset and ext.body == sent.body
        born = sent.system_properties.born_timestamp
        assert ext.born_timestamp == born.seconds * 1000 + born.nanos // 1_000_000
        if i % 3 == 0:
            assert ext.tags == "T" and ext.keys == [f"k{i}", "shared"]
        else:
            assert not ext.tags and ext.keys == []


def test_sends_stored_together_under_sync_flush_are_answered_only_once_on_disk(
    tmp_path: Path,
) -> None:
    broker = sync_flush_broker(tmp_path)
    broker.create_topic("held-durable", queues=QUEUES)
    server = MessagingServer(broker, ServerConfig(port=0, answer_batch=16, answer_linger_ms=50))
    server.start()
    flushed = broker.store.commitlog.queue
    requests = [send_request("held-durable", [b"d%d" % i]) for i in range(300)]

    async def main() -> list[tuple[Any, int]]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)

            async def one(request: Any) -> tuple[Any, int]:
                reply = await stub.SendMessage(request, metadata=MD, timeout=30)
                return reply, flushed.flushed_where  # on disk when the answer arrived

            return list(await asyncio.gather(*(one(r) for r in requests)))

    try:
        answered = asyncio.run(main())
        assert server.ctx.send_groups.groups_stored > 0
        ends = {  # message id -> the end of its record in the commitlog
            message_id: ext.commitlog_offset + ext.store_size
            for message_id, (_, ext) in _records(broker, "held-durable").items()
        }
        assert len(ends) == len(requests)
        for reply, on_disk in answered:
            assert reply.status.code == Code.OK, reply
            assert ends[reply.entries[0].message_id] <= on_disk
    finally:
        server.stop()
        broker.shutdown()


def test_concurrent_single_acks_each_get_their_own_answer(
    served: tuple[Broker, MessagingServer], stub: Any
) -> None:
    broker, server = served
    broker.create_topic("held-acks", queues=1)
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


def test_a_client_sending_one_call_at_a_time_never_waits_for_a_batch(
    served: tuple[Broker, MessagingServer], stub: Any
) -> None:
    broker, server = served
    broker.create_topic("held-lone", queues=1)
    offsets = []
    for _ in range(40):
        request = send_request("held-lone", [uuid.uuid4().bytes])
        reply = stub.SendMessage(request, metadata=MD, timeout=10)
        assert reply.status.code == Code.OK
        offsets.append(reply.entries[0].offset)
    assert offsets == list(range(40))
    assert server.ctx.answers.held_total == 0 and server.ctx.send_groups.sends_joined == 0


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


def test_a_group_the_broker_refuses_whole_is_stored_send_by_send(
    served: tuple[Broker, MessagingServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Broker.send_bodies` answering None (a batch refused as a whole, nothing stored):
    every send of the group then takes the general way, each with its own verdict."""
    broker, server = served
    broker.create_topic("held", queues=QUEUES)
    refused: list[int] = []

    def refuse(topic: str, queue_id: int, bodies: Any, *args: Any, **kwargs: Any) -> None:
        refused.append(len(bodies))
        return None

    monkeypatch.setattr(broker, "send_bodies", refuse)
    requests = [send_request("held", [b"r%d" % i]) for i in range(200)]
    replies = _concurrently(f"127.0.0.1:{server.port}", requests, "SendMessage")
    assert server.ctx.send_groups.groups_stored > 0 and any(n > 1 for n in refused)
    assert all(r.status.code == Code.OK for r in replies)  # type: ignore[attr-defined]
    stored = _records(broker, "held")
    assert sorted(ext.body for _, ext in stored.values()) == sorted(
        r.messages[0].body for r in requests
    )
