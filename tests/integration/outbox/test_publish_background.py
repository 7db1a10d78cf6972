"""`OutboxConfig(send_in_background=True)`: commits return before the send; every committed
message is still sent exactly once and its receipt recorded, and nothing a crash or a full
queue leaves behind is lost (the resend worker sends it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from outbox_testkit import RecordingSender
from sqlalchemy.orm import Session

from outbox import Outbox, OutboxConfig, OutboxTables, ResendWorker
from reliable import Message, SendReceipt

BACKGROUND = OutboxConfig(send_in_background=True)


class PipelinedSender:
    """The recording sender with `send_async`, as `reliable.Producer` has: the outbox's
    background thread sends a batch through it in flight together."""

    def __init__(self, inner: RecordingSender) -> None:
        self.inner = inner
        self.pool = ThreadPoolExecutor(4)
        self.async_sends = 0

    def send(self, message: Message) -> SendReceipt:
        return self.inner.send(message)

    def send_async(self, message: Message) -> Future[SendReceipt]:
        self.async_sends += 1
        return self.pool.submit(self.inner.send, message)


def _stubs(engine: sa.Engine, tables: OutboxTables) -> dict[str, sa.RowMapping]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(tables.stub)).mappings().all()
    return {r["message_id"]: r for r in rows}


def _commit_many(engine: sa.Engine, outbox: Outbox, writers: int, each: int) -> list[str]:
    ids: list[str] = []
    lock = threading.Lock()

    def writer() -> None:
        for _ in range(each):
            with Session(engine) as session, session.begin():
                mid = outbox.publish(session, Message(topic="T", body=b"x"))
            with lock:
                ids.append(mid)

    threads = [threading.Thread(target=writer) for _ in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ids


@pytest.mark.parametrize("pipelined", [True, False], ids=["send_async", "send"])
def test_every_commit_is_sent_once_and_recorded_after_flush(
    engine, tables, sender, clock, pipelined
) -> None:
    chosen = PipelinedSender(sender) if pipelined else sender
    outbox = Outbox(tables, chosen, config=BACKGROUND, clock=clock)
    ids = _commit_many(engine, outbox, writers=4, each=25)
    assert outbox.flush(30)
    assert sender.counts() == dict.fromkeys(ids, 1)
    offsets = {mid: seq for seq, (mid, _) in enumerate(sender.sends(), start=1)}
    stubs = _stubs(engine, tables)
    for mid in ids:
        stub = stubs[mid]
        assert stub["send_count"] == 1 and stub["last_error"] is None
        assert stub["queue_offset"] == offsets[mid]  # each its own receipt, not a neighbour's
        assert stub["broker_msg_id"] == f"{offsets[mid]:032X}"
        assert stub["next_resend_at"] == clock.now + outbox.config.resend_after
    if pipelined:
        assert chosen.async_sends > 0  # batches went out in flight together
    assert outbox.close(10)


def test_a_rollback_sends_nothing_in_the_background(engine, tables, sender) -> None:
    outbox = Outbox(tables, sender, config=BACKGROUND)
    with Session(engine) as session:
        outbox.publish(session, Message(topic="T", body=b"x"))
        session.rollback()
    with outbox.begin(engine) as tx:
        kept = tx.publish(Message(topic="T", body=b"y"))
    assert outbox.flush(10)
    assert sender.counts() == {kept: 1}
    assert set(_stubs(engine, tables)) == {kept}


def test_failures_in_a_batch_are_recorded_beside_the_receipts(
    engine, tables, sender, clock
) -> None:
    """One batch, some sends failing: each stub gets its own outcome (two statements on
    PostgreSQL, one per kind)."""
    gate = threading.Event()
    slow = _Gated(sender, gate)
    outbox = Outbox(tables, PipelinedSender(slow), config=BACKGROUND, clock=clock)
    ids = [_publish(engine, outbox) for _ in range(6)]  # the first is held at the gate
    sender.fail_ids.update(ids[3:])
    gate.set()
    assert outbox.flush(30)
    stubs = _stubs(engine, tables)
    for mid in ids[:3]:
        assert stubs[mid]["queue_offset"] is not None and stubs[mid]["last_error"] is None
    for mid in ids[3:]:
        assert stubs[mid]["queue_offset"] is None
        assert "ConnectionError" in stubs[mid]["last_error"]
        assert stubs[mid]["next_resend_at"] == clock.now + outbox.config.retry_after_failure
    assert all(stubs[mid]["send_count"] == 1 for mid in ids)
    outbox.close(10)


def test_a_full_queue_never_blocks_a_commit_and_leaves_the_rest_to_the_worker(
    engine, tables, sender, clock
) -> None:
    gate = threading.Event()
    config = OutboxConfig(send_in_background=True, background_capacity=2, background_batch=1)
    outbox = Outbox(tables, _Gated(sender, gate), config=config, clock=clock)
    started = time.monotonic()
    ids = [_publish(engine, outbox) for _ in range(5)]  # 2 taken, 3 left behind
    assert time.monotonic() - started < 5  # the held broker never held a commit
    assert outbox.left_to_resend_worker == 3
    gate.set()
    assert outbox.flush(10)
    assert sender.counts() == dict.fromkeys(ids[:2], 1)
    clock.advance(seconds=outbox.config.retry_after_failure.total_seconds() + 1)
    assert ResendWorker(engine, tables, sender, clock=clock).run_once().resent == 3
    assert sender.counts() == dict.fromkeys(ids, 1)
    outbox.close(10)


def test_messages_waiting_when_the_process_is_killed_are_resent(
    engine, tables, sender, clock, tmp_path: Path
) -> None:
    """kill -9 of a process whose background thread holds committed messages it never
    sent: the resend worker sends every one of them, once."""
    n = 20
    ready = tmp_path / "ready"
    script = textwrap.dedent(
        f"""
        import threading, sqlalchemy as sa
        from sqlalchemy.orm import Session
        from outbox import Outbox, OutboxConfig, OutboxTables
        from reliable import Message

        class Stuck:  # a broker that never answers
            def send(self, message):
                threading.Event().wait()

        engine = sa.create_engine({engine.url.render_as_string(hide_password=False)!r})
        tables = OutboxTables(prefix={tables.prefix!r})
        outbox = Outbox(tables, Stuck(), config=OutboxConfig(send_in_background=True))
        for i in range({n}):
            with Session(engine) as session, session.begin():
                outbox.publish(session, Message(topic="T", body=b"x", message_id=f"k-{{i}}"))
        open({str(ready)!r}, "w").close()
        threading.Event().wait()
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, "the publishing process died"
            assert time.monotonic() < deadline, "the publishing process never committed"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    ids = [f"k-{i}" for i in range(n)]
    stubs = _stubs(engine, tables)
    assert sorted(stubs) == sorted(ids)
    assert all(s["send_count"] == 0 for s in stubs.values())  # nothing was sent or recorded
    assert sender.counts() == {}
    clock.now = max(s["next_resend_at"] for s in stubs.values()) + timedelta(seconds=1)
    assert ResendWorker(engine, tables, sender, clock=clock).run_once().resent == n
    assert sender.counts() == dict.fromkeys(ids, 1)


class _Gated:
    """A sender whose sends wait for `gate`: a broker that is slow to answer."""

    def __init__(self, inner: RecordingSender, gate: threading.Event) -> None:
        self.inner = inner
        self.gate = gate

    def send(self, message: Message) -> SendReceipt:
        self.gate.wait(30)
        return self.inner.send(message)


def _publish(engine: sa.Engine, outbox: Outbox) -> str:
    with Session(engine) as session, session.begin():
        return outbox.publish(session, Message(topic="T", body=b"x"))
