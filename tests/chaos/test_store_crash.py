"""SIGKILL a real process appending under SYNC_FLUSH; nothing acknowledged may be lost.

A child process (`store_child.py`) appends messages with keys and unique keys from several
threads and reports every acknowledged commitlog offset over a pipe. The parent kills it
with SIGKILL at a random moment, then (on most rounds) opens the store itself: abnormal
recovery must keep every acknowledged message readable by offset, by key and by unique
key, byte for byte, with consistent consume queues, and must accept new writes. On other
rounds the next child recovers from the kill itself. Some rounds also write a torn last
record (half a record, then random bytes) by hand after the kill.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.store.codec import check_message_and_return_size
from broker.store.mapped_file import is_temp_name
from broker.store.message import PutMessageStatus
from broker.store.store import MessageStore

sys.path.insert(0, str(Path(__file__).parent))
from store_child import (
    QUEUES,
    TOPIC,
    body_for,
    crash_config,
    key_for,
    message_for,
    uniq_for,
)

pytestmark = pytest.mark.chaos

CHILD = Path(__file__).with_name("store_child.py")
ROOT = Path(__file__).resolve().parents[2]
KILLS = 22


@dataclass(frozen=True)
class Acked:
    offset: int
    run: int
    index: int


def _run_child(store_dir: Path, run: int, rng: random.Random) -> tuple[list[Acked], bool]:
    """Start a child, let it append for a random while, SIGKILL it; its acknowledged puts."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(store_dir), str(run), "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    ready = proc.stdout.readline()
    if ready != b"READY\n":
        proc.kill()
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"child failed to start: {ready!r}\n{err.decode()}")
    time.sleep(rng.uniform(0.02, 0.3))
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    acked = []
    for line in out.split(b"\n")[:-1]:  # the part after the last newline may be cut short
        offset, r, i = line.split()
        acked.append(Acked(int(offset), int(r), int(i)))
    return acked, True


def _commitlog_end(store_dir: Path) -> tuple[Path, int, bytes]:
    """(file, position) where the valid log ends, and the last valid record's bytes."""
    record = b""
    for path in sorted((store_dir / "commitlog").iterdir()):
        if is_temp_name(path.name):
            continue  # a next file the kill caught being allocated: the store deletes it
        data = path.read_bytes()
        pos = 0
        while True:
            size, _ = check_message_and_return_size(data, pos, True, int(path.name) + pos)
            if size < 0:
                return path, pos, record
            if size == 0:
                break  # blank record: the log goes on in the next file
            record = data[pos : pos + size]
            pos += size
    return path, len(data), record  # the last file is full: no room to tear


def _tear_tail(store_dir: Path, rng: random.Random) -> bool:
    """Write half a record followed by random bytes where the valid log ends."""
    last, pos, record = _commitlog_end(store_dir)
    size = last.stat().st_size
    room = size - pos
    if not record or room < 16:
        return False
    torn = record[: len(record) // 2] + rng.randbytes(rng.randrange(1, 64))
    with open(last, "r+b") as f:
        f.seek(pos)
        f.write(torn[:room])
    return True


def _verify(store: MessageStore, acked: list[Acked]) -> None:
    seen_queue_offsets: set[tuple[int, int]] = set()
    for a in acked:
        expected = message_for(a.run, a.index)
        got = store.look_message_by_offset(a.offset)
        assert got is not None, f"acknowledged message at {a.offset} lost"
        assert got.body == body_for(a.run, a.index)
        assert got.properties == expected.properties
        assert (got.topic, got.queue_id) == (TOPIC, expected.queue_id)
        slot = (got.queue_id, got.queue_offset)
        assert slot not in seen_queue_offsets, f"queue offset {slot} used twice"
        seen_queue_offsets.add(slot)
        via_queue = store.get_message_by_queue_offset(TOPIC, got.queue_id, got.queue_offset)
        assert via_queue is not None and via_queue.commitlog_offset == a.offset
        hits = store.query_message_by_key(TOPIC, key_for(a.run, a.index))
        assert [h.commitlog_offset for h in hits] == [a.offset]
        assert hits[0].body == got.body
        uniq = store.query_message_by_unique_key(TOPIC, uniq_for(a.run, a.index))
        assert uniq is not None and uniq.commitlog_offset == a.offset


def _accepts_writes(store: MessageStore, run: int) -> Acked:
    expected_qoff = store.get_max_offset_in_queue(TOPIC, 0)
    r = store.put_message(message_for(run, 0))  # index 0 lands in queue 0
    assert r.status is PutMessageStatus.PUT_OK and r.append is not None
    assert r.append.queue_offset == expected_qoff
    assert store.wait_dispatched(30)
    return Acked(r.append.wrote_offset, run, 0)


def test_sigkill_under_sync_flush_loses_nothing_acknowledged(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    store_dir = tmp_path / "store"
    acked: list[Acked] = []
    torn_rounds = 0
    for kill in range(KILLS):
        run = 2 * kill + 1  # even runs are the parent's own writes
        new, _ = _run_child(store_dir, run, rng)
        acked.extend(new)
        assert (store_dir / "abort").exists()
        if kill % 3 == 2:
            continue  # the next child recovers from this kill by itself
        torn = kill % 4 == 1 and _tear_tail(store_dir, rng)
        torn_rounds += torn
        store = MessageStore(crash_config(store_dir))
        store.start()
        try:
            assert store.recovery is not None and store.recovery.abnormal
            if torn:
                assert store.recovery.torn_tail
            assert store.wait_dispatched(30)
            _verify(store, acked)
            acked.append(_accepts_writes(store, run + 1))
        finally:
            store.shutdown()
    store = MessageStore(crash_config(store_dir))
    store.start()
    try:
        _verify(store, acked)
        total = sum(store.get_max_offset_in_queue(TOPIC, q) for q in range(QUEUES))
        assert total >= len(acked)
    finally:
        store.shutdown()
    assert torn_rounds >= 2
    print(f"seed={seed} kills={KILLS} acknowledged={len(acked)} torn={torn_rounds}")
