"""Hash index files: several keys per message, collisions, roll-over, time ranges,
truncation, expiry, and foreign/corrupt files rejected."""

from __future__ import annotations

import functools
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import pytest

from broker.store.codec import DispatchRequest
from broker.store.config import StoreConfig
from broker.store.errors import ForeignFile, StoreCorrupted
from broker.store.index_file import (
    INDEX_ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    index_file_name,
    parse_index_file_name,
)
from broker.store.index_key import index_key_hash, topic_key_hash
from broker.store.index_service import IndexService

T0 = 1_763_790_000_000  # a store timestamp in ms


def req(
    phy: int, keys: str = "", uniq: str | None = None, *, topic: str = "orders", ts: int = T0
) -> DispatchRequest:
    return DispatchRequest(
        topic=topic,
        queue_id=0,
        commitlog_offset=phy,
        msg_size=100,
        tags_code=0,
        store_timestamp=ts,
        queue_offset=0,
        keys=keys,
        uniq_key=uniq,
        sys_flag=0,
        prepared_tx_offset=0,
    )


def service(
    tmp_path: Path,
    slots: int = 64,
    entries: int = 1000,
    *,
    max_results: int = 64,
    clock_ms: int = T0,
) -> IndexService:
    config = StoreConfig(
        store_dir=tmp_path,
        max_hash_slot_num=slots,
        max_index_num=entries,
        max_query_results=max_results,
    )
    svc = IndexService(config, clock=lambda: clock_ms)
    svc.load(last_exit_ok=True)
    return svc


def everything(svc: IndexService, key: str, topic: str = "orders") -> list[int]:
    return list(svc.iter_offsets(topic, key, 0, 2**62))


# two keys whose index hashes collide under topic "orders" (found by a birthday search)
A, B = "k3985819", "k4420602"


def test_index_key_hash_is_masked_crc32_of_the_utf8_key() -> None:
    import zlib

    for key in ("", "hello", "orders#k", "中文", "x" * 1000):
        assert index_key_hash(key) == zlib.crc32(key.encode()) & 0x7FFFFFFF
    assert index_key_hash(f"orders#{A}") == index_key_hash(f"orders#{B}")


def test_prefix_cached_hash_equals_the_full_key_hash(seed: int) -> None:
    import random

    rng = random.Random(seed)
    alphabet = "abcXYZ019#-_ é中文\u00ff\uffee"
    for _ in range(500):
        topic = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 30)))
        key = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 300)))
        assert topic_key_hash(topic, key) == index_key_hash(f"{topic}#{key}")


def test_message_with_several_keys_is_found_by_each(tmp_path: Path) -> None:
    svc = service(tmp_path)
    svc.dispatch(req(0, "k1"))
    svc.dispatch(req(100, "order-1 customer-7  invoice-9", uniq="UNIQ-1"))
    svc.dispatch(req(200, "customer-7"))
    assert everything(svc, "order-1") == [100]
    assert everything(svc, "invoice-9") == [100]
    assert everything(svc, "UNIQ-1") == [100]
    assert everything(svc, "customer-7") == [200, 100]  # newest first
    assert everything(svc, "k1") == [0]
    assert everything(svc, "nope") == []
    assert everything(svc, "order-1", topic="other") == []  # keys are per topic
    assert svc.files[0].entry_count == 6


def test_tiny_slot_count_keeps_keys_apart_by_full_hash(tmp_path: Path) -> None:
    svc = service(tmp_path, slots=2)  # every chain is shared by half of all keys
    for i in range(200):
        svc.dispatch(req(i * 100, f"key-{i} shared"))
    for i in range(200):
        assert everything(svc, f"key-{i}") == [i * 100]
    assert len(everything(svc, "shared")) == 200


def test_same_hash_different_key_is_returned_for_the_exact_filter(tmp_path: Path) -> None:
    # the index cannot tell A from B (same hash): broker.store.query drops the impostor
    svc = service(tmp_path, slots=4)
    svc.dispatch(req(0, A))
    svc.dispatch(req(100, B))
    assert everything(svc, A) == [100, 0]


