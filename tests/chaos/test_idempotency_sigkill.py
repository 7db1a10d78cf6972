"""A consumer killed with SIGKILL inside its handler: exactly one successful processing.

The child process takes the lease, writes its business row in the guard's transaction and
is killed before committing. The redelivered message is refused while the dead worker's
lease lives (RECONSUME_LATER, never a silent ack), then processed once the lease expires;
every later delivery is a duplicate.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

from idempotency import GuardConfig, IdempotencyGuard
from outbox import OutboxTables
from reliable import ConsumeResult, ReceivedMessage

ROOT = Path(__file__).resolve().parents[2]
GROUP = "inventory"
LEASE = timedelta(seconds=1)


def _business(prefix: str) -> tuple[sa.MetaData, sa.Table]:
    md = sa.MetaData()
    return md, sa.Table(
        f"{prefix}reserved",
        md,
        sa.Column("run", sa.String(64), primary_key=True),
        sa.Column("message_id", sa.String(64), nullable=False),
    )


def _guard(db_url: str, prefix: str, key_prefix: str) -> IdempotencyGuard:
    engine = sa.create_engine(db_url)
    return IdempotencyGuard(
        engine,
        OutboxTables(prefix=prefix),
        redis.Redis(),
        config=GuardConfig(key_prefix=key_prefix, lease=LEASE, allow_short_window=True),
    )


def _message(mid: str) -> ReceivedMessage:
    return ReceivedMessage(
        message_id=mid, topic="OrderCreated", body=b'{"sku": "A1"}', queue_id=1, queue_offset=42
    )


def _reserve(table: sa.Table, mid: str, marker: Path | None):  # type: ignore[no-untyped-def]
    def invoke(*, session) -> None:  # type: ignore[no-untyped-def]
        session.execute(sa.insert(table).values(run=uuid.uuid4().hex, message_id=mid))
        session.flush()
        if marker is not None:
            marker.write_text(str(os.getpid()))
            time.sleep(120)  # killed here, inside the handler, before the commit

    return invoke


def _child(db_url: str, prefix: str, key_prefix: str, mid: str, marker: str) -> None:
    guard = _guard(db_url, prefix, key_prefix)
    _, table = _business(prefix)
    guard.process(_message(mid), GROUP, _reserve(table, mid, Path(marker)))


@pytest.mark.chaos
@pytest.mark.redis
@pytest.mark.parametrize(
    "db_url",
    [
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ],
    indirect=True,
)
def test_sigkill_inside_the_handler_leads_to_exactly_one_processing(
    db_url: str, table_prefix: str, tmp_path: Path
) -> None:
    engine = sa.create_engine(db_url)
    tables = OutboxTables(prefix=table_prefix)
    tables.create_all(engine)
    md, table = _business(table_prefix)
    md.create_all(engine)
    key_prefix = f"chaos:{uuid.uuid4().hex[:12]}:"
    mid = uuid.uuid4().hex.upper()
    marker = tmp_path / "inside"
    try:
        child = subprocess.Popen(
            [sys.executable, __file__, db_url, table_prefix, key_prefix, mid, str(marker)],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None, "the consumer exited before reaching the handler"
            assert time.monotonic() < deadline, "the consumer never reached the handler"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL

        guard = _guard(db_url, table_prefix, key_prefix)
        results = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # redelivery until the dead worker's lease ends
            result = guard.process(_message(mid), GROUP, _reserve(table, mid, None))
            results.append(result)
            if result is ConsumeResult.SUCCESS:
                break
            time.sleep(0.05)
        assert results[-1] is ConsumeResult.SUCCESS
        assert results[0] is ConsumeResult.RECONSUME_LATER  # the lease was still alive
        for _ in range(3):  # later redeliveries are duplicates
            assert (
                guard.process(_message(mid), GROUP, _reserve(table, mid, None))
                is ConsumeResult.SUCCESS
            )
        with engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 1
            assert (
                conn.execute(sa.select(sa.func.count()).select_from(tables.confirmation)).scalar()
                == 1
            )
            assert (
                conn.execute(
                    sa.select(sa.func.count()).select_from(tables.consumption_log)
                ).scalar()
                == 0
            )
        guard.engine.dispose()
    finally:
        md.drop_all(engine)
        tables.drop_all(engine)
        engine.dispose()


if __name__ == "__main__":
    _child(*sys.argv[1:6])
