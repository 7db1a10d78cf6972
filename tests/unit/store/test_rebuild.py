"""The index and the consume queues are derived from the commitlog: deleted, they are
rebuilt at start; a record that cannot be dispatched stops the start with DispatchStuck."""

from __future__ import annotations

import logging
import shutil
import struct
from pathlib import Path

import pytest

from broker.store.codec import POS_QUEUE_OFFSET, POS_STORE_TIMESTAMP, reseal
from broker.store.config import FlushMode, StoreConfig
from broker.store.consume_queue_store import QUEUE_REGISTRY_NAME
from broker.store.errors import DispatchStuck, StoreCorrupted
from broker.store.message import Message, PutMessageStatus
from broker.store.store import MessageStore

from ._helpers import crash_copy, message, small_config, wait_until

N = 90
QUEUES = 3

Written = list[tuple[int, Message]]


def _fill(cfg: StoreConfig, topic: str = "TopicA", n: int = N) -> tuple[MessageStore, Written]:
    store = MessageStore(cfg)
    store.start()
    written = []
    for i in range(n):
        msg = message(i, topic=topic, queue_id=i % QUEUES, size=40 + (i * 37) % 300)
        r = store.put_message(msg)
        assert r.ok and r.append is not None
        written.append((r.append.wrote_offset, msg))
    assert store.wait_dispatched(10)
    return store, written


def _assert_found_by_key(store: MessageStore, written: Written) -> None:
    for offset, msg in written:
        hits = store.query_message_by_key(msg.topic, msg.keys[0])
        assert [h.commitlog_offset for h in hits] == [offset]
        uniq = store.query_message_by_unique_key(msg.topic, msg.unique_key or "")
        assert uniq is not None and uniq.commitlog_offset == offset


def _assert_queues(store: MessageStore, written: Written, topic: str = "TopicA") -> None:
    for qid in range(QUEUES):
        expected = [off for off, m in written if m.queue_id == qid]
        got = store.get_messages("g", topic, qid, 0, 10_000)
        assert [m.commitlog_offset for m in got.messages] == expected
        assert [m.queue_offset for m in got.messages] == list(range(len(expected)))
        for qoff, off in enumerate(expected):
            found = store.get_message_by_queue_offset(topic, qid, qoff)
            assert found is not None and found.commitlog_offset == off


def _assert_next_queue_offsets(store: MessageStore, written: Written) -> None:
    for qid in range(QUEUES):
        r = store.put_message(message(50_000 + qid, queue_id=qid))
        assert r.status is PutMessageStatus.PUT_OK and r.append is not None
        assert r.append.queue_offset == sum(1 for _, m in written if m.queue_id == qid)
    assert store.wait_dispatched(10)


def _stopped(tmp_path: Path, crashed: bool) -> tuple[Path, Written]:
    cfg = small_config(tmp_path / "live")
    store, written = _fill(cfg)
    if crashed:
        directory = crash_copy(cfg.store_dir, tmp_path / "crashed")
        store.shutdown()
        return directory, written
    store.shutdown()
    return cfg.store_dir, written


@pytest.mark.parametrize("crashed", [False, True])
def test_deleted_index_is_rebuilt_from_the_commitlog(tmp_path: Path, crashed: bool) -> None:
    directory, written = _stopped(tmp_path, crashed)
    shutil.rmtree(directory / "index")
    _assert_rebuilt_once(directory, written)


def _assert_rebuilt_once(directory: Path, written: Written) -> None:
    """Started again, the store finds every record by key and in its queue; started a
    third time, nothing was indexed twice."""
    again = MessageStore(small_config(directory))
    again.start()
    try:
        _assert_found_by_key(again, written)
        _assert_queues(again, written)
        _assert_next_queue_offsets(again, written)
    finally:
        again.shutdown()
    third = MessageStore(small_config(directory))
    third.start()
    try:
        _assert_found_by_key(third, written)
    finally:
        third.shutdown()