def test_rolls_to_a_new_file_when_full_and_queries_all_files(tmp_path: Path) -> None:
    svc = service(tmp_path, slots=8, entries=5)  # 4 entries a file
    for i in range(30):
        svc.dispatch(req(i * 100, f"k{i} even" if i % 2 == 0 else f"k{i}", ts=T0 + i * 1000))
    names = [f.path.name for f in svc.files]
    assert names == sorted(names) and len(set(names)) == len(names)
    assert len(names) == 12  # 45 entries, 4 a file
    assert names[0] == index_file_name(T0)
    for i in range(30):
        assert everything(svc, f"k{i}") == [i * 100]
    assert everything(svc, "even") == [i * 100 for i in range(28, -1, -2)]
    svc.shutdown()
    again = service(tmp_path, slots=8, entries=5)
    assert everything(again, "even") == [i * 100 for i in range(28, -1, -2)]
    again.dispatch(req(3000, "k30"))
    assert everything(again, "k30") == [3000]


def test_results_are_capped(tmp_path: Path) -> None:
    svc = service(tmp_path, slots=16, entries=100, max_results=10)
    for i in range(50):
        svc.dispatch(req(i * 100, "hot"))
    # a bounded scan: at most max_scan entries visited whatever the chain length
    assert len(list(svc.iter_offsets("orders", "hot", 0, 2**62, max_scan=7))) == 7


def test_time_range_filters_files_and_entries(tmp_path: Path) -> None:
    svc = service(tmp_path, slots=8, entries=6)
    for i in range(20):  # one message a minute
        svc.dispatch(req(i * 100, "k", ts=T0 + i * 60_000))
    minute = 60_000
    got = list(svc.iter_offsets("orders", "k", T0 + 5 * minute, T0 + 9 * minute))
    assert got == [900, 800, 700, 600, 500]
    # entry times are kept to the second: a bound inside that second still matches
    assert list(svc.iter_offsets("orders", "k", T0 + 3 * minute + 500, T0 + 3 * minute + 600)) == [
        300
    ]
    assert list(svc.iter_offsets("orders", "k", T0 + 100 * minute, T0 + 200 * minute)) == []


def test_redispatch_after_recovery_adds_nothing(tmp_path: Path) -> None:
    svc = service(tmp_path)
    for i in range(5):
        svc.dispatch(req(i * 100, f"k{i}"))
    before = svc.files[0].entry_count
    for i in range(4):
        svc.dispatch(req(i * 100, f"k{i}"))
    assert svc.files[0].entry_count == before
    assert everything(svc, "k2") == [200]


def _body(svc: IndexService) -> list[bytes]:
    out = []
    for f in svc.files:
        svc.flush()
        raw = f.path.read_bytes()
        out.append(raw[INDEX_HEADER_SIZE:])
    return out


@pytest.mark.parametrize("cut", [0, 100, 1300, 2000, 2950])
def test_truncate_dirty_undoes_exactly_the_tail(tmp_path: Path, cut: int) -> None:
    reqs = [req(i * 100, f"k{i % 7} id{i}", uniq=f"u{i}", ts=T0 + i) for i in range(30)]
    full = service(tmp_path / "a", slots=3, entries=25)
    for r in reqs:
        full.dispatch(r)
    full.truncate_dirty(cut)
    ref = service(tmp_path / "b", slots=3, entries=25)
    for r in reqs:
        if r.commitlog_offset < cut:
            ref.dispatch(r)
    # the slots and entries are byte for byte those of an index that never saw the tail
    assert _body(full) == _body(ref)
    for i in range(30):
        assert everything(full, f"id{i}") == ([i * 100] if i * 100 < cut else [])
    full.dispatch(reqs[-1])  # the dispatcher re-indexes from the cut
    assert everything(full, "id29") == [2900]


def test_delete_expired_files_never_the_newest(tmp_path: Path) -> None:
    svc = service(tmp_path, slots=8, entries=5)
    for i in range(12):  # 3 files: entries for 0..3, 4..7, 8..11
        svc.dispatch(req(i * 100, f"k{i}"))
    assert len(svc.files) == 3
    assert svc.delete_expired_file(commitlog_min_offset=300) == 0  # file 0 ends at 300
    assert svc.delete_expired_file(commitlog_min_offset=301) == 1
    assert everything(svc, "k0") == [] and everything(svc, "k4") == [400]
    assert svc.delete_expired_file(commitlog_min_offset=10**9) == 1
    assert len(svc.files) == 1 and everything(svc, "k11") == [1100]
    assert sorted(p.name for p in (tmp_path / "index").iterdir()) == [svc.files[0].path.name]


