"""Fixtures for the idempotency suites: real databases, the real Redis, a private Redis."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from redis.backoff import NoBackoff
from redis.retry import Retry

from outbox import OutboxTables
from protocol.ports import free_port
from tests.conftest import DATABASES_AND_DRIVERS, database_url
from tests.integration.dbkit import engine_for, mark_databases, outbox_tables


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_databases(items, "integration/idempotency", pytest.mark.redis)


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
    with outbox_tables(engine, table_prefix, "orders") as t:
        yield t


@pytest.fixture
def business(engine: sa.Engine, table_prefix: str, tables: OutboxTables) -> sa.Table:
    """The handler's own table: one row per run of the handler (unique per worker run)."""
    md = sa.MetaData()
    t = sa.Table(
        f"{table_prefix}orders",
        md,
        sa.Column("run", sa.String(64), primary_key=True),
        sa.Column("message_id", sa.String(64), nullable=False),
    )
    md.create_all(engine)
    return t


@pytest.fixture
def key_prefix() -> str:
    return f"test:{uuid.uuid4().hex[:12]}:"


class PrivateRedis:
    """A real redis-server of our own, so a test may flush or stop it."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                "/usr/bin/redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # fail fast when the server is gone (redis-py retries with backoff by default)
        self.client = redis.Redis(
            port=self.port, socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    yield server
    server.client.close()
    server.stop()