@pytest.mark.parametrize("crashed", [False, True])
def test_deleted_consume_queue_is_rebuilt_from_the_commitlog(tmp_path: Path, crashed: bool) -> None:
    directory, written = _stopped(tmp_path, crashed)
    shutil.rmtree(directory / "consumequeue" / "TopicA" / "1")
    again = MessageStore(small_config(directory))
    again.start()
    try:
        _assert_queues(again, written)
        # queue 1's next offset comes from its rebuilt queue, not from 0
        _assert_next_queue_offsets(again, written)
        _assert_found_by_key(again, written)
    finally:
        again.shutdown()


# Header fields, big-endian (index_file.py): begin ts, end ts, begin phy, end phy at 24,
# slots used, index count at 36. A SIGKILL lands between two of the stores that write them.
_END_PHY = struct.Struct(">q")
_COUNT = struct.Struct(">i")
KEYS_A_RECORD = 3  # `message()`: two keys and the unique key, an entry each


def _tear_newest_header(directory: Path, how: str) -> Path:
    newest = sorted((directory / "index").iterdir())[-1]
    with open(newest, "r+b") as f:
        if how == "end_phy_not_written":  # the first put's begin offset, the old end of 0
            f.seek(24)
            f.write(_END_PHY.pack(0))
        else:  # "count_not_written": the end offset of the last put, the count before it
            f.seek(36)
            (count,) = _COUNT.unpack(f.read(4))
            f.seek(36)
            f.write(_COUNT.pack(count - KEYS_A_RECORD))
    return newest


