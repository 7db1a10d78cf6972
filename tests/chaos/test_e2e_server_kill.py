"""SIGKILL the broker server (`reliable broker start --flush sync`, a separate process)
repeatedly while the order service keeps publishing through the outbox over the gRPC
transport. Every send the server acknowledged is consumed after the restarts, before any
resend; sends that failed while it was down keep their stubs and the resend worker
delivers them; an idempotent handler applies each message's effect exactly once.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import tenacity
from sqlalchemy.orm import Session

from tests.chaos import e2e_app
from tests.chaos.e2e_app import GROUP, TOPIC
from tests.chaos.test_e2e_broker_kill import wait_for
from tests.e2e.grpc.server_process import ServerProcess

SERVER = (
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


class OrderService:
    """Threads publishing through the outbox; records every acknowledged send."""

    def __init__(self, engine: sa.Engine, tables: Any, producer: Any, threads: int) -> None:
        from outbox import Outbox, OutboxConfig

        self.engine, self.producer = engine, producer
        self.acked: list[str] = []
        self.failed = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.outbox = Outbox(
            tables,
            self,
            config=OutboxConfig(resend_after=timedelta(hours=1), retry_after_failure=timedelta(0)),
        )
        self.threads = [
            threading.Thread(target=self._loop, args=(t,), daemon=True) for t in range(threads)
        ]

    def send(self, message: Any) -> Any:  # the outbox's Sender
        try:
            receipt = self.producer.send(message)
        except Exception:
            with self.lock:
                self.failed += 1
            time.sleep(0.05)  # the server is down: the stub waits for the resend worker
            raise
        with self.lock:
            self.acked.append(receipt.message_id)
        return receipt

    def _loop(self, t: int) -> None:
        from reliable import Message

        i = 0
        while not self.stop.is_set():
            with Session(self.engine) as session, session.begin():
                self.outbox.publish(session, Message(TOPIC, f"{t}-{i}".encode(), keys=[f"{t}-{i}"]))
            i += 1

    def start(self) -> None:
        for th in self.threads:
            th.start()

    def finish(self) -> None:
        self.stop.set()
        for th in self.threads:
            th.join(60)


@pytest.mark.chaos
@pytest.mark.redis
@pytest.mark.slow
def test_server_sigkill_under_sync_flush_every_acknowledged_send_is_consumed_once(
    tmp_path: Path, seed: int, request: pytest.FixtureRequest
) -> None:
    import redis

    from idempotency import GuardConfig, IdempotencyGuard
    from outbox import ResendPolicy, ResendWorker
    from outbox.adapters import TransportOffsets
    from reliable import Producer, connect
    from tests.conftest import REDIS_URL

    rng = random.Random(seed)
    kills = 8 if request.config.getoption("--soak") else 3
    home = tmp_path / "home"
    home.mkdir()
    server = ServerProcess(tmp_path / "store", home, *SERVER).start()
    db, prefix = f"sqlite:///{tmp_path / 'app.db'}", "s_"
    engine = e2e_app.engine_for(db)
    e2e_app.create_schema(engine, prefix)
    tables, _, effects = e2e_app.tables(prefix)
    transport = connect("grpc", endpoint=server.endpoint)
    transport.start()
    producer = Producer(transport, retry_times_when_send_failed=1, flow_control_retries=0).start()
    service = OrderService(engine, tables, producer, threads=2)
    client = redis.Redis.from_url(REDIS_URL)
    consumers: list[Any] = []
    try:
        service.start()
        for _ in range(kills):
            target = len(service.acked) + rng.randint(30, 120)
            assert wait_for(lambda n=target: len(service.acked) >= n, 60), (
                f"seed {seed}: sends never acknowledged again after a restart"
            )
            time.sleep(rng.uniform(0, 0.1))
            server.kill()
            time.sleep(rng.uniform(0.2, 1.0))  # sends fail meanwhile: stubs kept
            server = ServerProcess(tmp_path / "store", home, *SERVER, port=server.port).start()
        target = len(service.acked) + 20
        assert wait_for(lambda: len(service.acked) >= target, 60)
        service.finish()
        acked = list(service.acked)

        guard = IdempotencyGuard(
            engine, tables, client, config=GuardConfig(key_prefix=f"chaos:{uuid.uuid4().hex[:8]}:")
        )
        reserve = e2e_app.effect_handler(
            guard, effects, "c", invisible_ms=3_000, receive_long_poll_ms=1_000
        )
        consumers = [reserve.consumer(transport, client_id=f"c{n}") for n in (1, 2)]
        for c in consumers:
            c.start()
        conf = tables.confirmation

        def confirmed() -> set[str]:
            with engine.connect() as conn:
                return set(
                    conn.execute(
                        sa.select(conf.c.message_id).where(conf.c.consumer_group == GROUP)
                    ).scalars()
                )

        # no resend worker yet: the server alone must deliver every acknowledged send
        assert wait_for(lambda: set(acked) <= confirmed(), 90), (
            f"seed {seed}: {len(set(acked) - confirmed())} of {len(acked)} acknowledged "
            "sends never consumed"
        )
        with engine.connect() as conn:
            stubs = set(conn.execute(sa.select(tables.stub.c.message_id)).scalars())
        offsets = TransportOffsets(transport)
        worker = ResendWorker(
            engine,
            tables,
            producer,
            offsets=offsets,
            bounds=offsets,
            policy=ResendPolicy(
                backoff=tenacity.wait_fixed(1),
                recheck_after=timedelta(milliseconds=300),
                error_backoff=tenacity.wait_fixed(0.5),
            ),
        )
        stop = threading.Event()
        thread = threading.Thread(
            target=worker.run, args=(stop,), kwargs={"interval": 0.2}, daemon=True
        )
        thread.start()
        try:
            assert wait_for(lambda: stubs <= confirmed(), 90), (
                f"seed {seed}: never delivered: {sorted(stubs - confirmed())[:10]}"
            )
        finally:
            stop.set()
            thread.join(30)
        with engine.connect() as conn:
            doubled = conn.execute(
                sa.select(effects.c.message_id)
                .group_by(effects.c.message_id)
                .having(sa.func.count() > 1)
            ).all()
        assert doubled == [], f"seed {seed}: effects applied twice: {doubled[:5]}"
        print(
            f"observed (seed {seed}): server kills {kills}, acknowledged {len(acked)}, "
            f"failed sends {service.failed}, stubs {len(stubs)}, resent "
            f"{worker.metrics.resent}; each effect once"
        )
    finally:
        service.finish()
        for c in consumers:
            c.shutdown()
        producer.shutdown()
        transport.close()
        client.close()
        engine.dispose()
        server.kill()
