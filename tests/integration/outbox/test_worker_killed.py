"""A resend worker killed (SIGKILL) mid-pass loses nothing: its claims expire and another
worker sends the rest; only the sends it made but never recorded go out a second time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from outbox import Outbox, ResendWorker, utcnow
from reliable import Message

HERE = Path(__file__).parent
ROOT = HERE.parents[2]


@pytest.mark.chaos
def test_killed_worker_leaves_nothing_behind(
    db_url,
    engine,
    tables,
    sender,
    table_prefix,  # type: ignore[no-untyped-def]
    tmp_path,
) -> None:
    sender.fail_all = True
    outbox = Outbox(tables, sender, clock=lambda: datetime(2000, 1, 1))  # long due
    with Session(engine) as session, session.begin():
        ids = [outbox.publish(session, Message(topic="T", body=b"x")) for _ in range(20)]
    sender.fail_all = False
    marker = tmp_path / "stalled"
    env = {
        **os.environ,
        "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}",
        "OUTBOX_TEST_DB": db_url,
        "OUTBOX_TEST_PREFIX": table_prefix,
        "OUTBOX_TEST_STALL_AFTER": "5",
        "OUTBOX_TEST_MARKER": str(marker),
    }
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reliable_cli",
            "worker",
            "resend",
            "--db",
            db_url,
            "--table-prefix",
            table_prefix,
            "--sender",
            "outbox_testkit:stalling_sender_from_env",
            "--batch-size",
            "10",
            "--once",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert child.poll() is None, child.stderr.read() if child.stderr else ""
        assert time.monotonic() < deadline, "the worker never stalled"
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(30)
    if child.stderr:
        child.stderr.close()
    sent_by_dead = sender.counts()
    assert sum(sent_by_dead.values()) == 5
    with engine.connect() as conn:
        claimed = conn.execute(
            sa.select(sa.func.count()).where(tables.stub.c.claimed_by.is_not(None))
        ).scalar()
    assert claimed == 10  # its batch is still claimed: hidden until the claim expires
    survivor = ResendWorker(
        engine, tables, sender, clock=lambda: utcnow() + timedelta(minutes=6)
    )  # past claim_ttl
    while survivor.run_once().selected:
        pass
    counts = sender.counts()
    assert set(counts) == set(ids)  # nothing lost
    assert {m for m, n in counts.items() if n == 2} == set(sent_by_dead)  # at least once
    assert all(n == 1 for m, n in counts.items() if m not in sent_by_dead)
    with engine.connect() as conn:
        assert (
            conn.execute(
                sa.select(sa.func.count()).where(tables.stub.c.claimed_by.is_not(None))
            ).scalar()
            == 0
        )
