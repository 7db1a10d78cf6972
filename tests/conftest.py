"""Shared fixtures: the real services the suite runs against.

A service that is down fails the tests that need it (never a skip): `make test` starts
PostgreSQL, MariaDB and Redis before the run.
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Iterator

import pytest

REDIS_URL = os.environ.get("RELIABLE_TEST_REDIS", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get(
    "RELIABLE_TEST_POSTGRES", "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
)
MARIADB_URL = os.environ.get("RELIABLE_TEST_MARIADB", "mysql+pymysql://root@127.0.0.1:3306/test")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak", action="store_true", default=False, help="run chaos tests for longer (make soak)"
    )
    parser.addoption(
        "--seed", type=int, default=None, help="seed for randomised tests (printed on failure)"
    )


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """A seed for randomised tests; reported in the failure output."""
    value = request.config.getoption("--seed")
    if value is None:
        value = random.SystemRandom().randrange(1 << 31)
    request.node.user_properties.append(("seed", value))
    print(f"seed={value} (re-run with --seed {value})")
    return int(value)


@pytest.fixture
def redis_client() -> Iterator[object]:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    client.ping()  # fails the test when Redis is down
    yield client
    client.close()


def _engine(url: str):  # type: ignore[no-untyped-def]
    import sqlalchemy as sa

    engine = sa.create_engine(url, pool_pre_ping=True)
    with engine.connect() as conn:
        conn.execute(sa.text("select 1"))
    return engine


@pytest.fixture
def sqlite_url(tmp_path) -> str:  # type: ignore[no-untyped-def]
    return f"sqlite:///{tmp_path / 'test.db'}"


@pytest.fixture(params=["sqlite", "postgres", "mariadb"])
def db_url(request: pytest.FixtureRequest, tmp_path) -> str:  # type: ignore[no-untyped-def]
    """One database URL per backend; the contract suites run on all three."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'test.db'}"
    url = POSTGRES_URL if request.param == "postgres" else MARIADB_URL
    _engine(url).dispose()  # fails the test when the server is down
    return url


@pytest.fixture
def table_prefix() -> str:
    """A unique table prefix so tests sharing one server database never collide."""
    return f"t{uuid.uuid4().hex[:10]}_"
