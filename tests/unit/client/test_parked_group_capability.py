"""An ordered consumer reaches the broker's parked-group record through a transport
capability (`Capability.PARKED_GROUPS`), not by reaching for the broker behind it."""

from __future__ import annotations

from reliable.consumer.orderly import parks_in_broker
from reliable.testing import TestBroker
from reliable.transport import connect
from reliable.transport.base import Capability, parked_group_record


def test_the_embedded_transport_offers_the_brokers_durable_record() -> None:
    with TestBroker() as tb:
        transport = tb.transport
        assert Capability.PARKED_GROUPS in transport.capabilities
        assert parks_in_broker(transport)
        record = parked_group_record(transport)
        assert record is not None
        assert record.parked_groups("g", "t") == frozenset()
        tb.broker.parked.park("g", "t", "P")  # what a forward with the park marker does
        assert record.parked_groups("g", "t") == frozenset({"P"})
        assert record.parked_groups("g", "other") == frozenset()
        tb.broker.parked.unpark("g", "t", "P")
        assert record.parked_groups("g", "t") == frozenset()


def test_a_remote_transport_without_the_capability_parks_in_the_consumer() -> None:
    transport = connect("grpc", endpoint="127.0.0.1:1")  # never started: no call is made
    assert Capability.PARKED_GROUPS not in transport.capabilities
    assert parked_group_record(transport) is None
    assert not parks_in_broker(transport)
