"""Checkpoint, abort file and directory lock: the small files recovery decides by."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from broker.store.checkpoint import (
    CHECKPOINT_FILE_SIZE,
    StoreCheckpoint,
    abort_file_exists,
    create_abort_file,
    remove_abort_file,
)
from broker.store.errors import ForeignFile, StoreLocked
from broker.store.service import ServiceThread
from broker.store.store_lock import StoreLock

from ._helpers import wait_until


def test_checkpoint_round_trip_and_layout(tmp_path: Path) -> None:
    cp = StoreCheckpoint(tmp_path / "checkpoint", 11, 22, 33, 44)
    cp.flush()
    raw = (tmp_path / "checkpoint").read_bytes()
    assert len(raw) == CHECKPOINT_FILE_SIZE
    assert struct.unpack_from(">qqqq4si", raw) == (11, 22, 33, 44, b"RCKP", 1)
    assert not (tmp_path / "checkpoint.tmp").exists()
    again = StoreCheckpoint.open(tmp_path / "checkpoint")
    assert again.loaded
    assert (
        again.physic_msg_timestamp,
        again.logics_msg_timestamp,
        again.index_msg_timestamp,
        again.physic_flushed_offset,
    ) == (11, 22, 33, 44)
    assert again.min_timestamp() == 11 and again.min_timestamp(index_safe=True) == 11


def test_missing_or_torn_checkpoint_is_not_trusted(tmp_path: Path) -> None:
    assert not StoreCheckpoint.open(tmp_path / "checkpoint").loaded
    StoreCheckpoint(tmp_path / "checkpoint", 1, 2, 3, 4).flush()
    raw = bytearray((tmp_path / "checkpoint").read_bytes())
    raw[0] ^= 1
    (tmp_path / "checkpoint").write_bytes(bytes(raw))
    torn = StoreCheckpoint.open(tmp_path / "checkpoint")
    assert not torn.loaded and torn.physic_flushed_offset == 0


def test_foreign_checkpoint_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "checkpoint").write_bytes(b"x" * 10)
    with pytest.raises(ForeignFile):
        StoreCheckpoint.open(tmp_path / "checkpoint")
    (tmp_path / "checkpoint").write_bytes(bytes(CHECKPOINT_FILE_SIZE))
    with pytest.raises(ForeignFile, match="magic"):
        StoreCheckpoint.open(tmp_path / "checkpoint")


def test_abort_file_and_lock(tmp_path: Path) -> None:
    abort = tmp_path / "abort"
    assert not abort_file_exists(abort)
    create_abort_file(abort)
    assert abort_file_exists(abort) and abort.stat().st_size == 0
    remove_abort_file(abort)
    assert not abort_file_exists(abort)
    first, second = StoreLock(tmp_path / "lock"), StoreLock(tmp_path / "lock")
    first.acquire()
    with pytest.raises(StoreLocked):
        second.acquire()
    first.release()
    second.acquire()
    second.release()


def test_service_thread_wakes_early_and_stops() -> None:
    rounds: list[int] = []

    class Loop(ServiceThread):
        name = "test-loop"

        def run(self) -> None:
            while not self.stopped:
                self.wait_for_running(60.0)  # only wakeup() or shutdown() end the park
                rounds.append(1)

    svc = Loop()
    svc.start()
    svc.wakeup()
    assert wait_until(lambda: bool(rounds))
    svc.shutdown(timeout=5)
    assert svc.stopped and not svc.started
