"""Send-back, the retry ladder, the DLQ and delay messages, through the Broker API against a
real MessageStore. Time is a manual clock: each rung is shown not due one millisecond before
its delay and due at it."""

from __future__ import annotations

import pytest
from broker_kit import BrokerFactory, ManualClock, drain, msg, settle

from broker.broker import Broker
from broker.topic import PERM_READ_WRITE
from protocol.names import SCHEDULE_TOPIC
from protocol.props import Prop

LEVEL_MS = [100, 200, 300, 400, 500, 600, 700, 800]


def _deliver_when_due(broker: Broker, clock: ManualClock, delay_ms: int) -> None:
    """Nothing moves one ms before `delay_ms`; exactly one message moves at it."""
    settle(broker)
    clock.advance(delay_ms - 1)
    assert broker.deliver_due() == 0
    clock.advance(1)
    assert broker.deliver_due() == 1
    settle(broker)


def test_handler_failing_three_times_sees_reconsume_times_0_to_3_with_growing_delays(
    broker: Broker, clock: ManualClock
) -> None:
    broker.create_topic("orders", queues=1)
    broker.create_group("billing", retry_max_times=16)
    sent = broker.send_message(msg("orders", b"order-1", tags="created"))
    retry = broker.retry_topic("billing")

    seen = drain(broker, "billing", "orders")
    assert [m.reconsume_times for m in seen] == [0]
    deliveries = [seen[0]]
    gaps = []
    for attempt in range(3):  # fail three times
        current = deliveries[-1]
        broker.consumer_send_back("billing", current)
        settle(broker)
        sched = broker.store.get_messages("x", SCHEDULE_TOPIC, 2 + attempt, 0, 32).messages
        assert len(sched) == 1
        assert sched[0].properties[Prop.REAL_TOPIC] == retry
        assert sched[0].properties[Prop.DELAY] == str(3 + attempt)
        assert sched[0].reconsume_times == attempt + 1
        _deliver_when_due(broker, clock, LEVEL_MS[2 + attempt])
        got = drain(broker, "billing", retry)
        assert len(got) == 1
        gaps.append(got[0].store_timestamp - sched[0].store_timestamp)
        deliveries.append(got[0])
    # the fourth delivery succeeds: nothing is left anywhere
    assert drain(broker, "billing", retry) == []
    assert [d.reconsume_times for d in deliveries] == [0, 1, 2, 3]
    assert gaps == [300, 400, 500]  # level 3, 4, 5: increasing delays
    assert {d.msg_id for d in deliveries} == {sent.msg_id}
    assert all(d.body == b"order-1" and d.tags == "created" for d in deliveries)
    for d in deliveries[1:]:
        assert d.properties[Prop.RETRY_TOPIC] == "orders"
        assert d.properties[Prop.ORIGIN_MESSAGE_ID] == deliveries[0].offset_msg_id
        assert d.properties[Prop.ORIGIN_COMMITLOG_OFFSET] == str(deliveries[0].commitlog_offset)
        assert d.properties[Prop.RECONSUME_TIME] == str(d.reconsume_times)
        assert Prop.DELAY not in d.properties


def test_always_failing_message_reaches_the_dlq_after_exactly_max_reconsume_times(
    broker: Broker, clock: ManualClock
) -> None:
    broker.create_topic("orders", queues=2)
    broker.create_group("g", retry_max_times=3)
    sent = broker.send_message(msg("orders", b"poison", queue_id=1))
    retry, dlq = broker.retry_topic("g"), broker.dlq_topic("g")
    deliveries = drain(broker, "g", "orders")
    while True:
        broker.consumer_send_back("g", deliveries[-1])
        settle(broker)
        if broker.deliver_due() == 0:
            clock.advance(10_000)
            if broker.deliver_due() == 0:
                break
        got = drain(broker, "g", retry)
        assert len(got) == 1
        deliveries.append(got[0])
    assert [d.reconsume_times for d in deliveries] == [0, 1, 2, 3]  # 1 + 3 retries
    dead = drain(broker, "g", dlq)
    assert len(dead) == 1
    assert dead[0].msg_id == sent.msg_id and dead[0].body == b"poison"
    assert dead[0].properties[Prop.DLQ_ORIGIN_TOPIC] == "orders"
    assert dead[0].reconsume_times == 3
    route = broker.route(dlq)
    assert route.perm == PERM_READ_WRITE  # readable and routable for operators
    assert drain(broker, "g", retry) == []


def test_send_back_with_level_minus_one_goes_to_the_dlq_at_once(broker: Broker) -> None:
    broker.create_topic("t", queues=1)
    broker.send_message(msg("t"))
    [m] = drain(broker, "g", "t")
    broker.consumer_send_back("g", m, delay_level=-1)
    assert len(drain(broker, "g", broker.dlq_topic("g"))) == 1


def test_explicit_delay_level_and_client_max(broker: Broker, clock: ManualClock) -> None:
    broker.create_topic("t", queues=1)
    broker.send_message(msg("t"))
    [m] = drain(broker, "g", "t")
    broker.consumer_send_back("g", m, delay_level=1)
    _deliver_when_due(broker, clock, LEVEL_MS[0])
    [r] = drain(broker, "g", broker.retry_topic("g"))
    broker.consumer_send_back("g", r, max_reconsume_times=1)  # the client's own limit
    assert len(drain(broker, "g", broker.dlq_topic("g"))) == 1


