"""Two resend workers racing over 10,000 due stubs: each stub is sent exactly once."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from outbox import OutboxTables, ResendPolicy, ResendWorker, StubStatus
from reliable import Message, SendReceipt

N = 10_000
TOPIC = "OrderCreated"


class CountingSender:
    """Counts sends per id across both workers (thread-safe); positions are real numbers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.offset = 0

    def send(self, message: Message) -> SendReceipt:
        with self.lock:
            self.counts[message.message_id] += 1
            self.offset += 1
            return SendReceipt(
                message_id=message.message_id,
                topic=message.topic,
                queue_id=0,
                queue_offset=N + self.offset,
            )


class PassedOffsets:
    def committed_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        return N  # every stub (offsets 0..N-1) has been passed by the group


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["postgres", "mariadb", "sqlite"], indirect=True)
def test_two_workers_send_each_due_stub_exactly_once(
    engine: sa.Engine, tables: OutboxTables
) -> None:
    now = datetime(2026, 1, 1, 12, 0)
    rows = [
        {
            "message_id": f"M{i:031d}",
            "topic": TOPIC,
            "body": b"payload",
            "body_digest": "0" * 64,
            "expected_groups": "inventory",
            "status": StubStatus.UNCONFIRMED.value,
            "send_count": 1,
            "max_sends": 16,
            "queue_id": 0,
            "queue_offset": i,
            "next_resend_at": now - timedelta(seconds=i % 600),
            "created_at": now,
            "updated_at": now,
        }
        for i in range(N)
    ]
    with engine.begin() as conn:
        conn.execute(sa.insert(tables.stub), rows)
    sender = CountingSender()
    start = threading.Barrier(2)
    workers = [
        ResendWorker(
            sa.create_engine(engine.url),
            tables,
            sender,
            offsets=PassedOffsets(),
            clock=lambda: now,
            name=f"w{i}",
            policy=ResendPolicy(batch_size=250),
        )
        for i in range(2)
    ]
    errors: list[BaseException] = []

    def run(worker: ResendWorker) -> None:
        try:
            start.wait()
            while worker.run_once().selected:
                pass
        except BaseException as exc:  # reported below, with the worker's name
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not errors, errors
    assert len(sender.counts) == N
    assert set(sender.counts.values()) == {1}
    assert sum(w.metrics.resent for w in workers) == N
    print("split:", [w.metrics.resent for w in workers])
    with engine.connect() as conn:
        s = tables.stub.c
        assert conn.execute(sa.select(sa.func.count()).where(s.send_count == 2)).scalar() == N
        assert (
            conn.execute(sa.select(sa.func.count()).where(s.claimed_by.is_not(None))).scalar() == 0
        )
    for w in workers:
        w.engine.dispose()
