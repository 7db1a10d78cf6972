"""Fixtures for the outbox suites: real databases, a recording sender, a settable clock."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from outbox_testkit import RecordingSender

from outbox import OutboxTables
from tests.conftest import DATABASES_AND_DRIVERS, database_url
from tests.integration.dbkit import engine_for, mark_databases, outbox_tables


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_databases(items, "integration/outbox")


class Clock:
    """Settable naive-UTC clock: tests move time instead of sleeping."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, 12, 0, 0)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self.now

    def advance(self, **kwargs: float) -> datetime:
        with self._lock:
            self.now += timedelta(**kwargs)
            return self.now


class Offsets:
    """Committed consumer offsets as the broker would report them: real numbers, settable."""

    def __init__(self) -> None:
        self.committed: dict[tuple[str, str, int], int] = {}
        self.max: dict[tuple[str, int], int] = {}

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.committed.get((group, topic, queue_id))

    def max_offset(self, topic: str, queue_id: int) -> int | None:
        return self.max.get((topic, queue_id))


@pytest.fixture(params=DATABASES_AND_DRIVERS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Every database, and PostgreSQL through psycopg 3 as well as psycopg2."""
    return database_url(request.param, tmp_path)


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    with engine_for(db_url) as eng:
        yield eng


@pytest.fixture
def tables(engine: sa.Engine, table_prefix: str) -> Iterator[OutboxTables]:
    with outbox_tables(engine, table_prefix, "sent") as t:
        yield t


@pytest.fixture
def sender(engine: sa.Engine, table_prefix: str, tables: OutboxTables) -> RecordingSender:
    return RecordingSender(engine, table_prefix)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def offsets() -> Offsets:
    return Offsets()