def test_foreign_index_files_are_rejected(tmp_path: Path) -> None:
    svc = service(tmp_path, slots=8, entries=10)
    svc.dispatch(req(0, "k"))
    svc.shutdown()
    index_dir = tmp_path / "index"
    stray = index_dir / "00000000000000000000"
    stray.write_bytes(b"x")
    with pytest.raises(ForeignFile, match="yyyyMMddHHmmssSSS") as info:
        service(tmp_path, slots=8, entries=10)
    assert info.value.path == stray
    stray.unlink()
    bad_time = index_dir / "20261399999999999"
    bad_time.write_bytes(b"x")
    with pytest.raises(ForeignFile, match="valid time"):
        service(tmp_path, slots=8, entries=10)
    bad_time.unlink()
    # the same file read with other sizes configured is not silently misread
    with pytest.raises(ForeignFile, match="hash slots"):
        service(tmp_path, slots=16, entries=10)
    assert everything(service(tmp_path, slots=8, entries=10), "k") == [0]


def test_corrupt_index_headers_and_slots_are_rejected(tmp_path: Path) -> None:
    svc = service(tmp_path, slots=8, entries=10)
    svc.dispatch(req(0, "a b c"))
    svc.shutdown()
    path = next((tmp_path / "index").iterdir())
    good = path.read_bytes()

    path.write_bytes(good[:36] + struct.pack(">i", 11) + good[40:])  # index count > max
    with pytest.raises(StoreCorrupted, match="index count") as info:
        service(tmp_path, slots=8, entries=10)
    assert info.value.path == path

    slot = INDEX_HEADER_SIZE + 4 * 3
    for outside in (10, -1):  # past the file's last entry, or negative: no crash does that
        path.write_bytes(good[:slot] + struct.pack(">i", outside) + good[slot + 4 :])
        with pytest.raises(StoreCorrupted, match="hash slot"):
            service(tmp_path, slots=8, entries=10)

    last = INDEX_HEADER_SIZE + 8 * 4 + 3 * INDEX_ENTRY_SIZE + 4
    path.write_bytes(good[:last] + struct.pack(">q", 12345) + good[last + 8 :])
    with pytest.raises(StoreCorrupted, match="last entry"):
        service(tmp_path, slots=8, entries=10)


def test_index_file_names_round_trip() -> None:
    for ms in (0, T0, T0 + 999, 4_102_444_800_000):
        assert parse_index_file_name(Path(index_file_name(ms))) == ms


