"""End-to-end fixtures: a real embedded broker on a small store in a temporary directory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import reliable
from broker.store.config import FlushMode
from reliable import Transport
from tests.e2e.helpers import broker_config, store_config


@pytest.fixture
def make_transport(tmp_path: Path) -> Iterator[Callable[..., Transport]]:
    made: list[Transport] = []

    def make(
        name: str = "store", *, flush: FlushMode = FlushMode.ASYNC_FLUSH, **broker_overrides: Any
    ) -> Transport:
        t = reliable.connect(
            "embedded",
            store_config=store_config(tmp_path / name, flush_mode=flush),
            broker_config=broker_config(**broker_overrides),
        )
        t.start()
        made.append(t)
        return t

    yield make
    for t in reversed(made):
        t.close()


@pytest.fixture
def transport(make_transport: Callable[..., Transport]) -> Transport:
    return make_transport()
