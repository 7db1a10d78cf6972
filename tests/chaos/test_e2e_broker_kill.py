"""SIGKILL the process hosting the broker while its order service publishes through the
outbox; then consume with idempotent handlers and account for every message.

- SYNC_FLUSH: every send the broker acknowledged is consumed after the restarts, without
  any resend, and no message's effect is applied twice.
- ASYNC_FLUSH: a SIGKILL alone keeps the page cache, so the test also drops the unflushed
  tail of the commitlog after a kill (what a power cut does to data acknowledged after the
  page cache): acknowledged messages are really lost. Reconciliation must report each of
  them as lost (the stubs are the source of truth): those whose offsets later messages took
  again by the group's committed offset, those at or beyond their queue's new end by the
  broker's queue bounds, with no further traffic needed. The resend worker must send them
  again, and a second reconciliation must be clean.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import tenacity

from broker.store.checkpoint import StoreCheckpoint
from tests.chaos import e2e_app
from tests.chaos.e2e_app import GROUP, STORE_SIZES, TOPIC

REPO = Path(__file__).resolve().parents[2]
# no shuffle.partitions: the job sizes them from the data, and a setting made here would
# stay in this test process's JVM for every later Spark session of the suite
SPARK = {
    "spark.ui.showConsoleProgress": "false",
    "spark.ui.enabled": "false",
}


def wait_for(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True


class App:
    """One run of the publishing application process (broker + order service)."""

    def __init__(self, store: Path, db: str, prefix: str, flush: str, run: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, e2e_app.__file__, "publish", str(store), db, prefix, flush, run, "2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        self.acked: list[str] = []
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("ACK "):
                self.acked.append(line[4:].strip())
            elif line.startswith("READY"):
                self.ready.set()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(30)
        self.reader.join(30)  # every ACK line written before the kill is read

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read()[-3000:]


def drop_unflushed_tail(store: Path, rng: random.Random) -> int:
    """Zero up to the last few KiB written to the commitlog, as a power cut loses what was
    acknowledged after the page cache but not yet flushed: never below the offset the
    checkpoint records as flushed (a power cut cannot lose what was fsynced, and on a busy
    machine the async flush may have reached the end). Returns the bytes dropped."""
    flushed = StoreCheckpoint.open(store / "checkpoint").physic_flushed_offset
    files = sorted((store / "commitlog").iterdir())
    for path in reversed(files):
        data = path.read_bytes()
        end = len(data.rstrip(b"\0"))
        if end == 0:
            continue
        cut = max(0, end - rng.randint(3_000, 12_000), flushed - int(path.name))
        if cut >= end:
            return 0
        with open(path, "r+b") as fh:
            fh.seek(cut)
            fh.write(b"\0" * (end - cut))
            fh.flush()
            os.fsync(fh.fileno())
        return end - cut
    return 0


def chaos_phase(
    store: Path,
    db: str,
    prefix: str,
    flush: str,
    rng: random.Random,
    kills: int,
    sends_per_run: tuple[int, int],
    drop_tail: bool,
    seed: int,
) -> tuple[list[str], int]:
    """Run the app, SIGKILL it after a random number of acknowledged sends, restart; the
    last run ends with SIGKILL too. Returns the acknowledged ids and bytes dropped."""
    acked: list[str] = []
    dropped = 0
    for run in range(kills):
        app = App(store, db, prefix, flush, f"r{run}")
        target = rng.randint(*sends_per_run)
        ok = wait_for(lambda a=app, n=target: len(a.acked) >= n or a.proc.poll() is not None, 90)
        if app.proc.poll() is not None or not ok:
            app.kill()
            pytest.fail(f"publisher run {run} stopped early (seed {seed}):\n{app.stderr()}")
        time.sleep(rng.uniform(0, 0.2))  # kill at a random point of a send
        app.kill()
        acked.extend(app.acked)
        if drop_tail:
            dropped += drop_unflushed_tail(store, rng)
    return acked, dropped


class Consumers:
    """Two idempotent consumers of one group over the embedded broker, plus the tables."""

    def __init__(self, store: Path, db: str, prefix: str, flush: str, redis_url: str) -> None:
        import redis

        from broker.store.config import FlushMode
        from idempotency import GuardConfig, IdempotencyGuard
        from reliable import connect

        self.tables, _, self.effects = e2e_app.tables(prefix)
        self.engine = e2e_app.engine_for(db)
        mode = FlushMode.SYNC_FLUSH if flush == "sync" else FlushMode.ASYNC_FLUSH
        self.transport = connect(
            "embedded",
            store_dir=store,
            flush_mode=mode,
            delay_levels="100ms 100ms 100ms 200ms 200ms 200ms 300ms",
            **STORE_SIZES,
        )
        self.transport.start()
        self.redis = redis.Redis.from_url(redis_url)
        guard = IdempotencyGuard(
            self.engine,
            self.tables,
            self.redis,
            config=GuardConfig(key_prefix=f"chaos:{uuid.uuid4().hex[:8]}:"),
        )
        handlers = [e2e_app.effect_handler(guard, self.effects, f"c{n}") for n in (1, 2)]
        # one handler declaration, two consumers of one group (two workers of a service)
        self.consumers = [handlers[0].consumer(self.transport, client_id=f"c{n}") for n in (1, 2)]
        for c in self.consumers:
            c.start()

    def confirmed(self) -> set[str]:
        c = self.tables.confirmation
        with self.engine.connect() as conn:
            return set(
                conn.execute(sa.select(c.c.message_id).where(c.c.consumer_group == GROUP)).scalars()
            )

    def stub_ids(self) -> set[str]:
        with self.engine.connect() as conn:
            return set(conn.execute(sa.select(self.tables.stub.c.message_id)).scalars())

    def doubled(self) -> dict[str, int]:
        e = self.effects
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(e.c.message_id, sa.func.count())
                .group_by(e.c.message_id)
                .having(sa.func.count() > 1)
            ).all()
        return {r[0]: r[1] for r in rows}

    def resend_worker(self) -> Any:
        from outbox import ResendPolicy, ResendWorker
        from outbox.adapters import TransportOffsets
        from reliable import Producer

        offsets = TransportOffsets(self.transport)
        self.producer = Producer(self.transport).start()
        return ResendWorker(
            self.engine,
            self.tables,
            self.producer,
            offsets=offsets,
            bounds=offsets,
            policy=ResendPolicy(
                backoff=tenacity.wait_fixed(1),
                recheck_after=timedelta(milliseconds=200),
                error_backoff=tenacity.wait_fixed(0.5),
            ),
        )

    def close(self) -> None:
        for c in self.consumers:
            c.shutdown()
        producer = getattr(self, "producer", None)
        if producer is not None:
            producer.shutdown()
        self.transport.close()
        self.redis.close()
        self.engine.dispose()


def _rounds(request: pytest.FixtureRequest, normal: int, soak: int) -> int:
    return soak if request.config.getoption("--soak") else normal


def _resend_until_confirmed(
    consumers: Consumers, stubs: set[str], timeout_s: float, what: str
) -> Any:
    """Run a resend worker in a thread until every stub in `stubs` is confirmed."""
    stop = threading.Event()
    worker = consumers.resend_worker()
    thread = threading.Thread(
        target=worker.run, args=(stop,), kwargs={"interval": 0.2}, daemon=True
    )
    thread.start()
    try:
        assert wait_for(lambda: stubs <= consumers.confirmed(), timeout_s), (
            f"{what}: {sorted(stubs - consumers.confirmed())}"
        )
    finally:
        stop.set()
        thread.join(30)
    return worker


@pytest.mark.chaos
@pytest.mark.redis
@pytest.mark.slow
def test_sigkill_under_sync_flush_every_acknowledged_send_is_consumed_once(
    tmp_path: Path, seed: int, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(seed)
    store, db, prefix = tmp_path / "store", f"sqlite:///{tmp_path / 'app.db'}", "k_"
    engine = e2e_app.engine_for(db)
    e2e_app.create_schema(engine, prefix)
    engine.dispose()
    kills = _rounds(request, 3, 12)
    acked, _ = chaos_phase(store, db, prefix, "sync", rng, kills, (40, 160), False, seed)
    assert len(acked) >= 40 * kills

    from tests.conftest import REDIS_URL

    consumers = Consumers(store, db, prefix, "sync", REDIS_URL)
    try:
        # no resend worker yet: the broker alone must deliver every acknowledged send
        assert wait_for(lambda: set(acked) <= consumers.confirmed(), 90), (
            f"seed {seed}: {len(set(acked) - consumers.confirmed())} of {len(acked)} "
            "acknowledged messages never consumed"
        )
        # sends cut by a kill were not acknowledged; their stubs wait for the resend worker
        stubs = consumers.stub_ids()
        worker = _resend_until_confirmed(
            consumers, stubs, 60, f"seed {seed}: stubs never confirmed"
        )
        assert consumers.doubled() == {}, f"seed {seed}: effects applied twice"
        print(
            f"observed (seed {seed}): kills {kills}, acknowledged {len(acked)}, stubs "
            f"{len(stubs)}, resent after the kills {worker.metrics.resent}"
        )
    finally:
        consumers.close()


@pytest.mark.chaos
@pytest.mark.redis
@pytest.mark.spark
@pytest.mark.slow
def test_async_flush_loss_is_found_by_reconciliation_and_recovered_by_resends(
    tmp_path: Path, seed: int, request: pytest.FixtureRequest
) -> None:
    from outbox.reconcile import ReconcileOptions, reconcile
    from tests.conftest import REDIS_URL

    rng = random.Random(seed)
    store, db, prefix = tmp_path / "store", f"sqlite:///{tmp_path / 'app.db'}", "a_"
    engine = e2e_app.engine_for(db)
    e2e_app.create_schema(engine, prefix)
    engine.dispose()
    kills = _rounds(request, 3, 10)
    acked, dropped_bytes = chaos_phase(
        store, db, prefix, "async", rng, kills, (60, 160), True, seed
    )

    consumers = Consumers(store, db, prefix, "async", REDIS_URL)
    try:
        # consume what survived (no resends yet): the drained queues, then what is missing
        assert wait_for(lambda: _drained(consumers), 60), f"seed {seed}: never drained"
        lost = set(acked) - consumers.confirmed()
        assert lost, (
            f"seed {seed}: dropping {dropped_bytes} bytes lost no acknowledged "
            "message; the test proves nothing"
        )
        offsets_file = store / "config" / "consumerOffset.json"
        consumers.transport.broker.persist_offsets()  # type: ignore[attr-defined]
        # the queues' ends now (lost copies at or beyond an end are no longer held): with
        # them a lost tail is found without waiting for later messages to pass it
        first = reconcile(
            ReconcileOptions(
                db_url=db,
                table_prefix=prefix,
                offsets=str(offsets_file),
                grace=timedelta(0),
                queue_bounds=consumers.transport,
                report_table=f"{prefix}report",
                repair=True,
                spark_conf=SPARK,
            )
        )
        with consumers.engine.connect() as conn:
            flagged = set(
                conn.execute(
                    sa.text(
                        f"select message_id from {prefix}report where kind = 'stub' "
                        "and class = 'LOST'"
                    )
                ).scalars()
            )
            beyond_end = conn.execute(
                sa.text(
                    f"select count(*) from {prefix}report where kind = 'stub' "
                    "and class = 'LOST' and reason like 'no longer held%'"
                )
            ).scalar_one()
        assert lost <= flagged, f"seed {seed}: reconciliation missed {sorted(lost - flagged)}"
        assert first.summary.certificate.unaccounted == len(flagged) > 0
        # the repair marked them due at once (their stubs said "sent, look again in an hour")
        assert first.repair is not None
        rep = first.repair
        assert rep.marked_due + rep.already_due + rep.skipped == len(flagged)

        stubs = consumers.stub_ids()
        worker = _resend_until_confirmed(consumers, stubs, 90, f"seed {seed}: never recovered")
        assert worker.metrics.resent >= len(lost)
        assert consumers.doubled() == {}, f"seed {seed}: effects applied twice"
        consumers.transport.broker.persist_offsets()  # type: ignore[attr-defined]
        second = reconcile(
            ReconcileOptions(
                db_url=db,
                table_prefix=prefix,
                offsets=str(offsets_file),
                grace=timedelta(0),
                queue_bounds=consumers.transport,
                spark_conf=SPARK,
            )
        )
        cert = second.summary.certificate
        assert cert.clean and cert.produced == cert.confirmed == len(stubs), cert
        print(
            f"observed (seed {seed}): kills {kills}, acknowledged {len(acked)}, "
            f"tail dropped {dropped_bytes} B, acknowledged then lost {len(lost)}, "
            f"reported lost {len(flagged)} ({beyond_end} beyond their queue's end), "
            f"resent {worker.metrics.resent}, stubs {len(stubs)} all confirmed once"
        )
    finally:
        consumers.close()


def _drained(consumers: Consumers) -> bool:
    broker = consumers.transport.broker  # type: ignore[attr-defined]
    for queue in range(8):
        try:
            end = broker.max_offset(TOPIC, queue)
        except Exception:
            continue
        if end > 0 and broker.query_offset(GROUP, TOPIC, queue) < end:
            return False
    return True
