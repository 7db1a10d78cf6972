"""A broker process killed with SIGKILL (SYNC_FLUSH) keeps its invisible-time state: acked
messages stay acked, leased ones stay hidden until their time ends, then come back with
attempt + 1. Nothing acknowledged to a client before the kill is lost or undone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from broker_kit import T0, ManualClock, broker_config, store_config

from broker.broker import Broker
from broker.errors import InvalidReceiptHandle
from broker.store.config import FlushMode

CHILD = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {kit_dir!r})
    from broker_kit import T0, broker_config, msg, store_config
    from broker.broker import Broker
    from broker.store.config import FlushMode
    from pathlib import Path

    b = Broker(store_config(Path({store!r}), FlushMode.SYNC_FLUSH), broker_config(
        flush_offset_interval_ms=10**9), clock=lambda: T0)
    b.start()
    b.create_topic("t", queues=2)
    b.create_group("g", retry_max_times=5)
    ids = [b.send_message(msg("t", str(i).encode(), queue_id=i % 2)).msg_id
           for i in range(20)]
    b.store.wait_dispatched(10)
    got = b.receive("g", "t", 20, invisible_ms=60_000)
    acked = [e.message.msg_id for e in got[:12]]
    for e in got[:12]:
        b.ack("g", "t", e.receipt_handle)
    print(json.dumps({{"ids": ids, "acked": acked,
                       "open": [[e.message.msg_id, e.receipt_handle] for e in got[12:]]}}),
          flush=True)
    time.sleep(600)
""")


@pytest.mark.chaos
def test_sigkill_keeps_acks_and_leases(tmp_path: Path) -> None:
    store = tmp_path / "store"
    script = CHILD.format(kit_dir=str(Path(__file__).parent), store=str(store))
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).parents[3]),
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        state = json.loads(line)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
    assert len(state["ids"]) == 20 and len(state["acked"]) == 12

    clock = ManualClock(T0)
    b = Broker(store_config(store, FlushMode.SYNC_FLUSH), broker_config(), clock=clock)
    b.start()
    try:
        assert b.receive("g", "t", 20, invisible_ms=1_000) == []  # leases survived
        # one open handle from before the kill still acks
        first_id, first_handle = state["open"][0]
        b.ack("g", "t", first_handle)
        clock.advance(60_000)
        again = b.receive("g", "t", 20, invisible_ms=1_000)
        expected = {mid for mid, _ in state["open"][1:]}
        assert {e.message.msg_id for e in again} == expected  # no acked one comes back
        assert all(e.delivery_attempt == 2 for e in again)
        with pytest.raises(InvalidReceiptHandle):
            b.ack("g", "t", state["open"][1][1])  # superseded by the redelivery
        for e in again:
            b.ack("g", "t", e.receipt_handle)
        assert b.query_offset("g", "t", 0) + b.query_offset("g", "t", 1) == 20
        assert first_id not in {e.message.msg_id for e in again}
    finally:
        b.shutdown()


CHILD_TX = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {kit_dir!r})
    from broker_kit import T0, broker_config, msg, store_config
    from broker.broker import Broker
    from broker.store.config import FlushMode
    from protocol.props import Prop
    from pathlib import Path

    b = Broker(store_config(Path({store!r}), FlushMode.SYNC_FLUSH), broker_config(
        flush_offset_interval_ms=10**9), clock=lambda: T0)
    b.start()
    b.create_topic("t", queues=1)
    half = b.send_message(msg("t", b"open", **{{Prop.TRAN_MSG: "true"}}), producer_group="pg")
    done = b.send_message(msg("t", b"done", **{{Prop.TRAN_MSG: "true"}}), producer_group="pg")
    b.end_transaction("pg", done.transaction_id, done.commitlog_offset, commit=True)
    delayed = b.send_message(msg("t", b"later", **{{Prop.DELAY: "2"}}))
    print(json.dumps({{"half": [half.transaction_id, half.commitlog_offset],
                       "delayed": delayed.msg_id}}), flush=True)
    time.sleep(600)
""")


@pytest.mark.chaos
def test_sigkill_keeps_half_messages_and_scheduled_ones(tmp_path: Path) -> None:
    store = tmp_path / "store"
    script = CHILD_TX.format(kit_dir=str(Path(__file__).parent), store=str(store))
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).parents[3]),
    )
    try:
        assert child.stdout is not None
        state = json.loads(child.stdout.readline())
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)

    clock = ManualClock(T0)
    b = Broker(store_config(store, FlushMode.SYNC_FLUSH), broker_config(), clock=clock)
    b.start()
    try:
        asked: list[str] = []

        def checker(half: object) -> None:
            asked.append(Broker.transaction_id_of(half))  # type: ignore[arg-type]
            b.end_transaction(
                "pg", state["half"][0], state["half"][1], commit=True, from_check=True
            )

        b.register_transaction_checker("pg", checker)
        assert b.store.wait_dispatched(10)
        clock.advance(1_000)
        assert b.check_transactions() == 1  # only the open one is asked about
        b.deliver_due()
        assert b.store.wait_dispatched(10)
        import time

        deadline = time.monotonic() + 10
        bodies: list[bytes] = []
        while len(bodies) < 3 and time.monotonic() < deadline:
            result = b.pull_message("g", "t", 0, 0, 32)
            bodies = [m.body for m in result.messages]
            time.sleep(0.01)
        assert asked == [state["half"][0]]
        assert sorted(bodies) == [b"done", b"later", b"open"]  # each exactly once
    finally:
        b.shutdown()


CHILD_SCHEDULE = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {kit_dir!r})
    from broker_kit import T0, broker_config, msg, store_config
    from broker.broker import Broker
    from broker.store.config import FlushMode
    from protocol.props import Prop
    from pathlib import Path

    now = [T0]
    b = Broker(store_config(Path({store!r}), FlushMode.SYNC_FLUSH), broker_config(
        flush_offset_interval_ms=10**9), clock=lambda: now[0])
    b.start()
    b.create_topic("t", queues=1)
    for i in range(6):
        b.send_message(msg("t", str(i).encode(), **{{Prop.DELAY: "1" if i < 3 else "5"}}))
    b.store.wait_dispatched(10)
    now[0] += 100
    moved = b.deliver_due()
    b.store.wait_dispatched(10)
    print(json.dumps({{"moved": moved}}), flush=True)
    time.sleep(600)
""")


@pytest.mark.chaos
def test_sigkill_during_scheduling_loses_no_delayed_message(tmp_path: Path) -> None:
    """Schedule progress is written after each pass that moved messages: a kill after the
    pass moves nothing twice; a kill inside a pass could (counted), never zero times."""
    store = tmp_path / "store"
    script = CHILD_SCHEDULE.format(kit_dir=str(Path(__file__).parent), store=str(store))
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).parents[3]),
    )
    try:
        assert child.stdout is not None
        assert json.loads(child.stdout.readline()) == {"moved": 3}
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)

    clock = ManualClock(T0 + 100)
    b = Broker(store_config(store, FlushMode.SYNC_FLUSH), broker_config(), clock=clock)
    b.start()
    try:
        clock.advance(1_000)
        b.deliver_due()
        assert b.store.wait_dispatched(10)
        bodies = [m.body for m in b.pull_message("g", "t", 0, 0, 64).messages]
        assert set(bodies) == {str(i).encode() for i in range(6)}  # no loss
        duplicates = len(bodies) - len(set(bodies))
        print(f"duplicates after SIGKILL: {duplicates}")
        assert duplicates == 0  # the kill came after the pass had written its progress
    finally:
        b.shutdown()
