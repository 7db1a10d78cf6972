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
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
import tenacity
from sqlalchemy.orm import Session

from tests.chaos import e2e_app
from tests.chaos.e2e_app import GROUP, TOPIC
from tests.chaos.test_e2e_broker_kill import wait_for

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
    import redis

    from idempotency import GuardConfig, IdempotencyGuard
    from outbox import Outbox, OutboxConfig, ResendPolicy, ResendWorker
    from outbox.adapters import TransportOffsets
    from reliable import Message, Producer, SendFailed, connect
    from tests.conftest import REDIS_URL

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
        guard = IdempotencyGuard(
            engine, tables, client, config=GuardConfig(key_prefix=f"chaos:{uuid.uuid4().hex[:8]}:")
        )
        reserve = e2e_app.effect_handler(guard, effects, "c")
        consumers = [reserve.consumer(transport, client_id=f"c{n}") for n in (1, 2)]
        for c in consumers:
            c.start()
        # DISK_FULL is answered as "system busy": the producer would back off for minutes
        producer = Producer(
            transport, retry_times_when_send_failed=1, flow_control_retries=0
        ).start()
        acked: list[str] = []

        class Recording:
            def send(self, message: Message) -> object:
                receipt = producer.send(message)
                acked.append(receipt.message_id)
                return receipt

        outbox = Outbox(
            tables,
            Recording(),
            config=OutboxConfig(resend_after=timedelta(hours=1), retry_after_failure=timedelta(0)),
        )

        def place(n: int, tag: str) -> None:
            for i in range(n):
                with Session(engine) as session, session.begin():
                    outbox.publish(
                        session, Message(TOPIC, f"{tag}-{i}".encode(), keys=[f"{tag}-{i}"])
                    )

        place(rng.randint(20, 60), "before")
        before = list(acked)
        # fill the filesystem past the refuse watermark (90%)
        filler = disk / "filler"
        usage = shutil.disk_usage(disk)
        with open(filler, "wb") as fh:
            fh.write(b"\xff" * int(usage.total * 0.95 - usage.used))
        assert _used(disk) > 0.9
        assert wait_for(broker.store.is_disk_full, 10), f"seed {seed}: never saw the disk full"

        with pytest.raises(SendFailed) as refused:  # a clear, typed refusal
            producer.send(Message(TOPIC, b"direct"))
        assert "DISK_FULL" in str(refused.value), str(refused.value)
        during = rng.randint(10, 30)
        place(during, "during")
        assert acked == before, f"seed {seed}: a send was acknowledged on a full disk"
        stub = tables.stub
        with engine.connect() as conn:
            kept = conn.execute(
                sa.select(stub.c.message_id, stub.c.last_error).where(
                    stub.c["keys"].like("during-%")
                )
            ).all()
        assert len(kept) == during
        assert all(r.last_error and "DISK_FULL" in r.last_error for r in kept), kept[:3]

        os.remove(filler)  # space is back
        assert wait_for(lambda: not broker.store.is_disk_full(), 10)
        place(rng.randint(5, 20), "after")
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
        c = tables.confirmation
        with engine.connect() as conn:
            stubs = set(conn.execute(sa.select(stub.c.message_id)).scalars())

        def confirmed() -> set[str]:
            with engine.connect() as conn:
                return set(
                    conn.execute(
                        sa.select(c.c.message_id).where(c.c.consumer_group == GROUP)
                    ).scalars()
                )

        try:
            assert wait_for(lambda: stubs <= confirmed(), 60), (
                f"seed {seed}: never delivered: {sorted(stubs - confirmed())}"
            )
        finally:
            stop.set()
            thread.join(30)
        assert set(acked) <= confirmed()
        assert worker.metrics.resent >= during
        with engine.connect() as conn:
            doubled = conn.execute(
                sa.select(effects.c.message_id)
                .group_by(effects.c.message_id)
                .having(sa.func.count() > 1)
            ).all()
            assert doubled == [], f"seed {seed}: effects applied twice"
            assert conn.execute(
                sa.select(sa.func.count()).select_from(effects)
            ).scalar_one() == len(stubs)
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
