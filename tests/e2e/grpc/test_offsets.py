"""GetOffset / QueryOffset on our server, and the resend worker's watermark over gRPC.

The outbox's resend worker needs a consumer group's committed offset per queue and a
queue's end. Over gRPC they come from GetOffset and QueryOffset (both answered by the
Apache proxy too). Our server says which queue a send went to (a field of the send result
the protocol lacks, docs/server.md), so a stub sent over gRPC has a watermark: backlogged
while its group has not reached it, lost once the group passed it without confirming.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import reliable
from outbox import Outbox, OutboxTables, ResendPolicy, ResendWorker, declare_groups, utcnow
from outbox.adapters import TransportOffsets
from reliable import BadRequest, BrokerCallError, Message, Producer, SimpleConsumer
from tests.e2e.grpc import official
from tests.e2e.grpc.server_process import ServerProcess


@pytest.fixture
def grpc_transport(server: ServerProcess) -> Iterator[Any]:
    t = reliable.connect("grpc", endpoint=server.endpoint)
    t.start()
    yield t
    t.close()


def test_committed_and_queue_offsets_over_grpc(grpc_transport: Any) -> None:
    transport = t = grpc_transport
    topic, group = "t-offsets", "g-offsets"
    with Producer(transport) as producer:
        for i in range(12):
            receipt = producer.send(Message(topic, f"m{i}".encode()))
            assert receipt.queue_id >= 0 and receipt.queue_offset >= 0
    queues = transport.route(topic).read_queues
    ends: dict[int, int] = {}

    def dispatched() -> bool:  # a stored message reaches its queue a moment later
        ends.update({q.queue_id: t.max_offset(q) for q in queues})
        return sum(ends.values()) == 12

    assert official.wait_for(dispatched)
    assert {t.min_offset(q) for q in queues} == {0}
    assert {t.query_offset(group, q) for q in queues} == {-1}

    offsets = TransportOffsets(transport)
    assert offsets.committed_offset(group, topic, 0) is None
    assert offsets.committed_offset(group, topic, -1) is None
    assert offsets.max_offset(topic, -1) is None
    with SimpleConsumer(
        group, {topic: "*"}, transport=transport, await_duration_s=1, invisible_duration_s=15
    ) as consumer:
        got: set[str] = set()

        def drained() -> bool:
            for msg in consumer.receive(max_messages=32):
                consumer.ack(msg)
                got.add(msg.message_id)
            return len(got) == 12

        assert official.wait_for(drained, timeout_s=30, interval_s=0)
    # every message acknowledged: the committed offset is each queue's end
    assert official.wait_for(
        lambda: all(offsets.committed_offset(group, topic, qid) == end for qid, end in ends.items())
    )
    assert {qid: offsets.max_offset(topic, qid) for qid in ends} == ends


def test_offset_queries_refuse_bad_queues(grpc_transport: Any) -> None:
    t = grpc_transport
    with Producer(grpc_transport) as producer:
        producer.send(Message("t-offsets-bad", b"x"))
    queue = grpc_transport.route("t-offsets-bad").read_queues[0]
    with pytest.raises(BadRequest) as bad:
        t.max_offset(queue._replace(queue_id=99))
    assert bad.value.code == "ILLEGAL_OFFSET"
    with pytest.raises(BrokerCallError) as missing:
        t.query_offset("g-offsets-bad", queue._replace(topic="t-never-made"))
    assert missing.value.code == "TOPIC_NOT_FOUND"


def test_resend_worker_over_grpc_judges_a_stub_by_its_groups_watermark(
    grpc_transport: Any, sqlite_url: str
) -> None:
    """The stub of a send over gRPC records the queue the server chose: backlogged while
    the group has not reached it (however old), lost once the group passed it without
    confirming, and the resend reaches the consumers."""
    topic, group = "t-offsets-resend", "g-offsets-resend"
    engine = sa.create_engine(sqlite_url)
    tables = OutboxTables()
    tables.create_all(engine)
    declare_groups(engine, tables, topic, [group])
    with Producer(grpc_transport) as producer:
        with Session(engine) as session, session.begin():
            message_id = Outbox(tables, producer).publish(session, Message(topic, b"order"))
        with engine.connect() as conn:
            row = conn.execute(
                sa.select(
                    tables.stub.c.queue_id, tables.stub.c.queue_offset, tables.stub.c.send_count
                )
            ).one()
        assert row.queue_id >= 0 and row.send_count == 1 and row.queue_offset >= 0
        offsets = TransportOffsets(grpc_transport)
        early = ResendWorker(
            engine,
            tables,
            producer,
            offsets=offsets,
            bounds=offsets,
            clock=utcnow,
            policy=ResendPolicy(),
        )
        assert early.run_once().resent == 0  # not due yet
        late = ResendWorker(
            engine,
            tables,
            producer,
            offsets=offsets,
            bounds=offsets,
            clock=lambda: utcnow() + timedelta(hours=1),
            policy=ResendPolicy(),
        )
        metrics = late.run_once()  # the group has not reached it: an hour is no loss
        assert (metrics.resent, metrics.backlogged, metrics.errors) == (0, 1, 0)
        with SimpleConsumer(
            group,
            {topic: "*"},
            transport=grpc_transport,
            await_duration_s=1,
            invisible_duration_s=15,
        ) as consumer:
            copies: list[tuple[str, str | None]] = []

            def received(n: int) -> bool:
                for msg in consumer.receive(max_messages=32):
                    consumer.ack(msg)  # acknowledged, never confirmed
                    copies.append((msg.message_id, msg.properties.get("OUTBOX_SEND_COUNT")))
                return len(copies) >= n

            assert official.wait_for(lambda: received(1), timeout_s=30, interval_s=0)
            stub_queue = row.queue_id
            assert official.wait_for(  # the group's committed offset passed the copy
                lambda: (offsets.committed_offset(group, topic, stub_queue) or 0) > row.queue_offset
            )
            later = ResendWorker(
                engine,
                tables,
                producer,
                offsets=offsets,
                bounds=offsets,
                clock=lambda: utcnow() + timedelta(hours=2),
                policy=ResendPolicy(),
            )
            metrics = later.run_once()
            assert (metrics.resent, metrics.backlogged, metrics.errors) == (1, 0, 0)
            with engine.connect() as conn:
                assert conn.execute(sa.select(tables.stub.c.send_count)).scalar_one() == 2
            assert official.wait_for(lambda: received(2), timeout_s=30, interval_s=0)
    # the resend is stored although the server deduplicates retries of one send: it is
    # numbered, so it is not the first send again
    assert sorted(copies, key=lambda c: c[1] or "") == [(message_id, None), (message_id, "2")]
    engine.dispose()


def test_query_offset_by_timestamp(grpc_transport: Any) -> None:
    """TIMESTAMP finds the first offset stored at/after the time; it needs a timestamp."""
    from reliable.transport._pb import service_pb2

    t = grpc_transport
    with Producer(t) as producer:
        producer.send(Message("t-offsets-time", b"x"))
    queue = next(
        q
        for q in t.route("t-offsets-time").read_queues
        if official.wait_for(lambda q=q: t.max_offset(q) > 0, timeout_s=2)
    )

    def ask(timestamp_ms: int | None) -> Any:
        request = service_pb2.QueryOffsetRequest()
        request.message_queue.topic.name = queue.topic
        request.message_queue.id = queue.queue_id
        request.query_offset_policy = 2  # TIMESTAMP
        if timestamp_ms is not None:
            request.timestamp.seconds = timestamp_ms // 1000
        return t.stub.QueryOffset(request, metadata=t.metadata("offsets-test"), timeout=5)

    assert ask(None).status.code == 40000  # BAD_REQUEST
    first = ask(0)
    assert (first.status.code, first.offset) == (20000, 0)
    future = ask(4_000_000_000_000)
    assert (future.status.code, future.offset) == (20000, 1)  # past the end: the end
