"""Recovery: clean and unclean stops, torn tails, corruption, foreign files."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from broker.store.checkpoint import StoreCheckpoint
from broker.store.config import SHIPPED_WATERMARKS, FlushMode, StoreConfig
from broker.store.errors import ForeignFile, StoreCorrupted
from broker.store.message import GetMessageStatus, Message, PutMessageStatus
from broker.store.store import MessageStore

from ._helpers import crash_copy, message, small_config, write_at

N = 120


Written = list[tuple[int, Message]]


def _fill(cfg: StoreConfig, n: int = N, queues: int = 2) -> tuple[MessageStore, Written]:
    store = MessageStore(cfg)
    store.start()
    written = []
    for i in range(n):
        msg = message(i, queue_id=i % queues, size=40 + (i * 37) % 300)
        r = store.put_message(msg)
        assert r.ok and r.append is not None
        written.append((r.append.wrote_offset, msg))
    assert store.wait_dispatched(10)
    return store, written


def _assert_all_readable(store: MessageStore, written: list[tuple[int, Message]]) -> None:
    for offset, msg in written:
        got = store.look_message_by_offset(offset)
        assert got is not None, offset
        assert (got.body, got.properties, got.queue_id) == (msg.body, msg.properties, msg.queue_id)
        key = msg.keys[0]
        hits = store.query_message_by_key(msg.topic, key)
        assert [h.commitlog_offset for h in hits] == [offset]
        uniq = store.query_message_by_unique_key(msg.topic, msg.unique_key or "")
        assert uniq is not None and uniq.commitlog_offset == offset


def _assert_queues_consistent(
    store: MessageStore, written: list[tuple[int, Message]], queues: int = 2
) -> None:
    for qid in range(queues):
        expected = [off for off, m in written if m.queue_id == qid]
        got = store.get_messages("g", "TopicA", qid, 0, 10_000)
        assert [m.commitlog_offset for m in got.messages] == expected
        assert [m.queue_offset for m in got.messages] == list(range(len(expected)))
        assert store.get_max_offset_in_queue("TopicA", qid) == len(expected)


def _assert_accepts_writes(store: MessageStore, written: list[tuple[int, Message]]) -> None:
    nxt = message(10_000, queue_id=0)
    r = store.put_message(nxt)
    assert r.status is PutMessageStatus.PUT_OK and r.append is not None
    assert r.append.queue_offset == sum(1 for _, m in written if m.queue_id == 0)
    assert r.append.wrote_offset >= max(o for o, _ in written)
    assert store.wait_dispatched(10)
    assert store.get_message_by_queue_offset("TopicA", 0, r.append.queue_offset) is not None


def test_clean_shutdown_then_normal_recovery(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    store, written = _fill(cfg)
    store.shutdown()
    assert not cfg.abort_path.exists()
    cp = StoreCheckpoint.open(cfg.checkpoint_path)
    assert cp.loaded and cp.physic_flushed_offset == store.get_commitlog_max_offset()
    again = MessageStore(cfg)
    again.start()
    assert again.recovery is not None and not again.recovery.abnormal
    assert again.get_commitlog_max_offset() == store.get_commitlog_max_offset()
    _assert_all_readable(again, written)
    _assert_queues_consistent(again, written)
    _assert_accepts_writes(again, written)
    again.shutdown()


@pytest.mark.parametrize("mode", [FlushMode.ASYNC_FLUSH, FlushMode.SYNC_FLUSH])
def test_abnormal_stop_recovers_everything(tmp_path: Path, mode: FlushMode) -> None:
    cfg = small_config(tmp_path / "live", flush_mode=mode)
    store, written = _fill(cfg)
    copy = crash_copy(cfg.store_dir, tmp_path / "crashed")
    store.shutdown()
    assert (copy / "abort").exists()
    again = MessageStore(small_config(copy, flush_mode=mode))
    again.start()
    assert again.recovery is not None and again.recovery.abnormal
    assert not again.recovery.torn_tail
    _assert_all_readable(again, written)
    _assert_queues_consistent(again, written)
    _assert_accepts_writes(again, written)
    again.shutdown()


def test_lost_consume_queues_and_index_are_rebuilt(tmp_path: Path) -> None:
    import shutil

    cfg = small_config(tmp_path / "live")
    store, written = _fill(cfg)
    copy = crash_copy(cfg.store_dir, tmp_path / "crashed")
    store.shutdown()
    shutil.rmtree(copy / "consumequeue")
    shutil.rmtree(copy / "index")
    again = MessageStore(small_config(copy))
    again.start()
    _assert_all_readable(again, written)
    _assert_queues_consistent(again, written)
    _assert_accepts_writes(again, written)
    again.shutdown()


@pytest.mark.parametrize("tail", ["half_record", "random_bytes", "bad_crc_record"])
@pytest.mark.parametrize("crashed", [True, False])
def test_torn_tail_is_cut_off(tmp_path: Path, tail: str, crashed: bool, seed: int) -> None:
    rng = random.Random(seed)
    cfg = small_config(tmp_path / "live", flush_mode=FlushMode.SYNC_FLUSH)
    store, written = _fill(cfg)
    end = store.get_commitlog_max_offset()
    # a record as the next put would write it, to cut in half
    extra = store.put_message(message(999, size=200))
    assert extra.append is not None
    raw = store.commitlog.get_message(extra.append.wrote_offset, extra.append.wrote_bytes)
    assert raw is not None
    if crashed:
        directory = crash_copy(cfg.store_dir, tmp_path / "crashed")
        store.shutdown()
    else:
        store.shutdown()
        directory = cfg.store_dir
    size = cfg.mapped_file_size_commitlog
    start = extra.append.wrote_offset
    # forget the extra record: zero it, then write the damaged tail by hand
    write_at(directory, start, bytes(len(raw)), size)
    # a checkpoint written after the extra record's fsync (at the clean shutdown, or by
    # the checkpoint service before the crash copy) vouches for it: rewind it
    cp = StoreCheckpoint.open(directory / "checkpoint")
    if cp.physic_flushed_offset > start:
        cp.physic_flushed_offset = start
        cp.flush()
    if tail == "half_record":
        damaged = raw[: len(raw) // 2]
    elif tail == "random_bytes":
        damaged = rng.randbytes(min(150, size - start % size))
    else:
        b = bytearray(raw)
        b[100] ^= 0xFF
        damaged = bytes(b)
    write_at(directory, start, damaged[: size - start % size], size)
    again = MessageStore(small_config(directory, flush_mode=FlushMode.SYNC_FLUSH))
    again.start()
    assert again.recovery is not None and again.recovery.torn_tail
    assert again.get_commitlog_max_offset() in (start, end)
    _assert_all_readable(again, written)
    _assert_queues_consistent(again, written)
    assert again.look_message_by_offset(start) is None
    _assert_accepts_writes(again, written)
    again.shutdown()
    # the cut tail is gone for good: a third start sees a clean log
    third = MessageStore(small_config(directory, flush_mode=FlushMode.SYNC_FLUSH))
    third.start()
    assert third.recovery is not None and not third.recovery.torn_tail
    third.shutdown()


def test_corrupt_record_below_the_flushed_offset_is_quarantined(tmp_path: Path) -> None:
    """Its frame holds (size and magic sound, the next record where the size says): kept
    on disk, listed, never served; the store starts and nothing else is lost."""
    cfg = small_config(tmp_path)
    store, written = _fill(cfg)
    store.shutdown()
    victim = written[-5][0]  # in the last files: normal recovery scans those
    write_at(cfg.store_dir, victim + 100, b"\xff\xfe", cfg.mapped_file_size_commitlog)
    again = MessageStore(cfg)
    again.start()
    try:
        assert again.recovery is not None
        assert [at for at, _ in again.recovery.quarantined] == [victim]
        assert again.look_message_by_offset(victim) is None
        for offset, msg in written[-4:]:
            got = again.look_message_by_offset(offset)
            assert got is not None and got.body == msg.body
    finally:
        again.shutdown()


def test_corrupt_record_frame_below_the_flushed_offset_is_refused(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    store, written = _fill(cfg)
    store.shutdown()
    victim = written[-5][0]  # in the last files: normal recovery scans those
    # its TOTALSIZE: the next record cannot be found from it
    write_at(cfg.store_dir, victim + 2, b"\x7f", cfg.mapped_file_size_commitlog)
    again = MessageStore(cfg)
    with pytest.raises(StoreCorrupted) as err:
        again.start()
    assert err.value.offset == victim % cfg.mapped_file_size_commitlog
    assert "flushed" in err.value.reason
    # nothing was truncated: the bytes after the corrupt record are still there
    fixed = written[-1][0]
    path = cfg.store_dir / "commitlog" / f"{fixed - fixed % cfg.mapped_file_size_commitlog:020d}"
    assert path.exists()
    # and the store directory is not left locked
    with pytest.raises(StoreCorrupted):
        MessageStore(cfg).start()


@pytest.mark.parametrize("mode", [FlushMode.ASYNC_FLUSH, FlushMode.SYNC_FLUSH])
def test_invalid_record_followed_by_valid_ones(tmp_path: Path, mode: FlushMode) -> None:
    # the checkpoint is never refreshed after start, so it vouches for nothing
    cfg = small_config(
        tmp_path / "live", flush_mode=mode, flush_interval_consume_queue_ms=3_600_000
    )
    store, written = _fill(cfg)
    copy = crash_copy(cfg.store_dir, tmp_path / "crashed")
    store.shutdown()
    k = N - 10
    write_at(copy, written[k][0] + 95, b"\x00\x13", cfg.mapped_file_size_commitlog)
    again = MessageStore(
        small_config(copy, flush_mode=mode, flush_interval_consume_queue_ms=3_600_000)
    )
    if mode is FlushMode.SYNC_FLUSH:
        # later records were acknowledged after this one: truncating would lose them
        with pytest.raises(StoreCorrupted, match="followed by 9 valid"):
            again.start()
        return
    again.start()  # ASYNC: what a power cut can leave; cut off, counted, logged
    assert again.recovery is not None and again.recovery.valid_records_dropped == 9
    assert again.get_commitlog_max_offset() == written[k][0]
    _assert_all_readable(again, written[:k])
    _assert_queues_consistent(again, written[:k])
    _assert_accepts_writes(again, written[:k])
    again.shutdown()


def test_foreign_files_are_rejected(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    store, _ = _fill(cfg, n=10)
    store.shutdown()
    stray = cfg.store_dir / "commitlog" / "readme.txt"
    stray.write_text("not ours")
    with pytest.raises(ForeignFile, match=r"readme\.txt"):
        MessageStore(cfg).start()
    stray.unlink()
    wrong = cfg.store_dir / "commitlog" / f"{cfg.mapped_file_size_commitlog:020d}"
    wrong.write_bytes(b"\x00" * 100)
    with pytest.raises(ForeignFile, match="size 100"):
        MessageStore(cfg).start()
    wrong.unlink()
    good = cfg.checkpoint_path.read_bytes()
    cfg.checkpoint_path.write_bytes(b"GIF89a" + bytes(4090))
    with pytest.raises(ForeignFile, match="checkpoint"):
        MessageStore(cfg).start()
    cfg.checkpoint_path.write_bytes(good)
    store = MessageStore(cfg)
    store.start()  # everything back in place: the store opens, nothing was lost
    assert store.get_max_offset_in_queue("TopicA", 0) == 5
    store.shutdown()


def test_torn_checkpoint_falls_back_to_a_full_scan(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    store, written = _fill(cfg)
    store.shutdown()
    raw = bytearray(cfg.checkpoint_path.read_bytes())
    raw[3] ^= 0xFF  # the CRC no longer matches
    cfg.checkpoint_path.write_bytes(bytes(raw))
    again = MessageStore(cfg)
    again.start()
    assert again.recovery is not None and again.recovery.abnormal
    assert again.recovery.scanned_from == 0
    _assert_all_readable(again, written)
    again.shutdown()


def test_a_foreign_file_with_a_valid_name_and_size_is_never_overwritten(
    tmp_path: Path, seed: int
) -> None:
    cfg = small_config(tmp_path)
    (cfg.commitlog_dir).mkdir(parents=True)
    foreign = cfg.commitlog_dir / f"{0:020d}"
    content = random.Random(seed).randbytes(cfg.mapped_file_size_commitlog)
    foreign.write_bytes(content)
    with pytest.raises(ForeignFile, match="does not start with a commitlog record"):
        MessageStore(cfg).start()
    assert foreign.read_bytes() == content


@pytest.mark.parametrize("crashed", [True, False])
def test_recovery_after_cleanup_deleted_the_oldest_files(tmp_path: Path, crashed: bool) -> None:
    cfg = small_config(
        tmp_path / "live",
        file_reserved_time_hours=0.0,
        delete_files_interval_ms=0,
        **SHIPPED_WATERMARKS,
    )
    store = MessageStore(cfg, disk_usage=lambda _p: 0.87)  # above the clean watermark
    store.start()
    written = []
    for i in range(N):
        msg = message(i, queue_id=i % 2, size=40 + (i * 37) % 300)
        r = store.put_message(msg)
        assert r.ok and r.append is not None
        written.append((r.append.wrote_offset, msg))
    assert store.wait_dispatched(10)
    store.commitlog.queue.flush_to(store.get_commitlog_max_offset())  # flusher lets go
    report = store.cleanup.run_once()
    assert report.commitlog_deleted > 0
    cl_min = store.get_commitlog_min_offset()
    assert cl_min > 0
    if crashed:
        directory = crash_copy(cfg.store_dir, tmp_path / "crashed")
        store.shutdown()
    else:
        store.shutdown()
        directory = cfg.store_dir
    again = MessageStore(small_config(directory), disk_usage=lambda _p: 0.5)
    again.start()
    # a file a reader still held when cleanup ran is deleted on a later pass: it may be back
    assert 0 < again.get_commitlog_min_offset() <= cl_min
    cl_min = again.get_commitlog_min_offset()
    kept = [(o, m) for o, m in written if o >= cl_min]
    gone = [(o, m) for o, m in written if o < cl_min]
    assert kept and gone
    for offset, msg in kept:
        got = again.look_message_by_offset(offset)
        assert got is not None and got.body == msg.body
    for offset, _ in gone:
        assert again.look_message_by_offset(offset) is None
    for qid in range(2):
        low = again.get_min_offset_in_queue("TopicA", qid)
        got = again.get_messages("g", "TopicA", qid, low, 10_000)
        expected = [o for o, m in kept if m.queue_id == qid]
        assert [m.commitlog_offset for m in got.messages] == expected
        assert low > 0  # the queue no longer offers units whose records were deleted
        too_small = again.get_messages("g", "TopicA", qid, 0, 1)
        assert too_small.status is GetMessageStatus.OFFSET_TOO_SMALL
        assert too_small.next_begin_offset == low
    _assert_accepts_writes(again, written)
    again.shutdown()


def test_a_wrong_unit_below_the_checked_tail_is_repaired_once_the_store_is_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Start checks each queue's tail (what dispatch and the topic-queue table start
    from); the units further back are checked after the store opens, and a queue with a
    wrong one is repaired from the commitlog, as a read meeting it would do."""
    from broker.store import startup

    cfg = small_config(tmp_path)
    store, written = _fill(cfg)
    store.shutdown()
    unit = cfg.store_dir / "consumequeue" / "TopicA" / "0" / "00000000000000000000"
    data = bytearray(unit.read_bytes())
    data[3 * 20 + 7] ^= 0x10  # unit 3's commitlog offset: no longer a record's start
    unit.write_bytes(data)
    monkeypatch.setattr(startup, "TAIL_UNITS", 8)
    store = MessageStore(cfg)
    store.start()
    try:
        assert store.unit_check is not None and store.unit_check.done.wait(10)
        assert store.unit_check.repaired == [("TopicA", 0)]
        # queue 0 up to its wrong unit 3, queue 1 every unit below its tail
        assert store.unit_check.units_checked == 4 + (N // 2 - 8)
        _assert_queues_consistent(store, written)
        _assert_accepts_writes(store, written)
    finally:
        store.shutdown()


def test_the_search_for_records_after_a_torn_tail_skips_zeros_and_finds_every_magic() -> None:
    """`_find_magic` skips zero chunks; it must find what a plain search finds, a magic
    code across a chunk boundary included."""
    import mmap

    from broker.store import recovery

    def plain(mm: mmap.mmap, start: int) -> int:
        at = mm.find(recovery._MAGIC_PREFIX, start)
        while at >= 0 and mm[at : at + 4] not in recovery._MAGICS:
            at = mm.find(recovery._MAGIC_PREFIX, at + 1)
        return at

    rng = random.Random(7)
    chunk = 1 << 20
    for _ in range(60):
        mm = mmap.mmap(-1, rng.choice([5_000, 2 * chunk, 3 * chunk + 17]))
        for _ in range(rng.randrange(4)):
            at = rng.randrange(len(mm) - 4)
            piece = rng.choice([*recovery._MAGICS, b"\xda\xa3\x20\x00", b"\xda\xa3"])
            mm[at : at + len(piece)] = piece
        if len(mm) > chunk + 4 and rng.random() < 0.5:
            at = chunk - rng.randrange(4)
            mm[at : at + 4] = rng.choice(recovery._MAGICS)
        start = rng.randrange(len(mm))
        assert recovery._find_magic(mm, start) == plain(mm, start)
