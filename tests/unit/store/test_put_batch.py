"""MessageStore.put_batch: N records of one topic/queue written as one batch.

Batch records must be ordinary records: the same bytes as single puts but for offsets and
store time, readable by offset, queue, key and unique key, after roll-over and recovery.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.store import batch as batch_module
from broker.store.codec import (
    END_FILE_MIN_BLANK_LENGTH,
    POS_CRC,
    POS_PHYSICAL_OFFSET,
    POS_QUEUE_OFFSET,
    POS_STORE_TIMESTAMP,
    check_message_and_return_size,
)
from broker.store.config import SHIPPED_WATERMARKS, FlushMode, StoreConfig
from broker.store.mapped_file import MappedFile
from broker.store.message import Message, MessageExt, PutMessageStatus, SysFlag
from broker.store.store import MessageStore
from protocol.props import Prop

from ._helpers import commitlog_files, crash_copy, message, small_config

SHARED = {Prop.TAGS: "tagB", "color": "blue"}
BORN = 1_700_000_000_000
HOST = ("10.0.0.7", 4321)


@pytest.fixture(autouse=True, params=["native", "python"])
def encoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs on the compiled encoder and on the Python one."""
    if request.param == "native":
        assert batch_module.COMPILED, (
            "broker/store/_recordpack.c is not built: `pip install -e .` with a C compiler"
        )
        monkeypatch.setattr(batch_module, "NATIVE", True)
    else:
        monkeypatch.setattr(batch_module, "NATIVE", False)
    return str(request.param)


def _disk(_path: Path) -> float:
    """A disk well below the watermarks, whatever the host's disk is."""
    return 0.5


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    s = MessageStore(small_config(tmp_path), disk_usage=_disk)
    s.start()
    yield s
    s.shutdown()


