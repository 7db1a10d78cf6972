"""Parked message groups in the broker: a park diverts the group's later messages to the
DLQ (in order, marked), survives a restart, ends only when unparked; the admin service's
group operations check their input."""

from __future__ import annotations

import pytest
from broker_kit import BrokerFactory, drain, msg, settle

from broker.broker import Broker
from broker.errors import TopicNotFound
from broker.server.admin import AdminOps
from broker.server.errors import BadRequest
from protocol.props import Prop

PARKED = "PARKED_MESSAGE_GROUP"


def _send(broker: Broker, *bodies: str) -> None:
    for body in bodies:  # the message group is the body's first letter
        broker.send_message(msg("t", body.encode(), **{Prop.SHARDING_KEY: body[0]}))
    settle(broker)


def _bodies(entries: list) -> list[bytes]:  # type: ignore[type-arg]
    return [e.message.body for e in entries]


def test_a_forward_with_park_diverts_the_group_until_unparked(make_broker: BrokerFactory) -> None:
    broker = make_broker()
    broker.create_topic("t", queues=1)
    broker.create_group("g")
    _send(broker, "P0", "Q0", "P1", "Q1", "P2")
    first = broker.receive("g", "t", 10, invisible_ms=60_000, fifo=True)
    assert _bodies(first) == [b"P0", b"Q0"]  # one per group while in flight
    broker.ack("g", "t", first[1].receipt_handle)
    broker.forward_to_dlq("g", "t", first[0].receipt_handle, park=True)
    assert broker.parked_message_groups("g") == [{"group": "g", "topic": "t", "message_group": "P"}]
    # P1 and P2 go to the DLQ instead of the group; Q keeps flowing in order
    got = broker.receive("g", "t", 10, invisible_ms=60_000, fifo=True)
    assert _bodies(got) == [b"Q1"]
    broker.ack("g", "t", got[0].receipt_handle)
    assert broker.receive("g", "t", 10, invisible_ms=60_000, fifo=True) == []
    broker.shutdown()

    broker = make_broker()  # the park is on disk
    _send(broker, "P3", "Q2")
    assert _bodies(broker.receive("g", "t", 10, invisible_ms=60_000, fifo=True)) == [b"Q2"]
    assert broker.unpark_message_group("g", "t", "P")
    assert not broker.unpark_message_group("g", "t", "P")
    _send(broker, "P4")
    assert _bodies(broker.receive("g", "t", 10, invisible_ms=60_000, fifo=True)) == [b"P4"]
    dead = drain(broker, "reader", broker.dlq_topic("g"))
    assert [(d.body, d.properties.get(PARKED)) for d in dead] == [
        (b"P0", "P"),
        (b"P1", "P"),
        (b"P2", "P"),
        (b"P3", "P"),
    ]
    assert all(d.properties[Prop.DLQ_ORIGIN_TOPIC] == "t" for d in dead)


def test_a_plain_forward_does_not_park(broker: Broker) -> None:
    broker.create_topic("t", queues=1)
    broker.create_group("g", fifo=True)
    _send(broker, "P0", "P1")
    [e] = broker.receive("g", "t", 10, invisible_ms=60_000)
    broker.forward_to_dlq("g", "t", e.receipt_handle)  # what an official client does
    assert broker.parked_message_groups() == []
    assert _bodies(broker.receive("g", "t", 10, invisible_ms=60_000)) == [b"P1"]
    [dead] = drain(broker, "reader", broker.dlq_topic("g"))
    assert PARKED not in dead.properties


def test_a_send_back_carrying_the_property_parks_and_keeps_it(broker: Broker) -> None:
    """The pull model: the consumer marks the message; the broker rebuilds the dead letter
    from the stored record and must keep the mark."""
    broker.create_topic("t", queues=1)
    broker.create_group("g")
    _send(broker, "P0")
    [m] = broker.pull_message("g", "t", 0, 0, 32).messages
    m.properties[PARKED] = "P"
    broker.consumer_send_back("g", m, delay_level=-1)
    [dead] = drain(broker, "reader", broker.dlq_topic("g"))
    assert dead.properties.get(PARKED) == "P"
    assert broker.parked_message_groups("g") == [{"group": "g", "topic": "t", "message_group": "P"}]
    broker.delete_topic("t")  # a deleted topic forgets its parks
    assert broker.parked_message_groups() == []


def test_admin_group_operations_check_their_input(broker: Broker) -> None:
    ops = AdminOps(broker)
    broker.create_topic("t", queues=2)
    _send(broker, "A0")
    with pytest.raises(BadRequest, match="consume_from must be one of"):
        ops.call("SetGroupStart", {"group": "g", "topic": "t", "consume_from": "MIDDLE"})
    with pytest.raises(BadRequest, match="timestamp_ms"):
        ops.call(
            "SetGroupStart",
            {"group": "g", "topic": "t", "consume_from": "TIMESTAMP", "timestamp_ms": -1},
        )
    with pytest.raises(TopicNotFound):
        ops.call("SetGroupStart", {"group": "g", "topic": "nope"})
    with pytest.raises(BadRequest, match="message_group"):
        ops.call("ParkMessageGroup", {"group": "g", "topic": "t", "message_group": ""})
    started = ops.call("SetGroupStart", {"group": "g", "topic": "t", "consume_from": "LAST"})
    assert [q["set"] for q in started["queues"]] == [True, True]
    assert sum(q["offset"] for q in started["queues"]) == 1  # after A0
    again = ops.call("SetGroupStart", {"group": "g", "topic": "t", "consume_from": "FIRST"})
    assert again["queues"] == [{**q, "set": False} for q in started["queues"]]  # kept
    assert ops.call("ParkMessageGroup", {"group": "g", "topic": "t", "message_group": "A"}) == {
        "parked": True
    }
    assert ops.call("ListParkedGroups", {}) == {
        "parked": [{"group": "g", "topic": "t", "message_group": "A"}]
    }