@pytest.mark.parametrize("how", ["end_phy_not_written", "count_not_written"])
@pytest.mark.parametrize("records", [30, N])  # one index file; two (the newest torn)
def test_a_newest_index_header_torn_by_a_kill_is_rebuilt_from_the_commitlog(
    tmp_path: Path, how: str, records: int, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = small_config(tmp_path / "live")
    store, written = _fill(cfg, n=records)
    files = len(list((cfg.store_dir / "index").iterdir()))
    assert files == (1 if records < N else 2)
    directory = crash_copy(cfg.store_dir, tmp_path / "crashed")
    store.shutdown()
    torn = _tear_newest_header(directory, how)
    with caplog.at_level(logging.WARNING, logger="broker.store.index_service"):
        _assert_rebuilt_once(directory, written)
    assert f"{torn}: " in caplog.text and "rebuilt from the commitlog" in caplog.text


def test_a_torn_newest_index_is_rebuilt_from_the_file_before_it_past_recoverys_scan(
    tmp_path: Path,
) -> None:
    """The newest index file spans commitlog files the checkpoint says are safe, so the
    abnormal recovery scans from after its start: its records are re-indexed anyway."""
    # sync flush: the checkpoint's commitlog time keeps up with every put
    cfg = small_config(tmp_path / "live", flush_mode=FlushMode.SYNC_FLUSH)
    store = MessageStore(cfg)
    store.start()
    written: Written = []

    def put(i: int) -> None:
        msg = message(i, queue_id=i % QUEUES, size=600)  # about 12 records a commitlog file
        r = store.put_message(msg)
        assert r.ok and r.append is not None
        written.append((r.append.wrote_offset, msg))

    for i in range(100):  # index files: records 0-84 (255 entries, 3 a record), then 85-
        put(i)
    assert store.wait_dispatched(10)
    last = store.get_message_by_queue_offset("TopicA", 99 % QUEUES, 99 // QUEUES)
    assert last is not None
    cp = store.checkpoint  # written every 50 ms: it soon covers records up to 99
    assert wait_until(lambda: cp.min_timestamp(True) >= last.store_timestamp)
    for i in range(100, 110):
        put(i)
    assert store.wait_dispatched(10)
    directory = crash_copy(cfg.store_dir, tmp_path / "crashed")
    store.shutdown()
    _tear_newest_header(directory, "end_phy_not_written")
    again = MessageStore(small_config(directory, flush_mode=FlushMode.SYNC_FLUSH))
    again.start()
    try:
        assert again.recovery is not None
        assert again.recovery.scanned_from > written[84][0]  # past the previous file's end
        _assert_found_by_key(again, written)
        _assert_queues(again, written)
    finally:
        again.shutdown()


def test_a_torn_index_header_after_a_clean_stop_is_still_refused(tmp_path: Path) -> None:
    """Only a kill tears a header: after a clean stop the same bytes are corruption."""
    directory, _ = _stopped(tmp_path, crashed=False)
    _tear_newest_header(directory, "end_phy_not_written")
    again = MessageStore(small_config(directory))
    with pytest.raises(StoreCorrupted, match="not a range"):
        again.start()
    again.shutdown()


def test_deleted_topic_is_not_resurrected_by_a_rebuild(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    store, written = _fill(cfg)
    for i in range(5):
        assert store.put_message(message(100 + i, topic="Gone")).ok
    assert store.wait_dispatched(10)
    store.delete_topics(["Gone"])
    store.shutdown()
    shutil.rmtree(cfg.store_dir / "index")
    shutil.rmtree(cfg.store_dir / "consumequeue" / "TopicA" / "2")
    again = MessageStore(small_config(cfg.store_dir))
    again.start()
    try:
        assert again.topics() == ["TopicA"]
        _assert_queues(again, written)
    finally:
        again.shutdown()


def test_a_store_without_keys_is_not_reindexed_at_every_start(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    store = MessageStore(cfg)
    store.start()
    for _ in range(20):
        assert store.put_message(Message("Plain", b"x" * 50, queue_id=0)).ok
    store.shutdown()
    again = MessageStore(small_config(tmp_path))
    again.start()
    try:
        # an empty index file records that everything so far was looked at
        assert again.index.indexed_to() == again.get_commitlog_max_offset()
    finally:
        again.shutdown()


def test_a_queue_registry_is_written_for_an_older_store(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    store, written = _fill(cfg)
    store.shutdown()
    (tmp_path / QUEUE_REGISTRY_NAME).unlink()
    (tmp_path / f"{QUEUE_REGISTRY_NAME}.bak").unlink(missing_ok=True)
    again = MessageStore(small_config(tmp_path))
    again.start()
    again.shutdown()
    assert (tmp_path / QUEUE_REGISTRY_NAME).exists()
    shutil.rmtree(tmp_path / "consumequeue" / "TopicA" / "0")
    third = MessageStore(small_config(tmp_path))
    third.start()
    try:
        _assert_queues(third, written)
    finally:
        third.shutdown()


def test_an_undispatchable_record_stops_the_start(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    store, written = _fill(cfg)
    end = store.get_commitlog_max_offset()
    last = store.look_message_by_offset(written[-1][0])
    assert last is not None
    store.shutdown()
    # a record no put can make any more (its topic names no directory), written by hand
    # after the log's end, where the last start dispatched up to
    raw = bytearray(
        Path(_file_of(cfg, written[-1][0])).read_bytes()[
            written[-1][0] % cfg.mapped_file_size_commitlog :
        ][: last.store_size]
    )
    topic_at = raw.index(b"TopicA")
    raw[topic_at : topic_at + 6] = b"Top/cA"
    struct.pack_into(">qq", raw, POS_QUEUE_OFFSET, 0, end)
    struct.pack_into(">q", raw, POS_STORE_TIMESTAMP, last.store_timestamp)
    reseal(raw, 0)  # a valid record, checksum included
    size = cfg.mapped_file_size_commitlog
    assert end % size + len(raw) + 8 <= size
    with open(_file_of(cfg, end), "r+b") as f:
        f.seek(end % size)
        f.write(raw)
    again = MessageStore(small_config(tmp_path))
    with pytest.raises(DispatchStuck) as info:
        again.start()
    assert info.value.offset == end and "directory" in info.value.reason
    assert not again.running
    with pytest.raises(DispatchStuck):  # refused again, never silently: nothing was lost
        MessageStore(small_config(tmp_path)).start()


def _file_of(cfg: StoreConfig, offset: int) -> Path:
    size = cfg.mapped_file_size_commitlog
    return cfg.commitlog_dir / f"{offset - offset % size:020d}"


def test_cleanup_is_bounded_by_the_dispatchers_exact_position(tmp_path: Path) -> None:
    store, _ = _fill(small_config(tmp_path))
    try:
        assert store.cleanup._dispatched_offset is not None
        assert store.cleanup._dispatched_offset() == store.reput.reput_from_offset
        store.reput.reput_from_offset -= 1  # the cleanup follows it exactly
        assert store.cleanup._dispatched_offset() == store.reput.reput_from_offset
        store.reput.reput_from_offset += 1
    finally:
        store.shutdown()
