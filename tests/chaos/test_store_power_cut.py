"""A power cut between write and fsync: a store under SYNC_FLUSH is SIGKILLed while four
threads append, then everything the commitlog held beyond its last fdatasync is dropped
(zeroed, as a lost page cache leaves a preallocated file), while the consume queues,
index and checkpoint keep whatever they had, possibly ahead of the log. Recovery must
keep every acknowledged message, readable by offset, by queue offset and by key, with no
queue offset given twice, and the store must verify clean afterwards.
"""

from __future__ import annotations

import os
import random
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.config_files import config_file_parsers
from broker.store.message import PutMessageStatus
from broker.store.store import MessageStore
from broker.store.verify import verify_store

sys.path.insert(0, str(Path(__file__).parent))
from power_cut_child import FILE_SIZE, QUEUES, TOPIC, config, message

pytestmark = pytest.mark.chaos

CHILD = Path(__file__).with_name("power_cut_child.py")
ROOT = Path(__file__).resolve().parents[2]
CUTS = 2


def _run(store_dir: Path, durable: Path, rng: random.Random) -> list[tuple[int, int, int]]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(store_dir), str(durable)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    ready = proc.stdout.readline()
    if ready != b"READY\n":
        proc.kill()
        raise AssertionError(f"child failed: {ready!r} {proc.communicate()[1].decode()}")
    time.sleep(rng.uniform(0.15, 0.4))
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    return [tuple(map(int, line.split())) for line in out.split(b"\n")[:-1]]  # type: ignore


def _power_cut(store_dir: Path, durable: Path) -> int:
    """Zero the commitlog past what the last completed fdatasync covered."""
    (end,) = struct.unpack(">q", durable.read_bytes())
    log = store_dir / "commitlog" / f"{0:020d}"
    assert log.stat().st_size == FILE_SIZE
    with log.open("r+b") as f:
        f.seek(end)
        written = f.read()
        f.seek(end)
        f.write(bytes(len(written)))
    return end


def test_power_cut_after_sigkill_loses_nothing_acknowledged(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    store_dir = tmp_path / "store"
    acked: dict[int, tuple[int, int]] = {}  # commitlog offset -> (size, message index)
    for cut in range(CUTS):
        durable = tmp_path / f"durable{cut}"
        new = _run(store_dir, durable, rng)
        assert new, "the child acknowledged nothing"
        end = _power_cut(store_dir, durable)
        for offset, size, index in new:
            assert offset + size <= end, "acknowledged before its fdatasync completed"
            acked[offset] = (size, index)
        store = MessageStore(config(store_dir))
        store.start()
        try:
            assert store.recovery is not None and store.recovery.abnormal
            assert store.get_commitlog_max_offset() >= max(o + s for o, (s, _) in acked.items())
            assert store.wait_dispatched(30)
            seen: set[tuple[int, int]] = set()
            for offset, (_size, index) in acked.items():
                got = store.look_message_by_offset(offset)
                assert got is not None, f"acknowledged message at {offset} lost"
                assert got.body == message(index).body
                slot = (got.queue_id, got.queue_offset)
                assert slot not in seen, f"queue offset {slot} given twice"
                seen.add(slot)
                via = store.get_message_by_queue_offset(TOPIC, *slot)
                assert via is not None and via.commitlog_offset == offset
                hits = store.query_message_by_key(TOPIC, f"k{index}")
                assert offset in [h.commitlog_offset for h in hits]
            # every unit points at a record still in the log (durable but unacknowledged
            # records are kept too), none past the recovered end
            for q in range(QUEUES):
                for qoff in range(store.get_max_offset_in_queue(TOPIC, q)):
                    got = store.get_message_by_queue_offset(TOPIC, q, qoff)
                    assert got is not None and got.queue_offset == qoff, (q, qoff)
                    assert got.commitlog_offset + got.store_size <= store.recovery.end
            # and the store goes on: the next put takes the next queue offset
            r = store.put_message(message(0))
            assert r.status is PutMessageStatus.PUT_OK and r.append is not None
            assert store.wait_dispatched(30)  # the unit is written by the dispatch thread
            assert r.append.queue_offset == store.get_max_offset_in_queue(TOPIC, 0) - 1
            acked[r.append.wrote_offset] = (r.append.wrote_bytes, 0)
        finally:
            store.shutdown()
    report = verify_store(config(store_dir), config_file_parsers())
    assert report.ok, "\n".join(map(str, report.problems))
    print(f"seed={seed} cuts={CUTS} acknowledged={len(acked)}")
