"""Expired-file cleanup: exactly the expired files go, never the current one; watermarks,
batch limits and pauses; consume queue and index files follow the commitlog's min offset.
Disk use and the clock are injected: nothing sleeps, a full disk is simulated."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from broker.store.cleanup import CleanReason, CleanupService, parse_delete_when
from broker.store.commitlog import CommitLog
from broker.store.config import StoreConfig
from broker.store.consume_queue_store import ConsumeQueueStore
from broker.store.dispatcher import ReputService
from broker.store.index_service import IndexService
from broker.store.message import Message
from protocol.props import Prop

HOUR = 3_600_000
DAY_AT_10 = int(datetime(2026, 11, 20, 10, 30).timestamp() * 1000)  # local time, not 04h
DAY_AT_04 = int(datetime(2026, 11, 20, 4, 30).timestamp() * 1000)


class Store:
    def __init__(self, tmp_path: Path, **overrides: object) -> None:
        options: dict[str, object] = dict(
            store_dir=tmp_path,
            mapped_file_size_commitlog=4096,
            mapped_file_size_consume_queue=20 * 4,
            max_hash_slot_num=8,
            max_index_num=9,
            warm_mapped_file=False,
            delete_files_interval_ms=0,
            delete_when="04",
        )
        options.update(overrides)
        self.config = StoreConfig(**options)  # type: ignore[arg-type]
        ticks = itertools.count(DAY_AT_10 - 100 * HOUR)
        self.commitlog = CommitLog(self.config, clock=lambda: next(ticks))
        self.commitlog.load()
        self.cqs = ConsumeQueueStore(self.config)
        self.cqs.load()
        self.index = IndexService(self.config, clock=lambda: DAY_AT_10)
        self.index.load(last_exit_ok=True)
        self.reput = ReputService(self.commitlog, [self.cqs, self.index])
        self.disk = 0.5
        self.now = DAY_AT_10
        self.sleeps: list[float] = []
        self.cleanup = CleanupService(
            self.config,
            self.commitlog,
            self.cqs,
            self.index,
            disk_usage=lambda _p: self.disk,
            clock=lambda: self.now,
            sleep=self.sleeps.append,
        )
        self.offsets: list[int] = []

    def fill(self, files: int) -> None:
        """Append ~300-byte messages until the commitlog has `files` files."""
        i = len(self.offsets)
        while len(self.commitlog.queue.mapped_files) < files or not self.offsets:
            r = self.commitlog.append(
                Message("t", b"x" * 200, queue_id=i % 2, properties={Prop.KEYS: f"k{i}"})
            )
            assert r.append is not None
            self.offsets.append(r.append.wrote_offset)
            i += 1
        self.reput.do_reput()

    def age(self, index: int, hours: float) -> None:
        mf = self.commitlog.queue.mapped_files[index]
        t = (self.now - int(hours * HOUR)) / 1000
        os.utime(mf.path, (t, t))

    def names(self) -> list[str]:
        """The commitlog's files, checked against the directory (which may also hold the
        next file, pre-allocated ahead of time)."""
        names = [mf.path.name for mf in self.commitlog.queue.mapped_files]
        on_disk = sorted(p.name for p in self.config.commitlog_dir.iterdir())
        assert on_disk[: len(names)] == names and len(on_disk) - len(names) <= 1
        return names

    def close(self) -> None:
        self.cqs.shutdown()
        self.index.shutdown()
        self.commitlog.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path)
    yield s
    s.close()


def test_delete_when_parsing() -> None:
    assert parse_delete_when("04") == {4}
    assert parse_delete_when("04;16") == {4, 16}
    for bad in ("", "24", "4am", ";"):
        with pytest.raises(ValueError):
            parse_delete_when(bad)


def test_nothing_is_deleted_outside_delete_when_with_disk_room(store: Store) -> None:
    store.fill(5)
    for i in range(5):
        store.age(i, 100)
    report = store.cleanup.run_once()
    assert report.reason is CleanReason.NONE and report.commitlog_deleted == 0
    assert len(store.names()) == 5


def test_at_delete_hour_exactly_the_expired_files_go(store: Store) -> None:
    store.fill(6)
    before = store.names()
    store.now = DAY_AT_04
    for i, hours in enumerate([100, 90, 73, 71, 100, 100]):  # 4: old but after a young one
        store.age(i, hours)
    report = store.cleanup.run_once()
    assert report.reason is CleanReason.TIME_UP
    assert report.commitlog_deleted == 3
    assert store.names() == before[3:]  # oldest first, stopping at the first young file
    assert store.commitlog.get_min_offset() == int(before[3])


def test_never_the_current_file_even_when_everything_expired(store: Store) -> None:
    store.fill(4)
    store.now = DAY_AT_04
    for i in range(4):
        store.age(i, 1000)
    before = store.names()
    assert store.cleanup.run_once().commitlog_deleted == 3
    assert store.names() == before[-1:]
    assert store.cleanup.run_once().commitlog_deleted == 0
    assert store.names() == before[-1:]


def test_above_max_used_ratio_expired_files_go_at_any_hour(store: Store) -> None:
    store.fill(4)
    store.age(0, 80)
    store.age(1, 10)
    store.disk = 0.80
    report = store.cleanup.run_once()
    assert report.reason is CleanReason.DISK_SPACE and report.commitlog_deleted == 1
    assert not report.disk_full


def test_clean_watermark_deletes_young_files_in_batches_with_pauses(tmp_path: Path) -> None:
    s = Store(tmp_path, delete_files_batch_max=2, delete_files_interval_ms=250)
    try:
        s.fill(6)
        before = s.names()
        s.disk = 0.86
        report = s.cleanup.run_once()
        assert report.reason is CleanReason.DISK_WATERMARK
        assert report.commitlog_deleted == 2 and s.names() == before[2:]
        assert s.sleeps and all(d == 0.25 for d in s.sleeps)
        assert s.cleanup.run_once().commitlog_deleted == 2
        assert s.cleanup.run_once().commitlog_deleted == 1  # the current file stays
        assert s.names() == before[-1:]
    finally:
        s.close()


def test_forced_cleaning_can_be_disabled(tmp_path: Path) -> None:
    s = Store(tmp_path, clean_file_forcibly_enable=False)
    try:
        s.fill(3)
        s.disk = 0.86
        assert s.cleanup.run_once().commitlog_deleted == 0  # nothing is expired
    finally:
        s.close()


def test_refuse_watermark_marks_the_disk_full_until_it_drops(store: Store) -> None:
    store.fill(2)
    assert not store.cleanup.is_disk_full()
    store.disk = 0.95
    assert not store.cleanup.is_disk_full()  # measured by passes, not on every put
    report = store.cleanup.run_once()
    assert report.disk_full and store.cleanup.is_disk_full()
    store.disk = 0.89
    store.cleanup.run_once()
    assert not store.cleanup.is_disk_full()


def test_manual_delete_request(store: Store) -> None:
    store.fill(3)
    store.age(0, 100)
    store.cleanup.request_manual_delete()
    report = store.cleanup.run_once()
    assert report.reason is CleanReason.MANUAL and report.commitlog_deleted == 1


def test_consume_queue_and_index_files_follow_the_commitlog(tmp_path: Path) -> None:
    store = Store(tmp_path, delete_files_batch_max=3)
    try:
        _follow(store)
    finally:
        store.close()


def _follow(store: Store) -> None:
    store.fill(8)
    queues = {qid: store.cqs.get("t", qid) for qid in (0, 1)}
    cq_files_before = {qid: len(cq.mfq.mapped_files) for qid, cq in queues.items() if cq}
    index_before = len(store.index.files)
    store.disk = 0.9  # above the clean watermark, not above refuse
    report = store.cleanup.run_once()
    assert report.commitlog_deleted == 3 and not report.disk_full
    min_offset = store.commitlog.get_min_offset()
    assert report.consume_queue_deleted > 0 and report.index_deleted > 0
    assert len(store.index.files) == index_before - report.index_deleted
    for qid, cq in queues.items():
        assert cq is not None
        assert len(cq.mfq.mapped_files) < cq_files_before[qid]
        # the queue starts at its first message still in the commitlog, and all are readable
        units = list(cq.iter_units(0, 10_000))
        assert units[0][0] == cq.get_min_offset_in_queue()
        assert all(phy >= min_offset for _, phy, _, _ in units)
        expected = [o for i, o in enumerate(store.offsets) if i % 2 == qid and o >= min_offset]
        assert [phy for _, phy, _, _ in units] == expected
    for f in store.index.files[:-1]:
        assert f.end_phy_offset >= min_offset
    gone = [i for i, o in enumerate(store.offsets) if o < min_offset]
    kept = [i for i, o in enumerate(store.offsets) if o >= min_offset]
    assert list(store.index.iter_offsets("t", f"k{kept[0]}", 0, 2**62)) == [store.offsets[kept[0]]]
    assert gone
    # a second pass with the same min offset does not rescan the queues
    assert store.cleanup.clean_logic_files() == (0, 0)


def test_files_not_yet_dispatched_are_never_deleted(store: Store) -> None:
    store.fill(3)  # dispatched
    dispatched_end = store.commitlog.get_max_offset()
    for i in range(60):  # written but not dispatched: the reput service is behind
        store.commitlog.append(
            Message("t", b"y" * 200, queue_id=0, properties={Prop.KEYS: f"late{i}"})
        )
    files = [mf.file_from_offset for mf in store.commitlog.queue.mapped_files]
    assert len(files) >= 6
    store.disk = 0.95  # full: delete regardless of age
    report = store.cleanup.run_once()
    size = store.config.mapped_file_size_commitlog
    assert report.commitlog_deleted == sum(1 for f in files if f + size <= dispatched_end) == 2
    before = store.reput.reput_from_offset
    store.reput.do_reput()  # every message written is dispatched, none was lost
    cq = store.cqs.get("t", 0)
    assert cq is not None and store.reput.reput_from_offset > before
    assert list(store.index.iter_offsets("t", "late0", 0, 2**62))
    assert store.cleanup.run_once().commitlog_deleted > 0


def test_background_thread_runs_passes(tmp_path: Path) -> None:
    import time

    s = Store(tmp_path, clean_resource_interval_ms=5)
    try:
        s.fill(4)
        s.disk = 0.95
        s.cleanup.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
            s.cleanup.last_report is not None
            and s.cleanup.last_report.disk_full
            and len(s.commitlog.queue.mapped_files) == 1
        ):
            time.sleep(0.01)
        assert s.cleanup.is_disk_full()
        assert len(s.commitlog.queue.mapped_files) == 1
        assert s.cleanup.last_report is not None
    finally:
        s.cleanup.shutdown()
        s.close()


def test_disk_usage_ratio_agrees_with_df(tmp_path: Path) -> None:
    """The watermarks compare against what an operator's `df` shows for the partition (used
    over used + available), not against a total that includes space no writer can get."""
    import subprocess

    from broker.store.cleanup import disk_usage_ratio

    out = (
        subprocess.run(
            ["df", "--output=used,avail", str(tmp_path)], check=True, capture_output=True, text=True
        )
        .stdout.split("\n")[1]
        .split()
    )
    used, avail = int(out[0]), int(out[1])
    expected = used / (used + avail)
    assert abs(disk_usage_ratio(tmp_path / "not" / "yet") - expected) < 0.01
