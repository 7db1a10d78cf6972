"""The broker's collector against a real store: retry and dead-letter depths, lag, in
flight and the delivered/acked totals after a known sequence, time on a manual clock."""

from __future__ import annotations

from broker_kit import ManualClock, msg, settle
from prometheus_client import CollectorRegistry

from broker.admin import methods
from broker.broker import Broker
from broker.metrics import BrokerCollector

LEVEL_MS = [100, 200, 300, 400, 500, 600, 700, 800]


def _scrape(broker: Broker) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(BrokerCollector(broker))
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }


def test_depths_lag_and_totals_follow_a_known_sequence(broker: Broker, clock: ManualClock) -> None:
    broker.create_topic("orders", queues=1)
    broker.create_group("billing", retry_max_times=16)
    for i in range(5):
        broker.send_message(msg("orders", f"order-{i}".encode()))
    settle(broker)
    entries = broker.receive("billing", "orders", 4, 60_000)
    assert len(entries) == 4
    broker.ack("billing", "orders", entries[0].receipt_handle)
    broker.ack_batch("billing", "orders", [entries[1].receipt_handle])
    broker.consumer_send_back("billing", entries[2].message, delay_level=1)
    broker.ack("billing", "orders", entries[2].receipt_handle)  # handed back: done here
    broker.forward_to_dlq("billing", "orders", entries[3].receipt_handle)
    settle(broker)
    g = (("group", "billing"),)
    s = _scrape(broker)
    assert s[("reliable_broker_retry_depth_messages", g)] == 0  # still scheduled
    clock.advance(LEVEL_MS[0])
    assert broker.deliver_due() == 1
    settle(broker)

    s = _scrape(broker)
    gt = (("group", "billing"), ("topic", "orders"))
    assert s[("reliable_broker_messages_put_total", (("topic", "orders"),))] == 5
    assert s[("reliable_broker_messages_delivered_total", gt)] == 4
    assert s[("reliable_broker_messages_acked_total", gt)] == 3
    assert s[("reliable_broker_retry_depth_messages", g)] == 1
    assert s[("reliable_broker_dlq_depth_messages", g)] == 1
    # the fifth message was never received; the first four are settled
    assert (
        s[
            (
                "reliable_broker_consumer_lag_messages",
                (("group", "billing"), ("queue", "0"), ("topic", "orders")),
            )
        ]
        == 1
    )
    assert s[("reliable_broker_in_flight_messages", gt)] == 0


def test_a_retry_copy_counts_under_the_retry_topic_as_group_show_counts_it(
    broker: Broker,
) -> None:
    """A consumer of `orders` is handed `%RETRY%billing` copies too and acks them naming
    `orders`: delivered and acked count them under the topic their record is in, the
    retry topic, the same rule `group show` follows (one acked by `ack`, one by
    `ack_batch` together with an original)."""
    broker.create_topic("orders", queues=1)
    broker.create_group("billing")
    sent = [broker.send_message(msg("orders", f"order-{i}".encode())) for i in range(2)]
    settle(broker)
    for s in sent:
        broker.reconsume_directly("billing", s.commitlog_offset)
    settle(broker)
    broker.heartbeat("c1", "billing", {"orders": None})
    got = broker.receive("billing", "orders", 10, invisible_ms=60_000)
    assert [e.message.topic for e in got] == ["%RETRY%billing"] * 2 + ["orders"] * 2
    s = _scrape(broker)
    on_orders = (("group", "billing"), ("topic", "orders"))
    on_retry = (("group", "billing"), ("topic", "%RETRY%billing"))
    assert s[("reliable_broker_in_flight_messages", on_retry)] == 2
    assert s[("reliable_broker_in_flight_messages", on_orders)] == 2
    broker.ack("billing", "orders", got[0].receipt_handle)
    handles = [got[1].receipt_handle, got[2].receipt_handle]
    assert broker.ack_batch("billing", "orders", handles) == [None, None]

    s = _scrape(broker)
    assert s[("reliable_broker_messages_delivered_total", on_orders)] == 2
    assert s[("reliable_broker_messages_delivered_total", on_retry)] == 2
    assert s[("reliable_broker_messages_acked_total", on_orders)] == 1
    assert s[("reliable_broker_messages_acked_total", on_retry)] == 2
    assert s[("reliable_broker_in_flight_messages", on_orders)] == 1
    assert ("reliable_broker_in_flight_messages", on_retry) not in s  # none left there
    shown = methods(broker)["GroupProgress"]({"group": "billing"})
    assert shown["retry_topic"] == "%RETRY%billing"
    assert (shown["retry_depth"], shown["retry_in_flight"]) == (0, 0)  # both acked there
    [orders] = shown["topics"]
    assert orders["in_flight"] == 1  # the one original not acked
