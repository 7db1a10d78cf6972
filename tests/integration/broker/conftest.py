"""Fixtures for the delivery-layer suites: a real MessageStore in a temp dir under a Broker,
small mapped files, a short delay-level table and a settable clock (no real sleeps)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_kit import BrokerFactory, ManualClock, broker_config, store_config

from broker.broker import Broker
from broker.store.config import FlushMode


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def make_broker(tmp_path: Path, clock: ManualClock) -> Iterator[BrokerFactory]:
    """Start a Broker on tmp_path/store (the same directory every call: a restart)."""
    started: list[Broker] = []

    def make(flush: FlushMode = FlushMode.ASYNC_FLUSH, **overrides: object) -> Broker:
        b = Broker(store_config(tmp_path / "store", flush), broker_config(**overrides), clock=clock)
        b.start()
        started.append(b)
        return b

    yield make
    for b in started:
        b.shutdown()


@pytest.fixture
def broker(make_broker: BrokerFactory) -> Broker:
    return make_broker()
