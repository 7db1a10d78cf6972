"""The commitlog: appends, roll-over with blank records, batches, offsets, limits."""

from __future__ import annotations

import random
from pathlib import Path

from broker.store.codec import check_message_and_return_size
from broker.store.commitlog import CommitLog
from broker.store.message import Message, PutMessageStatus, SysFlag

from ._helpers import ManualClock, message, small_config


def _open(tmp_path: Path, **kw: object) -> CommitLog:
    cl = CommitLog(small_config(tmp_path, **kw), ManualClock())
    cl.load()
    return cl


def test_round_trip_of_every_field(tmp_path: Path) -> None:
    clock = ManualClock()
    cl = CommitLog(small_config(tmp_path), clock)
    cl.load()
    msg = Message(
        "TopicZ",
        b"\x00\x01body\xff",
        queue_id=5,
        flag=77,
        properties={"KEYS": "k1 k2", "TAGS": "t", "a": "b"},
        sys_flag=int(SysFlag.TRANSACTION_COMMIT),
        born_timestamp=123456,
        born_host=("192.168.1.2", 9999),
        reconsume_times=3,
        prepared_tx_offset=42,
    )
    r = cl.put_message(msg)
    assert r.status is PutMessageStatus.PUT_OK and r.append is not None
    m = cl.look_message(r.append.wrote_offset)
    assert m is not None
    assert (m.topic, m.body, m.queue_id, m.flag, m.properties, m.sys_flag) == (
        msg.topic,
        msg.body,
        5,
        77,
        msg.properties,
        msg.sys_flag,
    )
    assert (m.born_timestamp, m.born_host, m.reconsume_times, m.prepared_tx_offset) == (
        123456,
        ("192.168.1.2", 9999),
        3,
        42,
    )
    assert (m.queue_offset, m.commitlog_offset, m.store_timestamp) == (0, 0, clock.now)
    assert m.store_host == cl.config.store_host
    assert m.store_size == r.append.wrote_bytes
    assert m.offset_msg_id == r.append.msg_id
    raw = cl.get_message(0, r.append.wrote_bytes)
    assert raw is not None and len(raw) == r.append.wrote_bytes
    cl.close()


