"""Disk full: the broker's store sits on a real, small filesystem (a tmpfs mounted for the
test) that a filler file pushes above the refuse watermark. Sends are refused with the
DISK_FULL status, the outbox keeps their stubs, and once space is freed the resend worker
delivers them; every message acknowledged before, during or after is consumed exactly once.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
import tenacity
from sqlalchemy.orm import Session

from idempotency import GuardConfig, IdempotencyGuard
from outbox import Outbox, OutboxConfig, ResendPolicy, ResendWorker
from outbox.adapters import TransportOffsets
from reliable import Message, Producer, SendFailed, connect
from tests.chaos import e2e_app
from tests.chaos.e2e_app import GROUP, TOPIC
from tests.chaos.test_e2e_broker_kill import wait_for
from tests.conftest import REDIS_URL

DISK_MB = 24
SIZES = {
    "mapped_file_size_commitlog": 1 << 20,
    "mapped_file_size_consume_queue": 20 * 5_000,
    "max_hash_slot_num": 5_000,
    "max_index_num": 20_000,
    "clean_resource_interval_ms": 100,
}


def _mount_tmpfs(where: Path) -> None:
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, (
        f"this test mounts a {DISK_MB} MiB tmpfs (needs CAP_SYS_ADMIN): {done.stderr}"
    )


def _used(path: Path) -> float:
    usage = shutil.disk_usage(path)
    return usage.used / usage.total


@pytest.mark.chaos
@pytest.mark.redis
@pytest.mark.slow
def test_disk_full_refuses_writes_and_the_outbox_keeps_the_stubs(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    disk = tmp_path / "disk"
    _mount_tmpfs(disk)
    db, prefix = f"sqlite:///{tmp_path / 'app.db'}", "d_"
    engine = e2e_app.engine_for(db)
    e2e_app.create_schema(engine, prefix)
    tables, _, effects = e2e_app.tables(prefix)
    transport = connect("embedded", store_dir=disk / "store", **SIZES)
    client = redis.Redis.from_url(REDIS_URL)
    consumers = []
    try:
        transport.start()
        broker = transport.broker  # type: ignore[attr-defined]
        consumers = _start_inventory_consumers(engine, tables, effects, client, transport)
        # DISK_FULL is answered as "system busy": the producer would back off for minutes
        producer = Producer(
            transport, retry_times_when_send_failed=1, flow_control_retries=0
        ).start()
        shop = Shop(engine, tables, producer)

        shop.place(rng.randint(20, 60), "before")
        before = list(shop.acked)
        filler = _fill_past_the_refuse_watermark(disk, broker, seed)
        during = _refused_while_full_and_the_stubs_kept(shop, producer, rng, before, seed)

        os.remove(filler)  # space is back
        assert wait_for(lambda: not broker.store.is_disk_full(), 10)
        shop.place(rng.randint(5, 20), "after")
        with _resend_worker_running(engine, tables, transport, producer) as worker:
            with engine.connect() as conn:
                stubs = set(conn.execute(sa.select(tables.stub.c.message_id)).scalars())
            assert wait_for(lambda: stubs <= _confirmed(engine, tables), 60), (
                f"seed {seed}: never delivered: {sorted(stubs - _confirmed(engine, tables))}"
            )
        assert set(shop.acked) <= _confirmed(engine, tables)
        assert worker.metrics.resent >= during
        _assert_each_consumed_once(engine, effects, stubs, seed)
        print(
            f"observed (seed {seed}): acknowledged before {len(before)}, refused on a full "
            f"disk {during} (stubs kept), resent {worker.metrics.resent}, all "
            f"{len(stubs)} consumed once"
        )
        producer.shutdown()
    finally:
        for consumer in consumers:
            consumer.shutdown()
        transport.close()
        client.close()
        engine.dispose()
        subprocess.run(["umount", "-l", str(disk)], check=False)


class Shop:
    """The order service: publishes through the outbox, whose sender records every send the
    broker acknowledged."""

    def __init__(self, engine: sa.Engine, tables: Any, producer: Producer) -> None:
        self.engine, self.tables, self.producer = engine, tables, producer
        self.acked: list[str] = []
        self.outbox = Outbox(
            tables,
            self,
            config=OutboxConfig(resend_after=timedelta(hours=1), retry_after_failure=timedelta(0)),
        )

    def send(self, message: Message) -> object:  # the outbox's Sender
        receipt = self.producer.send(message)
        self.acked.append(receipt.message_id)
        return receipt

    def place(self, n: int, tag: str) -> None:
        for i in range(n):
            with Session(self.engine) as session, session.begin():
                self.outbox.publish(
                    session, Message(TOPIC, f"{tag}-{i}".encode(), keys=[f"{tag}-{i}"])
                )


def _start_inventory_consumers(
    engine: sa.Engine, tables: Any, effects: sa.Table, client: Any, transport: Any
) -> list[Any]:
    """Two inventory consumers behind one idempotency guard, started."""
    guard = IdempotencyGuard(
        engine, tables, client, config=GuardConfig(key_prefix=f"chaos:{uuid.uuid4().hex[:8]}:")
    )
    reserve = e2e_app.effect_handler(guard, effects, "c")
    consumers = [reserve.consumer(transport, client_id=f"c{n}") for n in (1, 2)]
    for c in consumers:
        c.start()
    return consumers


def _fill_past_the_refuse_watermark(disk: Path, broker: Any, seed: int) -> Path:
    """Fill the filesystem past the refuse watermark (90%); the filler file."""
    filler = disk / "filler"
    usage = shutil.disk_usage(disk)
    with open(filler, "wb") as fh:
        fh.write(b"\xff" * int(usage.total * 0.95 - usage.used))
    assert _used(disk) > 0.9
    assert wait_for(broker.store.is_disk_full, 10), f"seed {seed}: never saw the disk full"
    return filler


def _refused_while_full_and_the_stubs_kept(
    shop: Shop, producer: Producer, rng: random.Random, before: list[str], seed: int
) -> int:
    """On the full disk a send is refused, clearly; orders placed meanwhile keep their stubs
    with the refusal in `last_error`. How many were placed."""
    with pytest.raises(SendFailed) as refused:  # a clear, typed refusal
        producer.send(Message(TOPIC, b"direct"))
    assert "DISK_FULL" in str(refused.value), str(refused.value)
    during = rng.randint(10, 30)
    shop.place(during, "during")
    assert shop.acked == before, f"seed {seed}: a send was acknowledged on a full disk"
    stub = shop.tables.stub
    with shop.engine.connect() as conn:
        kept = conn.execute(
            sa.select(stub.c.message_id, stub.c.last_error).where(stub.c["keys"].like("during-%"))
        ).all()
    assert len(kept) == during
    assert all(r.last_error and "DISK_FULL" in r.last_error for r in kept), kept[:3]
    return during


@contextmanager
def _resend_worker_running(
    engine: sa.Engine, tables: Any, transport: Any, producer: Producer
) -> Iterator[ResendWorker]:
    """The resend worker on a thread of its own, stopped on leaving."""
    offsets = TransportOffsets(transport)
    worker = ResendWorker(
        engine,
        tables,
        producer,
        offsets=offsets,
        bounds=offsets,
        policy=ResendPolicy(
            backoff=tenacity.wait_fixed(1),
            recheck_after=timedelta(milliseconds=200),
            error_backoff=tenacity.wait_fixed(0.2),
        ),
    )
    stop = threading.Event()
    thread = threading.Thread(
        target=worker.run, args=(stop,), kwargs={"interval": 0.2}, daemon=True
    )
    thread.start()
    try:
        yield worker
    finally:
        stop.set()
        thread.join(30)


def _confirmed(engine: sa.Engine, tables: Any) -> set[str]:
    """The ids the inventory group confirmed."""
    c = tables.confirmation
    with engine.connect() as conn:
        return set(
            conn.execute(sa.select(c.c.message_id).where(c.c.consumer_group == GROUP)).scalars()
        )


def _assert_each_consumed_once(
    engine: sa.Engine, effects: sa.Table, stubs: set[str], seed: int
) -> None:
    with engine.connect() as conn:
        doubled = conn.execute(
            sa.select(effects.c.message_id)
            .group_by(effects.c.message_id)
            .having(sa.func.count() > 1)
        ).all()
        assert doubled == [], f"seed {seed}: effects applied twice"
        assert conn.execute(sa.select(sa.func.count()).select_from(effects)).scalar_one() == len(
            stubs
        )
