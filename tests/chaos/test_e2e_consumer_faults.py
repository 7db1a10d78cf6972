"""Consumers killed mid-processing, Redis restarted, the database unavailable: nothing lost,
nothing processed twice.

Real processes throughout: the broker server (`reliable broker start`, sync flush) in one
process, two inventory consumer processes over the gRPC transport, a redis-server started
for the test on a spare port, and a PostgreSQL database created for the test. While the
order service publishes through the outbox, a seeded schedule SIGKILLs and restarts
consumer processes, SIGKILLs and restarts redis-server (its keys are gone: the database
decides), and makes the database refuse connections for a few seconds (connections
disallowed and every backend terminated, then allowed again). At the end every stub is
confirmed and each message's effect row exists exactly once.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import tenacity
from sqlalchemy.orm import Session

from protocol.ports import free_port
from tests.chaos import e2e_app
from tests.chaos.e2e_app import GROUP, TOPIC
from tests.chaos.test_e2e_broker_kill import REPO, wait_for
from tests.e2e.grpc.server_process import ServerProcess

SERVER_FAST = (
    "--flush",
    "sync",
    "--min-invisible-ms",
    "1000",
    "--min-long-polling-ms",
    "500",
    "--long-polling-ms",
    "1000",
    "--delay-levels",
    "100ms 200ms 300ms 300ms 500ms 500ms 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s",
)


class RedisServer:
    """A redis-server of our own (never the shared one), killable and restartable."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        assert wait_for(up, 10), "redis-server did not start"
        client.close()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)


class Database:
    """A PostgreSQL database of our own, whose connections can be cut and refused."""

    def __init__(self) -> None:
        from tests.conftest import POSTGRES_URL

        self.name = f"chaos_{uuid.uuid4().hex[:10]}"
        self.admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{self.name}"'))
        self.url = str(
            sa.make_url(POSTGRES_URL).set(database=self.name).render_as_string(hide_password=False)
        )

    def refuse_connections(self) -> int:
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS false'))
            return len(
                conn.execute(
                    sa.text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = :d AND pid <> pg_backend_pid()"
                    ),
                    {"d": self.name},
                ).all()
            )

    def allow_connections(self) -> None:
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true'))

    def drop(self) -> None:
        self.allow_connections()
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        self.admin.dispose()


class ConsumerProcess:
    def __init__(
        self, endpoint: str, db: str, prefix: str, redis_url: str, key_prefix: str, name: str
    ) -> None:
        self.args = [
            sys.executable,
            e2e_app.__file__,
            "consume",
            endpoint,
            db,
            prefix,
            redis_url,
            key_prefix,
            name,
        ]
        self.name = name
        self.proc: subprocess.Popen[str] | None = None
        self.starts = 0

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            self.args,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=REPO,
        )
        self.starts += 1

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def services(tmp_path: Path) -> Iterator[tuple[ServerProcess, RedisServer, Database]]:
    home = tmp_path / "home"
    home.mkdir()
    server = ServerProcess(tmp_path / "store", home, *SERVER_FAST).start()
    redis_server = RedisServer(tmp_path)
    redis_server.start()
    database = Database()
    try:
        yield server, redis_server, database
    finally:
        server.kill()
        redis_server.kill()
        database.drop()


class Publisher(threading.Thread):
    """The order service: publishes through the outbox, retrying an order whose
    transaction failed (it checks whether an ambiguous commit went through)."""

    def __init__(
        self, engine: sa.Engine, tables: Any, producer: Any, total: int, rate: float
    ) -> None:
        super().__init__(daemon=True)
        from outbox import Outbox, OutboxConfig

        self.engine, self.tables, self.total, self.rate = engine, tables, total, rate
        self.outbox = Outbox(
            tables,
            producer,
            config=OutboxConfig(
                resend_after=timedelta(hours=1), retry_after_failure=timedelta(seconds=1)
            ),
        )
        self.published = 0
        self.db_errors = 0

    def run(self) -> None:
        from reliable import Message

        for i in range(self.total):
            message_id = f"order-{i:05d}-{uuid.uuid4().hex[:8]}"
            while True:
                try:
                    with Session(self.engine) as session, session.begin():
                        self.outbox.publish(
                            session,
                            Message(
                                TOPIC,
                                f"order {i}".encode(),
                                keys=[f"order-{i}"],
                                message_id=message_id,
                            ),
                        )
                    break
                except sa.exc.DBAPIError:
                    self.db_errors += 1
                    time.sleep(0.2)
                    if self._committed(message_id):
                        break
            self.published += 1
            time.sleep(1 / self.rate)

    def _committed(self, message_id: str) -> bool:
        try:
            with self.engine.connect() as conn:
                return (
                    conn.execute(
                        sa.select(self.tables.stub.c.id).where(
                            self.tables.stub.c.message_id == message_id
                        )
                    ).first()
                    is not None
                )
        except sa.exc.DBAPIError:
            return False


