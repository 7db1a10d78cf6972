"""Per-group resends and send positions against a real `reliable broker start` process.

- A per-group resend (`Producer.send_to_group`: `%RETRY%<group>` carrying `RETRY_TOPIC`)
  over gRPC and over the native wire reaches that group alone, under the original topic.
- A forged one (the property on a plain topic, naming a dead-letter or a missing topic, a
  delayed copy) is refused with a typed error, and delivered to nobody.
- The resend worker resends to the one group that lost a message; against a server without
  the capability (`--no-group-resend`, as an Apache RocketMQ proxy) it says so and resends
  to the whole topic, counted in `topic_fallbacks`.
- A send's receipt names the queue the server chose, and the official client still sends
  and receives with the extra field in the send result.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from outbox import Outbox, OutboxConfig, OutboxTables, ResendPolicy, ResendWorker, declare_groups
from outbox.adapters import TransportOffsets
from outbox.latency import ExpectedLatency
from outbox.ports import utcnow
from reliable import (
    BadRequest,
    GroupResendRefused,
    GroupResendUnsupported,
    Message,
    Producer,
    SimpleConsumer,
    Transport,
    connect,
)
from reliable.message import ReceivedMessage
from tests.e2e.grpc import official
from tests.e2e.grpc.server_process import ServerProcess

WIRES = ["grpc", "wire"]


@pytest.fixture(params=WIRES)
def served(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Transport]:
    t = connect(
        "grpc", endpoint=server.endpoint, wire="native" if request.param == "wire" else "grpc"
    )
    t.start()
    yield t
    if request.param == "wire":  # the sends did go over the wire
        assert t.stub.native is True  # type: ignore[attr-defined]
    t.close()


def _consumer(transport: Transport, group: str, topic: str) -> SimpleConsumer:
    c = SimpleConsumer(
        group, {topic: "*"}, transport=transport, await_duration_s=1, invisible_duration_s=15
    )
    c.start()
    c.receive(max_messages=1)  # the group exists and starts before the first send
    return c


def _drain(consumer: SimpleConsumer, want: int, patience_s: float = 20.0) -> list[ReceivedMessage]:
    """What `consumer` receives (acknowledged) until `want` arrived and then 2 s of
    nothing, or `patience_s` passed."""
    got: list[ReceivedMessage] = []
    deadline = time.monotonic() + patience_s
    quiet_until = None
    while time.monotonic() < deadline:
        batch = consumer.receive(max_messages=16)
        for m in batch:
            consumer.ack(m)
        got += batch
        if len(got) >= want:
            if batch:
                quiet_until = time.monotonic() + 2
            elif quiet_until is not None and time.monotonic() >= quiet_until:
                break
            elif quiet_until is None:
                quiet_until = time.monotonic() + 2
    return got


def test_a_per_group_resend_reaches_only_that_group(served: Transport) -> None:
    topic, a, b = "gr-orders", "gr-billing", "gr-shipping"
    stamp = f"{time.monotonic_ns()}"
    topic, a, b = f"{topic}-{stamp}", f"{a}-{stamp}", f"{b}-{stamp}"
    ca, cb = _consumer(served, a, topic), _consumer(served, b, topic)
    try:
        with Producer(served) as producer:
            message = Message(topic, b"order 1", properties={"k": "v"})
            first = producer.send(message)
            assert first.queue_id >= 0  # the server said which queue
            assert [m.message_id for m in _drain(ca, 1)] == [message.message_id]
            assert [m.message_id for m in _drain(cb, 1)] == [message.message_id]

            assert producer.can_send_to_group()
            copy = Message(
                topic,
                message.body,
                message_id=message.message_id,
                properties={"k": "v", "OUTBOX_SEND_COUNT": "2"},
            )
            receipt = producer.send_to_group(copy, b)
            assert receipt.topic == f"%RETRY%{b}" and receipt.queue_id >= 0
            again = _drain(cb, 1)
            assert [(m.message_id, m.topic, m.body) for m in again] == [
                (message.message_id, topic, b"order 1")
            ]
            assert "RETRY_TOPIC" not in again[0].properties
            assert _drain(ca, 0, patience_s=4) == []  # the other group: nothing
    finally:
        ca.shutdown()
        cb.shutdown()


def test_a_forged_per_group_resend_is_refused_and_delivered_to_nobody(served: Transport) -> None:
    stamp = f"{time.monotonic_ns()}"
    topic, group = f"gf-orders-{stamp}", f"gf-billing-{stamp}"
    consumer = _consumer(served, group, topic)
    try:
        with Producer(served) as producer:
            # the reserved property on a plain topic: not a per-group resend
            with pytest.raises(BadRequest) as plain:
                producer.send(Message(topic, b"x", properties={"RETRY_TOPIC": topic}))
            assert plain.value.code == "ILLEGAL_MESSAGE_PROPERTY_KEY"
            assert "per-group resend" in str(plain.value)
            # a retry topic naming a dead-letter topic as the original
            with pytest.raises(BadRequest) as dlq:
                producer.send(
                    Message(f"%RETRY%{group}", b"x", properties={"RETRY_TOPIC": f"%DLQ%{group}"})
                )
            assert dlq.value.code == "ILLEGAL_MESSAGE_PROPERTY_KEY"
            # an original topic that does not exist: a resend never creates one
            with pytest.raises(GroupResendRefused) as missing:
                producer.send_to_group(Message(f"gf-never-{stamp}", b"x"), group)
            assert missing.value.code == "ILLEGAL_TOPIC"
            assert missing.value.group == group
            # a delayed copy is not a per-group resend
            with pytest.raises(GroupResendRefused) as delayed:
                producer.send_to_group(Message(topic, b"x", delay_level=2), group)
            assert delayed.value.code == "ILLEGAL_MESSAGE_PROPERTY_KEY"
        assert _drain(consumer, 0, patience_s=4) == []
    finally:
        consumer.shutdown()


def _stubs(db: Path, topic: str, groups: list[str]) -> tuple[sa.Engine, OutboxTables]:
    engine = sa.create_engine(f"sqlite:///{db}")
    tables = OutboxTables()
    tables.create_all(engine)
    declare_groups(engine, tables, topic, groups)
    return engine, tables


def _confirm(
    engine: sa.Engine, tables: OutboxTables, message_id: str, topic: str, group: str
) -> None:
    """`group` confirmed `message_id` (what its idempotency guard writes)."""
    with engine.begin() as conn:
        conn.execute(
            tables.confirmation.insert().values(
                message_id=message_id, consumer_group=group, topic=topic, confirmed_at=utcnow()
            )
        )


def _worker_pass(
    engine: sa.Engine, tables: OutboxTables, producer: Producer, transport: Transport
) -> dict[str, int]:
    """One worker pass an hour from now (every stub due and past its latency)."""
    later = utcnow() + timedelta(hours=1)
    worker = ResendWorker(
        engine,
        tables,
        producer,
        offsets=TransportOffsets(transport),
        policy=ResendPolicy(expected_latency=ExpectedLatency(timedelta(seconds=1))),
        clock=lambda: later,
    )
    return worker.run_once().as_dict()


def _publish_lost_by_one(
    transport: Transport, tmp_path: Path, topic: str, a: str, b: str
) -> tuple[sa.Engine, OutboxTables, str, SimpleConsumer, SimpleConsumer]:
    """A stub both groups got; `a` confirms it, `b` acknowledged without confirming."""
    engine, tables = _stubs(tmp_path / "app.db", topic, [a, b])
    ca, cb = _consumer(transport, a, topic), _consumer(transport, b, topic)
    with Producer(transport) as producer:
        outbox = Outbox(tables, producer, config=OutboxConfig(resend_after=timedelta(0)))
        with Session(engine) as session, session.begin():
            mid = outbox.publish(session, Message(topic, b"order"))
    with engine.connect() as conn:  # the stub knows where the copy went
        qid = conn.execute(sa.select(tables.stub.c.queue_id)).scalar_one()
    assert qid >= 0
    assert [m.message_id for m in _drain(ca, 1)] == [mid]
    assert [m.message_id for m in _drain(cb, 1)] == [mid]
    _confirm(engine, tables, mid, topic, a)
    return engine, tables, mid, ca, cb


def test_the_worker_resends_to_the_one_group_that_lost_it(
    served: Transport, tmp_path: Path
) -> None:
    stamp = f"{time.monotonic_ns()}"
    topic, a, b = f"gw-orders-{stamp}", f"gw-a-{stamp}", f"gw-b-{stamp}"
    engine, tables, mid, ca, cb = _publish_lost_by_one(served, tmp_path, topic, a, b)
    try:
        with Producer(served) as producer:
            done = _worker_pass(engine, tables, producer, served)
        assert (done["resent"], done["group_resends"], done["topic_fallbacks"]) == (1, 1, 0)
        assert done["refused"] == 0 and done["escalated"] == 0
        assert [(m.message_id, m.topic) for m in _drain(cb, 1)] == [(mid, topic)]
        assert _drain(ca, 0, patience_s=4) == []
        with engine.connect() as conn:
            positions = json.loads(
                conn.execute(sa.select(tables.stub.c.group_positions)).scalar_one()
            )
        assert positions[b][0] == f"%RETRY%{b}" and positions[b][1] >= 0
    finally:
        ca.shutdown()
        cb.shutdown()
        engine.dispose()


def test_without_the_capability_the_worker_resends_to_the_whole_topic(
    make_server: object, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proc = make_server("--no-group-resend")  # type: ignore[operator]
    transport = connect("grpc", endpoint=proc.endpoint)
    transport.start()
    topic, a, b = "gn-orders", "gn-a", "gn-b"
    engine, tables, mid, ca, cb = _publish_lost_by_one(transport, tmp_path, topic, a, b)
    try:
        with Producer(transport) as producer:
            assert not producer.can_send_to_group()
            with pytest.raises(GroupResendUnsupported):
                producer.send_to_group(Message(topic, b"x"), b)
            # the server refuses the reserved property as an Apache proxy does
            with pytest.raises(BadRequest):
                producer.send(Message(f"%RETRY%{b}", b"x", properties={"RETRY_TOPIC": topic}))
            with caplog.at_level("INFO", logger="outbox.worker"):
                done = _worker_pass(engine, tables, producer, transport)
        assert (done["resent"], done["group_resends"], done["topic_fallbacks"]) == (1, 0, 1)
        assert done["refused"] == 0 and done["escalated"] == 0
        assert "does not accept per-group resends" in caplog.text
        # both groups get the copy: `a` confirmed it already, its guard absorbs it
        assert [m.message_id for m in _drain(cb, 1)] == [mid]
        assert [m.message_id for m in _drain(ca, 1)] == [mid]
    finally:
        ca.shutdown()
        cb.shutdown()
        transport.close()
        engine.dispose()


def test_the_official_client_sends_and_receives_with_the_queue_in_the_send_result(
    server: ServerProcess,
) -> None:
    stamp = f"{time.monotonic_ns()}"
    topic, group = f"gq-official-{stamp}", f"gq-group-{stamp}"
    consumer = official.simple_consumer(server.endpoint, group, topic)
    producer = official.producer(server.endpoint, [topic])
    try:
        official.receive_until(consumer, lambda g: True, timeout_s=3)  # the group starts
        sent = [producer.send(official.message(topic, f"m{i}".encode())) for i in range(3)]
        assert all(r.message_id for r in sent)
        got = official.receive_until(consumer, lambda g: len(g) >= 3)
        assert sorted(m.body for m in got) == [b"m0", b"m1", b"m2"]
        assert {m.message_id for m in got} == {r.message_id for r in sent}
    finally:
        producer.shutdown()
        consumer.shutdown()