def test_written_regions_have_disk_blocks_before_they_are_written(tmp_path: Path) -> None:
    # a store into a sparse hole on a full disk is a SIGBUS; reserved blocks make it an
    # OSError the dispatcher retries
    slots, entries = 1024, 400_000  # 8 MB of entries: more than one reservation chunk
    svc = service(tmp_path, slots=slots, entries=entries)
    svc.dispatch(req(0, "k0"))
    path = svc.files[0].path
    size = path.stat().st_size
    assert size == INDEX_HEADER_SIZE + slots * 4 + entries * INDEX_ENTRY_SIZE
    allocated = path.stat().st_blocks * 512
    assert INDEX_HEADER_SIZE + slots * 4 <= allocated < size  # still sparse beyond
    for i in range(1, 250_000 // 50):
        svc.dispatch(req(i * 100, " ".join(f"k{i}-{j}" for j in range(50))))
    used = INDEX_HEADER_SIZE + slots * 4 + svc.files[0].index_count * INDEX_ENTRY_SIZE
    assert path.stat().st_blocks * 512 >= used
    assert everything(svc, "k4000-7") == [400_000]


# --- crash consistency: a SIGKILL keeps every store made through the mapping so far ------


def test_slot_written_before_the_header_count_is_a_crash_leftover(tmp_path: Path) -> None:
    """The state the crash suite found: an entry and its slot written, the header's index
    count not yet: the file loads, the slot leads back to its chain's counted entries."""
    svc = service(tmp_path, slots=1, entries=10)  # one slot: every key shares one chain
    for i in range(3):
        svc.dispatch(req(i * 100, f"k{i}"))
    svc.shutdown()
    path = next((tmp_path / "index").iterdir())
    raw = bytearray(path.read_bytes())
    count = struct.unpack_from(">i", raw, 36)[0]
    assert count == 4
    # what the old put_hashes did before it was killed: entry 4, then slot 0 -> 4
    key_hash = topic_key_hash("orders", "k3")
    struct.pack_into(
        ">iqii", raw, INDEX_HEADER_SIZE + 4 + count * INDEX_ENTRY_SIZE, key_hash, 300, 0, 3
    )
    struct.pack_into(">i", raw, INDEX_HEADER_SIZE, count)
    path.write_bytes(bytes(raw))

    svc = service(tmp_path, slots=1, entries=10)
    assert svc.files[0].entry_count == 3
    assert struct.unpack_from(">i", svc.files[0]._mm, INDEX_HEADER_SIZE)[0] == 3
    for i in range(3):
        assert everything(svc, f"k{i}") == [i * 100]
    assert everything(svc, "k3") == []
    svc.dispatch(req(300, "k3"))  # recovery re-indexes from the newest indexed record
    assert [everything(svc, f"k{i}") for i in range(4)] == [[0], [100], [200], [300]]


class _Killed(BaseException):
    """Stands for SIGKILL: stops the writer between two statements, nothing else runs."""


def _kill_at(step: int, fn: Callable[[], object]) -> bool:
    """Run `fn`, stopping it at its `step`-th line inside the index file's write paths
    (put_hashes, truncate, header write); True when it was stopped."""
    from broker.store.index_file import IndexFile

    codes = {
        IndexFile.put_hashes.__code__,
        IndexFile.put_records.__code__,
        IndexFile._put_entries.__code__,
        IndexFile.truncate.__code__,
        IndexFile._write_header.__code__,
    }
    seen = [0]

    def local(frame: FrameType, event: str, arg: object) -> object:
        if event == "line":
            seen[0] += 1
            if seen[0] == step:
                raise _Killed
        return local

    def tracer(frame: FrameType, event: str, arg: object) -> object:
        return local if event == "call" and frame.f_code in codes else None

    sys.settrace(tracer)
    try:
        fn()
    except _Killed:
        return True
    finally:
        sys.settrace(None)
    return False


def _abandon(svc: IndexService) -> None:
    """Drop the mappings without writing anything more (the process is gone)."""
    for f in svc.files:
        f.close()


def _reindex_from_newest(svc: IndexService, reqs: list[DispatchRequest]) -> None:
    """What recovery does: re-dispatch from the newest indexed record on."""
    newest = svc.get_max_phy_offset()
    for r in reqs:
        if r.commitlog_offset >= newest:
            svc.dispatch(r)


def _crash_reqs() -> list[DispatchRequest]:
    # 2 slots, 3 keys a record and 7 entries a file: shared chains, several keys of one
    # record in one slot, records split across a roll-over
    return [req(i * 100, f"k{i % 5} id{i}", uniq=f"u{i}", ts=T0 + i * 700) for i in range(12)]


@pytest.mark.parametrize(("victim", "entries"), [(0, 7), (2, 7), (5, 7), (11, 7), (1, 6), (3, 6)])
def test_a_kill_anywhere_in_put_hashes_leaves_a_loadable_complete_index(
    tmp_path: Path, victim: int, entries: int
) -> None:
    # entries=6: 5 a file, so records 1 and 3 have their keys split across two files
    reqs = _crash_reqs()
    step = 1
    while True:
        root = tmp_path / f"step{step}"
        svc = service(root, slots=2, entries=entries)
        for r in reqs[:victim]:
            svc.dispatch(r)
        killed = _kill_at(step, functools.partial(svc.dispatch, reqs[victim]))
        _abandon(svc)
        svc = service(root, slots=2, entries=entries)  # never StoreCorrupted
        _reindex_from_newest(svc, reqs[: victim + 1])
        for i in range(victim + 1):
            assert everything(svc, f"id{i}") == [i * 100], (step, i)
            assert everything(svc, f"u{i}") == [i * 100], (step, i)
        for k in range(5):
            assert everything(svc, f"k{k}") == [
                i * 100 for i in range(victim, -1, -1) if i % 5 == k
            ], (step, k)
        _abandon(svc)
        if not killed:
            break
        step += 1
    assert step > 10  # every line of the write path was a kill point


@pytest.mark.parametrize(("first", "entries"), [(0, 7), (3, 7), (1, 6), (6, 50)])
def test_a_kill_anywhere_in_a_batch_dispatch_leaves_a_loadable_complete_index(
    tmp_path: Path, first: int, entries: int
) -> None:
    # the dispatcher's batches: four records at once, header and slots written once
    reqs = _crash_reqs()
    batch = reqs[first : first + 4]
    step = 1
    while True:
        root = tmp_path / f"step{step}"
        svc = service(root, slots=2, entries=entries)
        for r in reqs[:first]:
            svc.dispatch(r)
        killed = _kill_at(step, functools.partial(svc.dispatch_batch, batch))
        _abandon(svc)
        svc = service(root, slots=2, entries=entries)  # never StoreCorrupted
        last = first + len(batch) - 1
        _reindex_from_newest(svc, reqs[: last + 1])
        for i in range(last + 1):
            assert everything(svc, f"id{i}") == [i * 100], (step, i)
            assert everything(svc, f"u{i}") == [i * 100], (step, i)
        for k in range(5):
            assert everything(svc, f"k{k}") == [
                i * 100 for i in range(last, -1, -1) if i % 5 == k
            ], (step, k)
        _abandon(svc)
        if not killed:
            break
        step += 1
    assert step > 10


@pytest.mark.parametrize("entries", [5, 7, 1000])
def test_a_batch_dispatch_builds_the_index_record_by_record_would(
    tmp_path: Path, entries: int
) -> None:
    reqs = [req(i * 100, f"k{i % 7} id{i}", uniq=f"u{i}", ts=T0 + i * 900) for i in range(40)]
    one = service(tmp_path / "one", slots=8, entries=entries)
    for r in reqs:
        one.dispatch(r)
    many = service(tmp_path / "many", slots=8, entries=entries)
    for at in range(0, 40, 9):  # uneven batches, some across a roll-over
        many.dispatch_batch(reqs[at : at + 9])
    many.dispatch_batch(reqs[30:35])  # re-dispatched after recovery: nothing added
    assert [f.path.name for f in many.files] == [f.path.name for f in one.files]
    for key in [f"k{k}" for k in range(7)] + [f"id{i}" for i in range(40)] + ["u0", "u39"]:
        assert everything(many, key) == everything(one, key), key
    assert everything(many, "k3") == [i * 100 for i in range(39, -1, -1) if i % 7 == 3]
    assert [(f.begin_timestamp, f.end_timestamp, f.end_phy_offset) for f in many.files] == [
        (f.begin_timestamp, f.end_timestamp, f.end_phy_offset) for f in one.files
    ]


@pytest.mark.parametrize("cut", [300, 1100])
def test_a_kill_anywhere_in_truncate_leaves_a_loadable_index(tmp_path: Path, cut: int) -> None:
    reqs = _crash_reqs()
    step = 1
    while True:
        root = tmp_path / f"step{step}"
        svc = service(root, slots=2, entries=7)
        for r in reqs:
            svc.dispatch(r)
        killed = _kill_at(step, functools.partial(svc.truncate_dirty, cut))
        _abandon(svc)
        svc = service(root, slots=2, entries=7)
        svc.truncate_dirty(cut)  # the next start's recovery cuts again
        for i in range(12):
            assert everything(svc, f"id{i}") == ([i * 100] if i * 100 < cut else []), step
        _reindex_from_newest(svc, [r for r in reqs if r.commitlog_offset >= cut])
        for i in range(12):
            assert everything(svc, f"id{i}") == [i * 100], (step, i)
        _abandon(svc)
        if not killed:
            break
        step += 1
    assert step > 5


def test_a_file_whose_creation_was_interrupted_is_removed(tmp_path: Path) -> None:
    svc = service(tmp_path, slots=8, entries=10)
    svc.dispatch(req(0, "k"))
    svc.shutdown()
    leftover = tmp_path / "index" / f".{index_file_name(T0 + 5000)}.tmp"
    leftover.write_bytes(b"")  # created, never sized: a kill before the rename
    svc = service(tmp_path, slots=8, entries=10)
    assert not leftover.exists() and everything(svc, "k") == [0]


def test_compiled_and_python_index_writes_agree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same dispatch batches (shared slots, repeated keys, keyless records, times
    before the file's begin, files rolling over) leave the same bytes in every index file
    whether `put_records` writes through the compiled `index_entries` or its Python loop."""
    import random

    from broker.store import index_file

    assert index_file._index_entries is not None  # the compiled one is in use
    rng = random.Random(20261124)
    batches = []
    phy = 0
    for _ in range(60):
        batch = []
        for _ in range(rng.randint(1, 40)):
            keys = " ".join(f"k{rng.randrange(50)}" for _ in range(rng.randint(0, 3)))
            uniq = None if rng.random() < 0.2 else f"U{rng.randrange(10**9)}"
            ts = T0 + rng.randint(-5_000, 4_000_000)
            batch.append(req(phy, keys, uniq, ts=ts))
            phy += rng.randint(100, 2000)
        batches.append(batch)

    def files(directory: Path, compiled: bool) -> list[bytes]:
        if not compiled:
            monkeypatch.setattr(index_file, "_index_entries", None)
        svc = service(directory, slots=37, entries=300)
        for batch in batches:
            svc.dispatch_batch(batch)
        raw = [bytes(f._mm) for f in svc.files]
        _abandon(svc)
        monkeypatch.undo()
        return raw

    compiled = files(tmp_path / "c", True)
    python = files(tmp_path / "py", False)
    assert len(compiled) > 2  # files rolled over
    assert compiled == python