@pytest.mark.chaos
@pytest.mark.redis
@pytest.mark.postgres
@pytest.mark.slow
def test_consumer_kills_redis_restart_and_database_outage_lose_and_double_nothing(
    services: tuple[ServerProcess, RedisServer, Database], seed: int, request: pytest.FixtureRequest
) -> None:
    from outbox import ResendPolicy, ResendWorker
    from reliable import Producer, connect

    server, redis_server, database = services
    rng = random.Random(seed)
    soak = bool(request.config.getoption("--soak"))
    prefix = "c_"
    engine = sa.create_engine(database.url, pool_pre_ping=True)
    e2e_app.create_schema(engine, prefix)
    tables, _, effects = e2e_app.tables(prefix)
    key_prefix = f"chaos:{uuid.uuid4().hex[:8]}:"
    consumers = [
        ConsumerProcess(
            server.endpoint, database.url, prefix, redis_server.url, key_prefix, f"consumer-{n}"
        )
        for n in (1, 2)
    ]
    transport = connect("grpc", endpoint=server.endpoint)
    transport.start()
    producer = Producer(transport).start()
    total = 900 if soak else 240
    publisher = Publisher(engine, tables, producer, total, rate=40)
    worker = ResendWorker(
        engine,
        tables,
        producer,
        policy=ResendPolicy(
            backoff=tenacity.wait_fixed(2),
            recheck_after=timedelta(seconds=1),
            error_backoff=tenacity.wait_fixed(0.5),
        ),
    )
    stop = threading.Event()
    resend = threading.Thread(
        target=worker.run, args=(stop,), kwargs={"interval": 0.3}, daemon=True
    )
    events: list[str] = []
    try:
        for c in consumers:
            c.start()
        publisher.start()
        resend.start()
        faults = ["kill-consumer", "restart-redis", "database-outage", "kill-consumer"]
        if soak:
            faults = faults * 4
        rng.shuffle(faults)
        for fault in faults:
            time.sleep(rng.uniform(0.5, 1.5))
            if fault == "kill-consumer":
                victim = rng.choice(consumers)
                victim.kill()
                time.sleep(rng.uniform(0.2, 1.0))
                victim.start()
            elif fault == "restart-redis":
                redis_server.kill()
                time.sleep(rng.uniform(0.5, 1.5))
                redis_server.start()
            else:
                cut = database.refuse_connections()
                time.sleep(rng.uniform(2.0, 4.0))
                database.allow_connections()
                fault += f" ({cut} backends terminated)"
            events.append(fault)
        publisher.join(120)
        assert not publisher.is_alive(), f"seed {seed}: the order service never finished"
        stub, conf = tables.stub, tables.confirmation

        def unconfirmed() -> int:
            with engine.connect() as conn:
                return int(
                    conn.execute(
                        sa.select(sa.func.count())
                        .select_from(stub)
                        .where(
                            stub.c.message_id.not_in(
                                sa.select(conf.c.message_id).where(conf.c.consumer_group == GROUP)
                            )
                        )
                    ).scalar_one()
                )

        assert wait_for(lambda: unconfirmed() == 0, 120, 0.5), (
            f"seed {seed}: {unconfirmed()} messages never consumed; events {events}"
        )
        with engine.connect() as conn:
            stubs = conn.execute(sa.select(sa.func.count()).select_from(stub)).scalar_one()
            doubled = conn.execute(
                sa.select(effects.c.message_id, sa.func.count())
                .group_by(effects.c.message_id)
                .having(sa.func.count() > 1)
            ).all()
            applied = conn.execute(
                sa.select(sa.func.count(sa.distinct(effects.c.message_id)))
            ).scalar_one()
        assert stubs == total
        assert doubled == [], f"seed {seed}: effects applied twice: {doubled[:5]}; {events}"
        assert applied == total
        print(
            f"observed (seed {seed}): {total} orders, events {events}, consumer starts "
            f"{[c.starts for c in consumers]}, publisher DB errors {publisher.db_errors}, "
            f"resent {worker.metrics.resent}; every message's effect exactly once"
        )
    finally:
        stop.set()
        resend.join(30)
        for c in consumers:
            c.stop()
        producer.shutdown()
        transport.close()
        engine.dispose()
