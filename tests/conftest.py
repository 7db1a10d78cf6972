"""Shared fixtures: the real services the suite runs against.

A service that is down fails the tests that need it (never a skip): `make test` starts
PostgreSQL, MariaDB and Redis before the run.
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import protocol  # noqa: F401  (gRPC's fork handlers off before a test module loads grpc)

REDIS_URL = os.environ.get("RELIABLE_TEST_REDIS", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get(
    "RELIABLE_TEST_POSTGRES", "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
)
MARIADB_URL = os.environ.get("RELIABLE_TEST_MARIADB", "mysql+pymysql://root@127.0.0.1:3306/test")
# the same server through psycopg 3 (`postgresql+psycopg://`, what SQLAlchemy 2.1 picks for
# a plain postgresql:// URL): the outbox and guard suites run on both drivers
POSTGRES_PSYCOPG3_URL = os.environ.get(
    "RELIABLE_TEST_POSTGRES_PSYCOPG3",
    "postgresql+psycopg://" + POSTGRES_URL.split("://", 1)[1],
)
# the databases of the contract suites; the outbox and guard suites add psycopg 3
DATABASES = ["sqlite", "postgres", "mariadb"]
DATABASES_AND_DRIVERS = ["sqlite", "postgres", "psycopg3", "mariadb"]


def _share_caches() -> None:
    """Name the user's caches in the environment before any test gives a child process a
    HOME of its own (the official Python client logs under $HOME, so the tests that run it
    give it a temporary one, and its servers and gateways inherit that): found under a
    fresh HOME, `reliable gateway start` built the gateway again from nothing, Go's
    build cache and all (about 40 s of CPU and of the test's set-up, twice a run), and a
    small `reliable reconcile` ran without its class archive and wrote a new one."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    gopath = os.environ.get("GOPATH", "").split(os.pathsep)[0] or str(Path.home() / "go")
    os.environ.setdefault("RELIABLE_CACHE_DIR", str(cache / "reliable"))
    os.environ.setdefault("RELIABLE_RECONCILE_CDS_DIR", str(cache / "reliable" / "reconcile-cds"))
    os.environ.setdefault("GOCACHE", str(cache / "go-build"))
    os.environ.setdefault("GOMODCACHE", str(Path(gopath) / "pkg" / "mod"))


_share_caches()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak", action="store_true", default=False, help="run chaos tests for longer (make soak)"
    )
    parser.addoption(
        "--seed", type=int, default=None, help="seed for randomised tests (printed on failure)"
    )


# Units of work under pytest-xdist (pyproject's addopts: `-n auto --dist loadfile`): a
# test module runs whole on one worker, so its module-scoped server, browser or Spark
# session starts once. The directories here are one unit each: the reconciliation suites
# run one after another on one worker, in one Spark session, and two of their Spark jobs
# never compete for the same two cores; the Apache RocketMQ interop tests share one cluster
# (two JVMs) on one worker.
SHARED_UNITS = ("tests/integration/reconcile/", "tests/interop/rocketmq/")

# The longest units, longest first (measured on a 2-core machine: the order is what
# matters, not the figures). They are handed out first, so that the run does not end with
# one worker busy on one of them while the others idle.
LONGEST_FIRST: list[str] = [
    "tests/integration/reconcile",
    "tests/interop/rocketmq",  # a cluster, the Java differential, retries and Spark: 5+ min
    "tests/interop/test_official_clients.py",
    "tests/e2e/test_demo.py",
    "tests/unit/test_bench.py",
    "tests/e2e/grpc/test_admin_ops.py",
    "tests/e2e/grpc/test_outbox_served.py",
    "tests/chaos/test_production_topology_kills.py",
    "tests/e2e/grpc/test_production_topology.py",
    "tests/chaos/test_e2e_broker_kill.py",
    "tests/e2e/grpc/test_admin_messages.py",
    "tests/e2e/console/test_console_database.py",
    "tests/unit/store/test_index.py",
    "tests/e2e/grpc/test_store_corruption.py",
    "tests/e2e/grpc/test_served_promises.py",
    "tests/integration/outbox/test_concurrent_workers.py",
    "tests/e2e/console/test_console_browser.py",
    "tests/e2e/grpc/test_demo_ladder.py",
]


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its directory in SHARED_UNITS, else its module."""
    module = nodeid.split("::", 1)[0]
    for directory in SHARED_UNITS:
        if module.startswith(directory):
            return directory.rstrip("/")
    return module


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject's addopts): two workers per logical CPU (4 on 2). Much of the
    suite's time is spent waiting (servers starting, processes killed and restarted,
    redelivery and lease timeouts, JVMs): with one worker per CPU the CPUs idled 43% of a
    run on a 2-CPU machine. Fresh-clone suites ran in 14:01-14:24 with four against
    15:14-16:10 with three. Four were taken back once, after the official Python client
    stalled in the quick bench in one run of three; gRPC's fork handlers, which killed
    children forked beside a busy channel and restarted the parent's event engine under
    its calls, are off since (`protocol/__init__.py`); the stall has not come back."""
    cpus = max(1, len(os.sched_getaffinity(0)))
    return 2 * cpus


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, with SHARED_UNITS as units; other `--dist` modes stand as given."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return UnitScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The units are handed out in collection order (`--no-loadscope-reorder`): in each
    worker (each collects the tests itself, and all order alike) the longest go first.
    Under `-n0` the order is left alone."""
    if not hasattr(config, "workerinput"):
        return
    rank = {unit: n for n, unit in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(unit_of(item.nodeid), len(rank)))


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


def database_url(name: str, tmp_path) -> str:  # type: ignore[no-untyped-def]
    """The URL of one of DATABASES_AND_DRIVERS; fails the test when its server is down."""
    if name == "sqlite":
        return f"sqlite:///{tmp_path / 'test.db'}"
    url = {"postgres": POSTGRES_URL, "psycopg3": POSTGRES_PSYCOPG3_URL}.get(name, MARIADB_URL)
    _engine(url).dispose()
    return url


@pytest.fixture(params=DATABASES)
def db_url(request: pytest.FixtureRequest, tmp_path) -> str:  # type: ignore[no-untyped-def]
    """One database URL per backend; the contract suites run on all three."""
    return database_url(request.param, tmp_path)


@pytest.fixture
def table_prefix() -> str:
    """A unique table prefix so tests sharing one server database never collide."""
    return f"t{uuid.uuid4().hex[:10]}_"