def _bodies(n: int, size: int = 60, seed: int = 0) -> list[bytes]:
    return [(f"b{seed}-{i}-".encode() * (size // 4 + 1))[: size + i % 7] for i in range(n)]


def _put(
    store: MessageStore,
    bodies: list[bytes],
    queue_id: int = 0,
    start: int = 0,
    topic: str = "TopicB",
) -> list[int]:
    """Put a batch with per-message keys/unique keys; the records' commitlog offsets."""
    n = len(bodies)
    r = store.put_batch(
        topic,
        queue_id,
        bodies,
        SHARED,
        keys=[f"k{start + i} all" for i in range(n)],
        uniq_keys=[f"U{start + i:06d}" for i in range(n)],
        flag=7,
        born_timestamp=BORN,
        born_host=HOST,
    )
    assert r.status is PutMessageStatus.PUT_OK and r.append is not None
    assert r.append.msg_num == n
    assert store.wait_dispatched(10)
    offsets = []
    q = r.append.queue_offset
    for i in range(n):
        m = store.get_message_by_queue_offset(topic, queue_id, q + i)
        assert m is not None and m.body == bodies[i]
        offsets.append(m.commitlog_offset)
    assert offsets[0] == r.append.wrote_offset
    assert r.append.record_offsets == offsets  # across roll-overs too
    assert [r.append.msg_id_at(o) for o in offsets] == [
        store.look_message_by_offset(o).offset_msg_id for o in offsets
    ]  # type: ignore[union-attr]
    assert offsets[-1] + _size(store, offsets[-1]) == r.append.wrote_offset + r.append.wrote_bytes
    return offsets


def _size(store: MessageStore, offset: int) -> int:
    m = store.look_message_by_offset(offset)
    assert m is not None
    return m.store_size


def _single(i: int, body: bytes, queue_id: int = 0) -> Message:
    props = {**SHARED, Prop.KEYS: f"k{i} all", Prop.UNIQ_KEY: f"U{i:06d}"}
    return Message(
        topic="TopicB",
        body=body,
        queue_id=queue_id,
        flag=7,
        properties=props,
        born_timestamp=BORN,
        born_host=HOST,
    )


def _raw(store: MessageStore, m: MessageExt) -> bytes:
    raw = store.commitlog.get_message(m.commitlog_offset, m.store_size)
    assert raw is not None
    # a valid record, whole-record checksum included; then compare without what differs
    # between two puts (offsets, store time, and the checksum covering them)
    assert check_message_and_return_size(raw, 0, True, m.commitlog_offset)[0] == len(raw)
    masked = bytearray(raw)
    for pos, n in (
        (POS_CRC, 4),
        (POS_QUEUE_OFFSET, 8),
        (POS_PHYSICAL_OFFSET, 8),
        (POS_STORE_TIMESTAMP, 8),
    ):
        masked[pos : pos + n] = bytes(n)
    return bytes(masked)


def test_batch_records_equal_single_put_records(store: MessageStore) -> None:
    bodies = _bodies(5)
    singles = [store.put_message(_single(i, b)) for i, b in enumerate(bodies)]
    assert all(r.ok for r in singles)
    offsets = _put(store, bodies)
    for i, off in enumerate(offsets):
        single_off = singles[i].append.wrote_offset  # type: ignore[union-attr]
        a = store.look_message_by_offset(single_off)
        b = store.look_message_by_offset(off)
        assert a is not None and b is not None
        assert _raw(store, a) == _raw(store, b)
        assert b.queue_offset == 5 + i and b.commitlog_offset == off
        assert (
            b.topic,
            b.body,
            b.queue_id,
            b.flag,
            b.properties,
            b.sys_flag,
            b.born_timestamp,
            b.born_host,
            b.reconsume_times,
            b.prepared_tx_offset,
            b.store_host,
        ) == (
            a.topic,
            a.body,
            a.queue_id,
            a.flag,
            a.properties,
            a.sys_flag,
            a.born_timestamp,
            a.born_host,
            a.reconsume_times,
            a.prepared_tx_offset,
            a.store_host,
        )
        assert b.store_timestamp >= a.store_timestamp
    got = store.get_messages("g", "TopicB", 0, 0, 100, tags={"tagB"})
    assert [m.queue_offset for m in got.messages] == list(range(10))


def test_shared_properties_only_and_queue_offsets_continue(store: MessageStore) -> None:
    r1 = store.put_batch("TopicB", 1, [b"x", b"yy", b"zzz"], {"a": "1"})
    r2 = store.put_batch("TopicB", 1, [b"w"])
    assert r1.ok and r2.ok and r1.append is not None and r2.append is not None
    assert (r1.append.queue_offset, r1.append.msg_num) == (0, 3)
    assert (r2.append.queue_offset, r2.append.msg_num) == (3, 1)
    assert store.wait_dispatched(10)
    got = store.get_messages("g", "TopicB", 1, 0, 10)
    assert [m.body for m in got.messages] == [b"x", b"yy", b"zzz", b"w"]
    assert [m.properties for m in got.messages] == [{"a": "1"}] * 3 + [{}]


def test_roll_over_across_small_files(store: MessageStore) -> None:
    written: list[tuple[int, bytes]] = []
    for k in range(6):  # ~40 KiB of records in 8 KiB files: batches span files
        bodies = _bodies(25, size=200, seed=k)
        offsets = _put(store, bodies, start=100 * k)
        written += list(zip(offsets, bodies, strict=True))
    assert len(commitlog_files(store.config.store_dir)) >= 5
    got = store.get_messages("g", "TopicB", 0, 0, 1000)
    assert [(m.commitlog_offset, m.body) for m in got.messages] == written
    assert [m.queue_offset for m in got.messages] == list(range(150))
    size = store.config.mapped_file_size_commitlog
    for m in got.messages:  # no record crosses a file boundary
        assert m.commitlog_offset // size == (m.commitlog_offset + m.store_size - 1) // size


def test_queries_by_key_and_unique_key(store: MessageStore) -> None:
    offsets = _put(store, _bodies(8))
    for i, off in enumerate(offsets):
        assert [h.commitlog_offset for h in store.query_message_by_key("TopicB", f"k{i}")] == [off]
        u = store.query_message_by_unique_key("TopicB", f"U{i:06d}")
        assert u is not None and u.commitlog_offset == off
    assert len(store.query_message_by_key("TopicB", "all")) == 8


@pytest.mark.parametrize("mode", [FlushMode.ASYNC_FLUSH, FlushMode.SYNC_FLUSH])
def test_recovery_after_abnormal_stop(tmp_path: Path, mode: FlushMode) -> None:
    cfg = small_config(tmp_path / "live", flush_mode=mode)
    store = MessageStore(cfg, disk_usage=_disk)
    store.start()
    written: list[tuple[int, bytes]] = []
    for k in range(5):
        bodies = _bodies(20, size=150, seed=k)
        written += list(zip(_put(store, bodies, start=100 * k), bodies, strict=True))
    copy = crash_copy(cfg.store_dir, tmp_path / "crashed")
    store.shutdown()
    again = MessageStore(small_config(copy, flush_mode=mode), disk_usage=_disk)
    again.start()
    try:
        assert again.recovery is not None and again.recovery.abnormal
        assert not again.recovery.torn_tail
        got = again.get_messages("g", "TopicB", 0, 0, 1000)
        assert [(m.commitlog_offset, m.body) for m in got.messages] == written
        u = again.query_message_by_unique_key("TopicB", "U000419")
        assert u is not None and u.commitlog_offset == written[-1][0]
        r = again.put_batch("TopicB", 0, [b"after"])
        assert r.ok and r.append is not None and r.append.queue_offset == 100
    finally:
        again.shutdown()


def _limited(tmp_path: Path) -> StoreConfig:
    return small_config(tmp_path, max_message_size=1000)


def test_refused_batches_store_nothing(tmp_path: Path) -> None:
    store = MessageStore(_limited(tmp_path), disk_usage=_disk)
    store.start()
    try:
        too_big = store.put_batch("TopicB", 0, [b"x" * 300] * 4)  # 1200+ bytes in all
        one_big = store.put_batch("TopicB", 0, [b"x" * 1001])
        assert too_big.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert one_big.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert store.put_batch("TopicB", 0, []).status is PutMessageStatus.MESSAGE_ILLEGAL
        assert store.put_batch("", 0, [b"x"]).status is PutMessageStatus.MESSAGE_ILLEGAL
        assert store.put_batch("TopicB", -1, [b"x"]).status is PutMessageStatus.MESSAGE_ILLEGAL
        bad_key = store.put_batch("TopicB", 0, [b"x", b"y"], keys=["a", "b\x02"])
        assert bad_key.status is PutMessageStatus.MESSAGE_ILLEGAL
        short = store.put_batch("TopicB", 0, [b"x", b"y"], uniq_keys=["only-one"])
        assert short.status is PutMessageStatus.MESSAGE_ILLEGAL
        twice = store.put_batch("TopicB", 0, [b"x"], {Prop.UNIQ_KEY: "u"}, uniq_keys=["v"])
        assert twice.status is PutMessageStatus.MESSAGE_ILLEGAL
        not_bytes = store.put_batch("TopicB", 0, ["text"])  # type: ignore[list-item]
        assert not_bytes.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert store.get_commitlog_max_offset() == 0
        ok = store.put_batch("TopicB", 0, [b"x" * 300] * 2)
        assert ok.ok and ok.append is not None and ok.append.queue_offset == 0
    finally:
        store.shutdown()


def test_disk_full_and_not_running_refuse(tmp_path: Path) -> None:
    store = MessageStore(
        small_config(tmp_path, **SHIPPED_WATERMARKS), disk_usage=lambda _path: 0.95
    )
    store.start()
    assert store.put_batch("TopicB", 0, [b"x"]).status is PutMessageStatus.DISK_FULL
    store.shutdown()
    assert store.put_batch("TopicB", 0, [b"x"]).status is (PutMessageStatus.SERVICE_NOT_AVAILABLE)


def test_prepared_transaction_batch_takes_no_queue_offset(store: MessageStore) -> None:
    r = store.put_batch("TopicB", 0, [b"a", b"b"], sys_flag=int(SysFlag.TRANSACTION_PREPARED))
    assert r.ok and r.append is not None and r.append.queue_offset == 0
    assert store.wait_dispatched(10)
    assert store.get_max_offset_in_queue("TopicB", 0) == 0
    m = store.look_message_by_offset(r.append.wrote_offset)
    assert m is not None and m.body == b"a" and m.sys_flag == int(SysFlag.TRANSACTION_PREPARED)


def _encode(bodies: list[object], **kw: object) -> tuple[bytes, list[tuple[int, int, int]]] | str:
    """The records as placed into a buffer, first up to half of it (as at a file's end),
    then the rest, and each `place` call's answer; or the refusal's status."""
    args: dict[str, object] = dict(
        topic="TopicB",
        queue_id=3,
        bodies=bodies,
        properties=SHARED,
        keys=None,
        uniq_keys=None,
        flag=7,
        sys_flag=0,
        born_timestamp=BORN,
        born_host=HOST,
        store_host_raw=b"\x0a\x00\x00\x01\x00\x00\x2a\x93",
        max_message_size=4000,
        max_record=6000,
    )
    args.update(kw)
    try:
        b, _key = batch_module.encode_batch(**args)  # type: ignore[arg-type]
    except batch_module.EncodeError as exc:
        return f"{exc.status.name}"
    out = bytearray(b"\xee" * (b.total + 10))
    answers = [b.place(out, 5, 5 + b.total // 2, 40, 1, 1_000_000, BORN + 5)]  # a file's end
    answers.append(b.place(out, answers[0][1], len(out), answers[0][2], 1, 1_000_000, BORN + 6))
    answers.append(b.place(out, answers[1][1], len(out), 0, 1, 0, 0))  # nothing left
    assert b.next_size() == 0 and answers[-1][0] == 0
    return bytes(out), answers


def test_compiled_and_python_encoders_agree_byte_for_byte(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    import random

    rng = random.Random(seed)
    assert batch_module.COMPILED, "the compiled encoder is not built"
    cases: list[tuple[list[object], dict[str, object]]] = []
    for _ in range(300):
        n = rng.randint(1, 12)
        bodies: list[object] = [rng.randbytes(rng.choice([0, 1, 5, 100, 700])) for _ in range(n)]
        kw: dict[str, object] = {}
        if rng.random() < 0.6:
            kw["keys"] = [rng.choice(["k", "order-1 order-2", "ключ", "x" * 300]) for _ in range(n)]
        if rng.random() < 0.6:
            kw["uniq_keys"] = [f"U{rng.getrandbits(64):016X}" for _ in range(n)]
        if rng.random() < 0.3:
            kw["properties"] = {} if rng.random() < 0.5 else {"p": "v" * rng.randint(0, 9000)}
        if rng.random() < 0.1:
            kw["sys_flag"] = int(SysFlag.TRANSACTION_PREPARED)
        cases.append((bodies, kw))
    # refusals must agree too: separators, wrong counts, types, sizes
    cases += [
        ([b"a", b"b"], {"keys": ["a", "b\x01"]}),
        ([b"a"], {"uniq_keys": ["\x02"]}),
        ([b"a", b"b"], {"keys": ["only one"]}),
        ([b"a"], {"keys": [7]}),
        ([b"a"], {"keys": ["\udc80"]}),
        ([b"a"], {"properties": {"p": "v" * 32767}}),
        ([b"x" * 3900], {"keys": ["k" * 200]}),
        ([b"x" * 1000] * 5, {}),
        ([bytearray(b"bytes-like"), memoryview(b"too")], {"keys": ["a", "b"]}),
        (["text"], {}),
    ]
    for bodies, kw in cases:
        monkeypatch.setattr(batch_module, "NATIVE", True)
        native = _encode(bodies, **kw)
        monkeypatch.setattr(batch_module, "NATIVE", False)
        python = _encode(bodies, **kw)
        assert native == python, (bodies[:2], kw)


@pytest.mark.parametrize("mode", [FlushMode.SYNC_FLUSH, FlushMode.ASYNC_FLUSH])
def test_under_sync_flush_every_byte_enters_through_the_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: FlushMode
) -> None:
    """SYNC_FLUSH: single records, batches and the blank records of roll-overs go in with
    `pwrite`, none through the mapping (a copy into the mapping dirties a whole page-cache
    folio, which each put's fdatasync then writes back: `MappedFile.pwrite`). ASYNC_FLUSH
    copies into the mapping. Either way the mapping's readers and a reopened store see
    the same records."""
    written: list[int] = []
    real = MappedFile.pwrite

    def counted(self: MappedFile, position: int, data: bytes | bytearray | memoryview) -> None:
        written.append(len(memoryview(data)))
        real(self, position, data)

    monkeypatch.setattr(MappedFile, "pwrite", counted)
    cfg = small_config(tmp_path, flush_mode=mode)
    store = MessageStore(cfg, disk_usage=_disk)
    store.start()
    singles = []
    for i in range(6):
        r = store.put_message(message(i, topic="TopicB", queue_id=1, size=300))
        assert r.status is PutMessageStatus.PUT_OK and r.append is not None
        singles.append(r.append.wrote_offset)
    batched = _put(store, _bodies(100, size=200), queue_id=1)  # rolls over several files
    end = store.commitlog.get_max_offset()
    assert end > 3 * cfg.mapped_file_size_commitlog
    seen = {o: store.look_message_by_offset(o) for o in singles + batched}
    records = sum(m.store_size for m in seen.values() if m is not None)
    rolls = len(commitlog_files(tmp_path)) - 1
    if mode is FlushMode.SYNC_FLUSH:
        # every record once, and each file's closing blank record (8 bytes)
        assert sum(written) == records + END_FILE_MIN_BLANK_LENGTH * rolls
    else:
        assert written == []
    store.shutdown()
    reopened = MessageStore(cfg, disk_usage=_disk)
    reopened.start()
    try:
        assert reopened.commitlog.get_max_offset() == end
        for offset, before in seen.items():
            after = reopened.look_message_by_offset(offset)
            assert before is not None and after is not None
            assert (after.body, after.queue_offset) == (before.body, before.queue_offset)
    finally:
        reopened.shutdown()