def test_delay_level_message(broker: Broker, clock: ManualClock) -> None:
    broker.create_topic("t", queues=1)
    sent_at = clock()
    sent = broker.send_message(msg("t", b"later", **{Prop.DELAY: "2"}))
    assert sent.queue_offset == -1
    assert drain(broker, "g", "t") == []
    _deliver_when_due(broker, clock, LEVEL_MS[1])
    [m] = drain(broker, "g", "t")
    assert m.msg_id == sent.msg_id and m.body == b"later"
    # the level is gone; when it was due stays (consumers' delivery timestamp)
    assert Prop.DELAY not in m.properties
    assert m.properties[Prop.TIMER_DELIVER_MS] == str(sent_at + LEVEL_MS[1])


def test_delivery_timestamps_deliver_in_time_order(broker: Broker, clock: ManualClock) -> None:
    broker.create_topic("t", queues=1)
    t = clock()
    late = broker.send_message(msg("t", b"late", **{Prop.TIMER_DELIVER_MS: str(t + 5_000)}))
    early = broker.send_message(msg("t", b"early", **{Prop.TIMER_DELIVER_MS: str(t + 1_000)}))
    now = broker.send_message(msg("t", b"now", **{Prop.TIMER_DELIVER_MS: str(t - 1)}))
    assert now.queue_offset == 0  # a past delivery time is delivered at once
    settle(broker)
    assert broker.deliver_due() == 0
    clock.advance(1_000)
    assert broker.deliver_due() == 1
    clock.advance(3_999)
    assert broker.deliver_due() == 0
    clock.advance(1)
    assert broker.deliver_due() == 1
    got = drain(broker, "g", "t")
    assert [m.body for m in got] == [b"now", b"early", b"late"]
    assert [m.msg_id for m in got[1:]] == [early.msg_id, late.msg_id]


def test_schedule_progress_survives_restart(make_broker: BrokerFactory, clock: ManualClock) -> None:
    b1 = make_broker()
    b1.create_topic("t", queues=1)
    t = clock()
    for i in range(3):
        b1.send_message(msg("t", f"lvl{i}".encode(), **{Prop.DELAY: "1"}))
    for i in range(3):
        b1.send_message(
            msg("t", f"ts{i}".encode(), **{Prop.TIMER_DELIVER_MS: str(t + 1_000 * (i + 1))})
        )
    settle(b1)
    clock.advance(1_000)
    assert b1.deliver_due() == 4  # 3 level-1 messages + the first timestamp
    b1.shutdown()
    assert b1.schedule_offsets()[1] == 3

    b2 = make_broker()
    assert b2.schedule_offsets()[1] == 3
    assert b2.deliver_due() == 0  # nothing delivered twice
    clock.advance(2_000)
    assert b2.deliver_due() == 2
    bodies = sorted(m.body for m in drain(b2, "g", "t"))
    assert bodies == sorted([b"lvl0", b"lvl1", b"lvl2", b"ts0", b"ts1", b"ts2"])


def test_schedule_service_runs_by_itself(make_broker: BrokerFactory, clock: ManualClock) -> None:
    import time

    b = make_broker(schedule_interval_ms=5)
    b.create_topic("t", queues=1)
    b.send_message(msg("t", **{Prop.DELAY: "1"}))
    clock.advance(100)
    deadline = time.monotonic() + 10
    got = []
    while not got and time.monotonic() < deadline:
        got = drain(b, "g", "t")
        time.sleep(0.01)
    assert len(got) == 1


def test_recall_cancels_a_delayed_message_for_good(
    make_broker: BrokerFactory, clock: ManualClock
) -> None:
    from broker.schedule import InvalidRecallHandle

    b1 = make_broker()
    b1.create_topic("t", queues=1)
    t = clock()
    by_level = b1.send_message(msg("t", b"level", **{Prop.DELAY: "3"}))
    by_time = b1.send_message(msg("t", b"time", **{Prop.TIMER_DELIVER_MS: str(t + 900)}))
    kept = b1.send_message(msg("t", b"kept", **{Prop.DELAY: "3"}))
    assert by_level.recall_handle and by_time.recall_handle
    assert b1.recall_message("t", by_level.recall_handle) == by_level.msg_id
    assert b1.recall_message("t", by_time.recall_handle) == by_time.msg_id
    with pytest.raises(InvalidRecallHandle):
        b1.recall_message("other", by_level.recall_handle)
    with pytest.raises(InvalidRecallHandle):
        b1.recall_message("t", by_level.recall_handle[:-1] + "x")
    b1.shutdown()  # the recall is durable

    b2 = make_broker()
    settle(b2)
    clock.advance(1_000)
    assert b2.deliver_due() == 1
    assert [m.body for m in drain(b2, "g", "t")] == [b"kept"]
    assert kept.recall_handle is not None
    with pytest.raises(InvalidRecallHandle):  # too late: already delivered
        b2.recall_message("t", kept.recall_handle)


def test_reconsume_directly_replays_a_dead_letter(broker: Broker) -> None:
    broker.create_topic("t", queues=1)
    sent = broker.send_message(msg("t", b"replay-me"))
    [m] = drain(broker, "g", "t")
    broker.consumer_send_back("g", m, delay_level=-1)
    [dead] = drain(broker, "g", broker.dlq_topic("g"))
    result = broker.reconsume_directly("g", dead.commitlog_offset)
    assert result.msg_id == sent.msg_id
    [again] = drain(broker, "g", broker.retry_topic("g"))
    assert again.body == b"replay-me" and again.msg_id == sent.msg_id
    assert again.properties[Prop.RETRY_TOPIC] == "t"
