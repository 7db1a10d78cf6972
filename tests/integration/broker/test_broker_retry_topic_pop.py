"""An invisible-time receive also takes the group's retry topic (where an operator's
reconsume, a DLQ replay or the outbox's resend put copies for that group alone), and the
copy's receipt handle acks, nacks and dead-letters it there, though the consumer names
only the topic it subscribed to."""

from __future__ import annotations

from broker_kit import ManualClock, drain, msg, settle

from broker.broker import Broker


def _one_copy(broker: Broker) -> str:
    broker.create_topic("t", queues=2)
    broker.create_group("g", retry_max_times=1)
    sent = broker.send_message(msg("t", b"order 42"))
    settle(broker)
    broker.reconsume_directly("g", sent.commitlog_offset, properties={"OPERATOR": "me"})
    settle(broker)
    return sent.msg_id


def test_a_retry_copy_reaches_a_group_that_reads_one_topic(broker: Broker) -> None:
    mid = _one_copy(broker)
    broker.heartbeat("c1", "g", {"t": None})
    got = broker.receive("g", "t", 10, invisible_ms=5_000)
    # the copy first (an operator asked for it), then the original
    assert [(e.message.topic, e.message.msg_id) for e in got] == [("%RETRY%g", mid), ("t", mid)]
    assert got[0].message.properties["OPERATOR"] == "me"
    errors = broker.ack_batch("g", "t", [e.receipt_handle for e in got])
    assert errors == [None, None]
    assert broker.query_offset("g", "%RETRY%g", 0) == 1
    assert broker.receive("g", "t", 10, invisible_ms=5_000) == []


def test_nack_and_dead_letter_of_a_retry_copy_follow_its_handle(
    broker: Broker, clock: ManualClock
) -> None:
    mid = _one_copy(broker)
    broker.heartbeat("c1", "g", {"t": None})
    [copy, original] = broker.receive("g", "t", 10, invisible_ms=5_000)
    broker.ack("g", "t", original.receipt_handle)
    broker.change_invisible_duration("g", "t", copy.receipt_handle, 0)
    clock.advance(1)
    [again] = broker.receive("g", "t", 10, invisible_ms=5_000)
    assert (again.message.topic, again.delivery_attempt) == ("%RETRY%g", 2)
    broker.forward_to_dlq("g", "t", again.receipt_handle)
    assert [d.msg_id for d in drain(broker, "g", broker.dlq_topic("g"))] == [mid]
    assert broker.receive("g", "t", 10, invisible_ms=5_000) == []


def test_a_group_reading_several_topics_is_not_handed_another_topics_copy(broker: Broker) -> None:
    _one_copy(broker)
    broker.create_topic("u", queues=1)
    broker.heartbeat("c1", "g", {"t": None, "u": None})
    assert [e.message.topic for e in broker.receive("g", "u", 10, invisible_ms=5_000)] == []
    assert [e.message.topic for e in broker.receive("g", "t", 10, invisible_ms=5_000)] == ["t"]


def test_without_live_consumers_nothing_changes(broker: Broker) -> None:
    _one_copy(broker)
    assert [e.message.topic for e in broker.receive("g", "t", 10, invisible_ms=5_000)] == ["t"]
