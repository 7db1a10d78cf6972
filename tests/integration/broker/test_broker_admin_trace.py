"""The trace of a message consumed by pull (the send-back path): the schedule copy of each
retry, the retry copy it became, the dead-letter copy, and the group's committed offset."""

from __future__ import annotations

from broker_kit import ManualClock, drain, msg, settle

from broker.admin import methods
from broker.broker import Broker


def test_trace_follows_send_back_retries_into_the_dead_letter_queue(
    broker: Broker, clock: ManualClock
) -> None:
    broker.create_topic("orders", queues=1)
    broker.create_group("billing", retry_max_times=1)
    sent = broker.send_message(msg("orders", b"order-1", keys="order-1"))
    [first] = drain(broker, "billing", "orders")
    broker.consumer_send_back("billing", first)  # retry 1, through the schedule topic
    settle(broker)
    while broker.deliver_due() == 0:
        clock.advance(100)
    [retried] = drain(broker, "billing", broker.retry_topic("billing"))
    broker.consumer_send_back("billing", retried)  # no retries left: dead letter
    settle(broker)

    trace = methods(broker)["TraceMessage"]({"key": "order-1"})
    assert trace["message_ids"] == [sent.msg_id]
    assert [(r["role"], r["topic"], r["group"]) for r in trace["records"]] == [
        ("original", "orders", None),
        ("retry-scheduled", "SCHEDULE_TOPIC_XXXX", "billing"),
        ("retry", "%RETRY%billing", "billing"),
        ("dead-letter", "%DLQ%billing", "billing"),
    ]
    [group] = trace["groups"]
    assert (
        group["group"],
        group["state"],
        group["retries"],
        group["dead_lettered"],
        group["delivered"],
        group["acknowledged"],
    ) == ("billing", "dead-lettered", 1, True, True, False)
    assert [r["committed_past"] for r in group["records"]] == [True, True]
    # by the offset message id of the dead-letter copy: the same records
    dlq_id = trace["records"][-1]["offset_msg_id"]
    again = methods(broker)["TraceMessage"]({"key": dlq_id})
    assert [r["offset_msg_id"] for r in again["records"]] == [
        r["offset_msg_id"] for r in trace["records"]
    ]


def test_the_invisible_time_log_is_read_from_each_records_time(
    broker: Broker, clock: ManualClock
) -> None:
    """An operator's copy made long after the original: its delivery is found though the
    log between the two is longer than one scan."""
    broker.create_topic("orders", queues=1)
    broker.create_topic("noise", queues=1)
    broker.create_group("billing", retry_max_times=1)
    broker.heartbeat("c1", "billing", {"orders": None})
    sent = broker.send_message(msg("orders", b"order-7", keys="order-7"))
    settle(broker)
    [first] = broker.receive("billing", "orders", 1, invisible_ms=5_000)
    broker.forward_to_dlq("billing", "orders", first.receipt_handle)
    for i in range(30):  # other traffic in between: 60 log entries
        clock.advance(1_000)
        broker.send_message(msg("noise", f"n{i}".encode()))
        settle(broker)
        [e] = broker.receive("other", "noise", 1, invisible_ms=5_000)
        broker.ack("other", "noise", e.receipt_handle)
    clock.advance(60_000)
    methods(broker)["ReconsumeMessage"]({"id": sent.msg_id, "group": "billing", "operator": "me"})
    settle(broker)
    [again] = broker.receive("billing", "orders", 1, invisible_ms=5_000)
    broker.ack("billing", "orders", again.receipt_handle)
    settle(broker)  # the invisible-time log is read through its consume queue

    trace = methods(broker)["TraceMessage"]({"key": "order-7", "scan": 10})
    assert trace["pop_log"]["complete"] is False  # the noise in between was not all read
    kinds = [e["kind"] for e in trace["events"]]
    assert kinds == [
        "original",
        "delivered",
        "dead-letter",
        "dead-lettered",
        "reconsume",
        "delivered",
        "acknowledged",
    ]
    [group] = trace["groups"]
    assert (group["state"], group["deliveries"], group["reconsumed"]) == ("acknowledged", 2, 1)
    whole = methods(broker)["TraceMessage"]({"key": "order-7"})
    assert whole["pop_log"]["complete"] is True and whole["events"] == trace["events"]
