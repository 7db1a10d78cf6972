"""The broker's collector against a real store: retry and dead-letter depths, lag, in
flight and the delivered/acked totals after a known sequence, time on a manual clock."""

from __future__ import annotations

from broker_kit import ManualClock, msg, settle
from prometheus_client import CollectorRegistry

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