def test_roll_over_across_many_small_files(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    cl = _open(tmp_path)
    placed = []
    for i in range(400):
        msg = message(i, queue_id=i % 3, size=rng.randrange(1, 1500))
        r = cl.put_message(msg)
        assert r.ok and r.append is not None
        placed.append((r.append.wrote_offset, msg))
    files = cl.queue.mapped_files
    assert len(files) > 20
    size = cl.file_size
    assert [mf.file_from_offset for mf in files] == [i * size for i in range(len(files))]
    # every record is where the result said, no record crosses a file boundary
    for offset, msg in placed:
        m = cl.look_message(offset)
        assert m is not None and m.body == msg.body and m.properties == msg.properties
        assert offset // size == (offset + m.store_size - 1) // size
    # every full file ends with a blank record exactly filling it
    for mf in files[:-1]:
        with mf.buffer() as buf:
            pos = 0
            while True:
                n, _ = check_message_and_return_size(buf, pos, True, mf.file_from_offset + pos)
                assert n >= 0
                if n == 0:
                    break
                pos += n
            assert pos < size
    # queue offsets are dense per queue
    per_queue: dict[int, list[int]] = {}
    for offset, _ in placed:
        m = cl.look_message(offset)
        assert m is not None
        per_queue.setdefault(m.queue_id, []).append(m.queue_offset)
    for qid, offsets in per_queue.items():
        assert offsets == list(range(len(offsets)))
        assert cl.topic_queue_table[f"TopicA-{qid}"] == len(offsets)
    cl.close()


def test_put_batch_is_contiguous(tmp_path: Path) -> None:
    cl = _open(tmp_path, mapped_file_size_commitlog=64 * 1024)
    cl.put_message(message(0))
    results = cl.put_messages([message(i, queue_id=1) for i in range(1, 30)])
    assert all(r.ok for r in results)
    offsets = [r.append.wrote_offset for r in results if r.append]
    sizes = [r.append.wrote_bytes for r in results if r.append]
    assert all(offsets[i] + sizes[i] == offsets[i + 1] for i in range(len(offsets) - 1))
    assert [r.append.queue_offset for r in results if r.append] == list(range(29))
    cl.close()


def test_every_append_wakes_replication_and_only_waking_ones_the_dispatcher(
    tmp_path: Path,
) -> None:
    """`wake=False` records (the revive log) spare the dispatcher a wake-up, never the
    replication: a slave must get every byte as it is written."""
    cl = _open(tmp_path, mapped_file_size_commitlog=64 * 1024)
    woken: list[str] = []
    cl.on_append = lambda: woken.append("dispatch")
    cl.on_any_append = lambda: woken.append("replicate")
    cl.put_message(message(0))
    cl.put_messages([message(1)])
    assert woken == ["dispatch", "replicate"] * 2
    woken.clear()
    cl.put_messages([message(2), message(3)], wake=False)
    assert woken == ["replicate"]
    cl.close()


def test_batch_with_an_illegal_message_stores_the_rest(tmp_path: Path) -> None:
    cl = _open(tmp_path)
    results = cl.put_messages([message(1), Message("", b"x"), message(2)])
    assert [r.status for r in results] == [
        PutMessageStatus.PUT_OK,
        PutMessageStatus.MESSAGE_ILLEGAL,
        PutMessageStatus.PUT_OK,
    ]
    cl.close()


def test_look_messages_reads_a_run_across_files_as_look_message_does(tmp_path: Path) -> None:
    """A batch read over many small files (each held once per run) gives, per offset,
    exactly what `look_message` gives: the record, or None for a quarantined offset, an
    offset inside a record, one past the written end, or one before the first file."""
    cl = _open(tmp_path)
    offsets = []
    for i in range(120):
        r = cl.put_message(message(i, size=300 + i))
        assert r.ok and r.append is not None
        offsets.append(r.append.wrote_offset)
    assert len(cl.queue.mapped_files) > 5
    cl.reader.quarantined = frozenset({offsets[7], offsets[50]})
    asked = [*offsets, offsets[3] + 1, cl.get_max_offset() + 64, -10, offsets[0]]
    got = cl.look_messages(asked)
    alone = [cl.look_message(o) for o in asked]
    assert got == alone
    assert [m is None for m in got] == [
        o in cl.reader.quarantined or (i >= len(offsets) and i != len(asked) - 1)
        for i, o in enumerate(asked)
    ]
    assert [m.body for m in got[:3] if m is not None] == [
        m.body for m in (cl.look_message(o) for o in offsets[:3]) if m is not None
    ]
    cl.close()


def test_transaction_prepared_and_rollback_do_not_take_queue_offsets(tmp_path: Path) -> None:
    cl = _open(tmp_path)
    a = cl.put_message(message(1))
    p = cl.put_message(Message("TopicA", b"half", sys_flag=int(SysFlag.TRANSACTION_PREPARED)))
    rb = cl.put_message(Message("TopicA", b"rb", sys_flag=int(SysFlag.TRANSACTION_ROLLBACK)))
    c = cl.put_message(Message("TopicA", b"commit", sys_flag=int(SysFlag.TRANSACTION_COMMIT)))
    assert [r.append.queue_offset for r in (a, p, rb, c) if r.append] == [0, 0, 0, 1]
    assert cl.topic_queue_table["TopicA-0"] == 2
    cl.close()


def test_too_large_and_illegal_messages_are_refused_and_not_written(tmp_path: Path) -> None:
    cl = _open(tmp_path, max_message_size=1000)
    before = cl.get_max_offset()
    assert cl.put_message(Message("T", b"x" * 1001)).status is PutMessageStatus.MESSAGE_ILLEGAL
    # fits the size limit but not a commitlog file of 8 KiB
    cl2 = _open(tmp_path / "b", max_message_size=1 << 20)
    r = cl2.put_message(Message("T", b"x" * 9000))
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL
    assert cl.put_message(Message("t" * 200, b"x")).status is PutMessageStatus.MESSAGE_ILLEGAL
    big_props = {"p": "v" * 40_000}
    assert cl2.put_message(Message("T", b"x", properties=big_props)).status is (
        PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
    )
    assert cl.get_max_offset() == before
    cl.close()
    cl2.close()


def test_store_timestamp_never_goes_back(tmp_path: Path) -> None:
    clock = ManualClock()
    cl = CommitLog(small_config(tmp_path), clock)
    cl.load()
    first = cl.put_message(message(1))
    clock.advance(-5000)
    second = cl.put_message(message(2))
    assert first.append and second.append
    assert second.append.store_timestamp == first.append.store_timestamp
    cl.close()


def test_reads_outside_the_written_range_return_none(tmp_path: Path) -> None:
    cl = _open(tmp_path)
    r = cl.put_message(message(1))
    assert r.append is not None
    assert cl.look_message(r.append.wrote_offset + r.append.wrote_bytes) is None
    assert cl.look_message(10**9) is None
    assert cl.look_message(3) is None  # not a record start
    assert cl.get_message(0, r.append.wrote_bytes + 1) is None
    cl.close()


def test_warming_in_place_never_touches_written_records(tmp_path: Path) -> None:
    cl = _open(tmp_path, warm_mapped_file=True, mapped_file_size_commitlog=4 << 20)
    cl.start()
    placed = []
    for i in range(6000):  # several files; each warmed while being written
        r = cl.put_message(message(i, size=1000))
        assert r.append is not None
        placed.append((r.append.wrote_offset, i))
    for offset, i in placed:
        m = cl.look_message(offset)
        assert m is not None and m.body == message(i, size=1000).body
    cl.shutdown()
    cl.close()


def test_concurrent_producers_get_dense_unique_offsets(tmp_path: Path) -> None:
    import threading

    cl = _open(tmp_path, warm_mapped_file=True)
    cl.start()
    results: dict[tuple[int, int], tuple[int, int]] = {}
    lock = threading.Lock()

    def producer(t: int) -> None:
        for i in range(300):
            r = cl.put_message(message(t * 1000 + i, queue_id=i % 2, size=(i * 53) % 700))
            assert r.ok and r.append is not None
            with lock:
                results[(t, i)] = (r.append.wrote_offset, r.append.queue_offset)

    threads = [threading.Thread(target=producer, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    per_queue: dict[int, list[int]] = {0: [], 1: []}
    for (t, i), (offset, qoff) in results.items():
        m = cl.look_message(offset)
        assert m is not None and m.body == message(t * 1000 + i, size=(i * 53) % 700).body
        assert m.queue_offset == qoff
        per_queue[i % 2].append(qoff)
    for offsets in per_queue.values():
        assert sorted(offsets) == list(range(len(offsets)))
    cl.shutdown()
    cl.close()


def test_a_batch_across_many_files_is_placed_like_single_puts(tmp_path: Path) -> None:
    # 8 KiB files: a batch of 120 messages rolls over many times mid-batch
    batched = _open(tmp_path / "batch")
    single = _open(tmp_path / "single")
    msgs = [message(i, queue_id=i % 3, size=40 + (i * 53) % 700) for i in range(120)]
    msgs.insert(7, Message("TopicA", b"half", sys_flag=int(SysFlag.TRANSACTION_PREPARED)))
    results = batched.put_messages(msgs)
    expected = [single.put_message(m) for m in msgs]
    assert all(r.ok for r in results)
    assert [
        (r.append.wrote_offset, r.append.wrote_bytes, r.append.queue_offset, r.append.msg_id)
        for r in results
        if r.append
    ] == [
        (r.append.wrote_offset, r.append.wrote_bytes, r.append.queue_offset, r.append.msg_id)
        for r in expected
        if r.append
    ]
    assert len(batched.queue.mapped_files) > 5
    for r, m in zip(results, msgs, strict=True):
        assert r.append is not None
        got = batched.look_message(r.append.wrote_offset)
        assert got is not None and (got.body, got.queue_offset) == (m.body, r.append.queue_offset)
        raw = batched.get_message(r.append.wrote_offset, r.append.wrote_bytes)
        assert raw is not None
        assert check_message_and_return_size(raw, 0, True, r.append.wrote_offset)[0] == len(raw)
    assert batched.topic_queue_table == single.topic_queue_table
    after = batched.put_message(message(999, queue_id=0))
    assert after.append is not None and after.append.queue_offset == 40
    batched.close()
    single.close()


def test_warm_ahead_touches_a_window_ahead_of_the_writer(tmp_path: Path) -> None:
    import time

    mib = 1 << 20
    cl = _open(
        tmp_path,
        warm_mapped_file=True,
        mapped_file_size_commitlog=64 * mib,
        warm_ahead_bytes=2 * mib,
    )
    cl.start()
    mf = cl.queue.get_last_mapped_file(0, create=True)
    assert mf is not None
    cl.put_message(message(0, size=1000))

    def settled(at_least: int) -> int:
        deadline = time.monotonic() + 10
        while (mf.warming or mf.warmed_to < at_least) and time.monotonic() < deadline:
            time.sleep(0.005)
        return mf.warmed_to

    # a fresh file: only the window ahead of the write position, not the whole file
    assert 2 * mib <= settled(2 * mib) <= 3 * mib
    assert not mf.warmed
    placed = []
    for i in range(3000):  # ~3 MiB: the window moves along with the writer
        r = cl.put_message(message(i, size=1000))
        assert r.append is not None
        placed.append((r.append.wrote_offset, i))
    assert settled(mf.wrote_position + mib) >= mf.wrote_position + mib
    assert mf.warmed_to <= mf.wrote_position + 3 * mib
    for offset, i in placed:  # warming never changed a written byte
        m = cl.look_message(offset)
        assert m is not None and m.body == message(i, size=1000).body
    cl.shutdown()
    cl.close()
