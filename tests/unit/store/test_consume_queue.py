"""Consume queues: positional 20-byte units over many small files, recovery, truncation,
min-offset correction, expired files and offset-by-time."""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path

import pytest

from broker.store.codec import DispatchRequest
from broker.store.config import StoreConfig
from broker.store.consume_queue import (
    BLANK_UNIT_SIZE,
    CQ_STORE_UNIT_SIZE,
    ConsumeQueue,
)
from broker.store.consume_queue_store import ConsumeQueueStore
from broker.store.errors import ForeignFile, StoreCorrupted
from broker.store.mapped_file import file_name
from broker.store.message import SysFlag

UNITS_PER_FILE = 4
FILE_SIZE = UNITS_PER_FILE * CQ_STORE_UNIT_SIZE
SIZE = 100  # every fake record is 100 bytes long: unit i points at commitlog i * 100


def req(
    i: int, topic: str = "t", qid: int = 0, *, sys_flag: int = 0, tag: int = 7, ts: int = 0
) -> DispatchRequest:
    return DispatchRequest(
        topic=topic,
        queue_id=qid,
        commitlog_offset=i * SIZE,
        msg_size=SIZE,
        tags_code=tag,
        store_timestamp=ts,
        queue_offset=i,
        keys="",
        uniq_key=None,
        sys_flag=sys_flag,
        prepared_tx_offset=0,
    )


def new_cq(root: Path, topic: str = "t", qid: int = 0) -> ConsumeQueue:
    cq = ConsumeQueue(topic, qid, root, FILE_SIZE)
    cq.load()
    cq.recover()
    return cq


def fill(cq: ConsumeQueue, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        assert cq.put_message_position_info(req(i, tag=1000 + i))


def test_units_are_positional_across_many_files(tmp_path: Path) -> None:
    cq = new_cq(tmp_path)
    fill(cq, 19)
    names = sorted(p.name for p in cq.directory.iterdir())
    assert names == [file_name(k * FILE_SIZE) for k in range(5)]
    assert (cq.get_min_offset_in_queue(), cq.get_max_offset_in_queue()) == (0, 19)
    for i in range(19):
        assert cq.get_unit(i) == (i * SIZE, SIZE, 1000 + i)
    assert cq.get_unit(19) is None
    assert [u[0] for u in cq.iter_units(2, 9)] == list(range(2, 11))
    assert list(cq.iter_units(17, 100)) == [(17, 1700, SIZE, 1017), (18, 1800, SIZE, 1018)]
    assert cq.get_last_offset() == 19 * SIZE


def test_duplicate_dispatch_is_skipped(tmp_path: Path) -> None:
    cq = new_cq(tmp_path)
    fill(cq, 5)
    assert cq.put_message_position_info(req(3))  # re-dispatch after recovery: no-op
    assert cq.get_max_offset_in_queue() == 5
    assert cq.get_unit(3) == (300, SIZE, 1003)


def test_fresh_queue_starting_mid_file_and_gaps_are_blank(tmp_path: Path) -> None:
    cq = new_cq(tmp_path)
    assert cq.put_message_position_info(req(6))  # file 1 holds units 4..7
    assert cq.get_min_offset_in_queue() == 6
    assert cq.get_unit(4) is None and cq.get_unit(5) is None
    assert cq.put_message_position_info(req(9))  # a gap: 7 and 8 become blank units
    assert cq.get_max_offset_in_queue() == 10
    assert [u[0] for u in cq.iter_units(0, 100)] == [6, 9]
    raw = (cq.directory / file_name(FILE_SIZE)).read_bytes()
    assert struct.unpack_from(">qiq", raw, 3 * CQ_STORE_UNIT_SIZE) == (0, BLANK_UNIT_SIZE, 0)
    cq.shutdown()
    again = new_cq(tmp_path)
    assert [u[0] for u in again.iter_units(0, 100)] == [6, 9]
    assert again.get_min_offset_in_queue() == 4  # first file's start; blanks are skipped


def test_recover_finds_last_valid_unit_and_appends_after_it(tmp_path: Path) -> None:
    cq = new_cq(tmp_path)
    fill(cq, 23)
    cq.shutdown()
    again = new_cq(tmp_path)
    assert again.get_max_offset_in_queue() == 23
    assert again.get_last_offset() == 23 * SIZE
    fill(again, 3, start=23)
    assert [u[1] for u in again.iter_units(20, 10)] == [2000, 2100, 2200, 2300, 2400, 2500]


def test_recover_of_exactly_full_files(tmp_path: Path) -> None:
    cq = new_cq(tmp_path)
    fill(cq, 3 * UNITS_PER_FILE)
    cq.shutdown()
    again = new_cq(tmp_path)
    assert again.get_max_offset_in_queue() == 12
    fill(again, 1, start=12)
    assert again.get_unit(12) == (1200, SIZE, 1012)


def test_corrupt_unit_is_rejected_with_clear_error(tmp_path: Path) -> None:
    cq = new_cq(tmp_path)
    fill(cq, 10)
    cq.shutdown()
    path = cq.directory / file_name(FILE_SIZE)
    with open(path, "r+b") as f:  # unit 5: a negative size
        f.seek(CQ_STORE_UNIT_SIZE)
        f.write(struct.pack(">qiq", 500, -3, 0))
    again = ConsumeQueue("t", 0, tmp_path, FILE_SIZE)
    again.load()
    with pytest.raises(StoreCorrupted) as info:
        again.recover()
    assert info.value.path == path and info.value.offset == CQ_STORE_UNIT_SIZE
    again.shutdown()


def test_offsets_going_backwards_are_rejected(tmp_path: Path) -> None:
    cq = new_cq(tmp_path)
    fill(cq, 6)
    cq.shutdown()
    path = cq.directory / file_name(FILE_SIZE)
    with open(path, "r+b") as f:
        f.seek(CQ_STORE_UNIT_SIZE)
        f.write(struct.pack(">qiq", 10, SIZE, 0))
    again = ConsumeQueue("t", 0, tmp_path, FILE_SIZE)
    again.load()
    with pytest.raises(StoreCorrupted, match="backwards"):
        again.recover()
    again.shutdown()


def test_foreign_files_are_rejected(tmp_path: Path) -> None:
    cq = new_cq(tmp_path)
    fill(cq, 2)
    cq.shutdown()
    stray = cq.directory / "notes.txt"
    stray.write_text("hello")
    with pytest.raises(ForeignFile) as info:
        ConsumeQueue("t", 0, tmp_path, FILE_SIZE).load()
    assert info.value.path == stray
    stray.unlink()
    wrong = cq.directory / file_name(FILE_SIZE)
    wrong.write_bytes(b"\0" * (FILE_SIZE + 1))
    with pytest.raises(ForeignFile, match="size"):
        ConsumeQueue("t", 0, tmp_path, FILE_SIZE).load()


def test_store_load_rejects_foreign_directory_entries(tmp_path: Path) -> None:
    config = StoreConfig(store_dir=tmp_path, mapped_file_size_consume_queue=FILE_SIZE)
    store = ConsumeQueueStore(config)
    store.dispatch(req(0))
    store.shutdown()
    (config.consume_queue_dir / "t" / "zero").mkdir()
    with pytest.raises(ForeignFile, match="queue-id"):
        ConsumeQueueStore(config).load()


@pytest.mark.parametrize("cut_unit", [0, 1, 4, 5, 9, 10, 13])
def test_truncate_dirty_logic_files(tmp_path: Path, cut_unit: int) -> None:
    cq = new_cq(tmp_path)
    fill(cq, 13)
    cq.truncate_dirty_logic_files(cut_unit * SIZE)
    assert cq.get_max_offset_in_queue() == cut_unit
    assert [u[0] for u in cq.iter_units(0, 100)] == list(range(cut_unit))
    assert cq.get_last_offset() == (cut_unit * SIZE if cut_unit else -1)
    fill(cq, 2, start=cut_unit)  # the dispatcher re-delivers from the cut
    assert [u[0] for u in cq.iter_units(0, 100)] == list(range(cut_unit + 2))
    cq.shutdown()
    again = new_cq(tmp_path)
    assert again.get_max_offset_in_queue() == cut_unit + 2


def test_truncate_in_the_middle_of_a_record(tmp_path: Path) -> None:
    cq = new_cq(tmp_path)
    fill(cq, 6)
    cq.truncate_dirty_logic_files(450)  # unit 4 covers [400, 500): its record is torn
    assert cq.get_max_offset_in_queue() == 5
    assert cq.get_last_offset() == 500


def test_delete_expired_files_and_min_offset(tmp_path: Path) -> None:
    cq = new_cq(tmp_path)
    fill(cq, 14)  # files hold units 0-3, 4-7, 8-11, 12-13
    assert cq.delete_expired_file(commitlog_min_offset=650) == 1  # file 0 ends at 300
    assert cq.get_min_offset_in_queue() == 7  # unit 6 points at 600 < 650
    assert cq.get_unit(6) is None and cq.get_unit(7) == (700, SIZE, 1007)
    assert cq.delete_expired_file(commitlog_min_offset=10_000) == 2
    # never the last file; every unit left is below the commitlog: the queue reads empty
    assert sorted(p.name for p in cq.directory.iterdir()) == [file_name(3 * FILE_SIZE)]
    assert cq.get_min_offset_in_queue() == cq.get_max_offset_in_queue() == 14
    fill(cq, 1, start=14)
    cq.correct_min_offset(1400)
    assert cq.get_min_offset_in_queue() == 14
    assert list(cq.iter_units(0, 100)) == [(14, 1400, SIZE, 1014)]


def test_offset_by_time_across_many_small_files(tmp_path: Path, seed: int) -> None:
    import random

    rng = random.Random(seed)
    cq = new_cq(tmp_path)
    stamps: dict[int, int] = {}
    ts = 1_700_000_000_000
    for i in range(150):  # 38 files of 4 units
        ts += rng.choice([0, 0, 1, 5, 1000])  # equal timestamps happen within one ms
        stamps[i * SIZE] = ts
        cq.put_message_position_info(req(i, ts=ts))
    assert len(list(cq.directory.iterdir())) == 38
    lookups: list[int] = []

    def lookup(phy: int, size: int) -> int:
        assert size == SIZE
        lookups.append(phy)
        return stamps.get(phy, -1)

    ordered = [stamps[i * SIZE] for i in range(150)]
    probes = sorted({*ordered, ordered[0] - 1, ordered[-1] + 1, *(t + 1 for t in ordered)})
    for probe in probes:
        lookups.clear()
        expected = next((i for i, t in enumerate(ordered) if t >= probe), 150)
        assert cq.get_offset_in_queue_by_time(probe, lookup) == expected, probe
        assert len(lookups) <= 9  # a binary search, not a scan
    # after the oldest files expire, the search starts at the new min offset
    cq.delete_expired_file(commitlog_min_offset=40 * SIZE)
    assert cq.get_min_offset_in_queue() == 40
    assert cq.get_offset_in_queue_by_time(0, lookup) == 40


def test_store_skips_half_and_rolled_back_transactions(tmp_path: Path) -> None:
    config = StoreConfig(store_dir=tmp_path, mapped_file_size_consume_queue=FILE_SIZE)
    store = ConsumeQueueStore(config)
    store.dispatch(req(0))
    store.dispatch(replace(req(1), sys_flag=int(SysFlag.TRANSACTION_PREPARED), queue_offset=0))
    store.dispatch(replace(req(2), sys_flag=int(SysFlag.TRANSACTION_ROLLBACK), queue_offset=0))
    store.dispatch(replace(req(3), sys_flag=int(SysFlag.TRANSACTION_COMMIT), queue_offset=1))
    store.dispatch(req(0, topic="other", qid=3))
    cq = store.get("t", 0)
    assert cq is not None
    assert [u[1] for u in cq.iter_units(0, 10)] == [0, 300]
    assert store.topics() == ["other", "t"] and store.queue_ids("other") == [3]
    assert store.get_max_physic_offset() == 400
    store.shutdown()
    again = ConsumeQueueStore(config)
    again.load()
    again.recover()
    assert again.get_max_physic_offset() == 400
    assert again.topics() == ["other", "t"]
    again.truncate_dirty(300)
    assert again.get_max_physic_offset() == 100
    again.delete_topic("other")
    assert again.topics() == ["t"] and not (config.consume_queue_dir / "other").exists()


def test_correct_min_offset_far_into_a_large_file(tmp_path: Path) -> None:
    cq = ConsumeQueue("t", 0, tmp_path, 20_000 * CQ_STORE_UNIT_SIZE)
    cq.load()
    cq.recover()
    fill(cq, 12_000)
    for target in (0, 1, 4095, 4096, 4097, 9_999, 11_999):
        cq.correct_min_offset(target * SIZE)
        assert cq.get_min_offset_in_queue() == target
    cq.correct_min_offset(10**9)
    assert cq.get_min_offset_in_queue() == cq.get_max_offset_in_queue() == 12_000


def test_a_second_record_claiming_a_queue_offset_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cq = new_cq(tmp_path)
    fill(cq, 3)
    assert cq.put_unit(1, 5000, SIZE, 0)  # queue offset 1 is taken by the record at 100
    assert cq.get_unit(1) == (100, SIZE, 1001)
    assert cq.get_max_offset_in_queue() == 3
    assert any("already holds the record at 100" in r.getMessage() for r in caplog.records)


def test_a_unit_torn_by_a_kill_mid_copy_ends_the_queue(tmp_path: Path) -> None:
    # a unit is one 20-byte copy: a kill in that instant leaves its offset without a size
    cq = new_cq(tmp_path)
    fill(cq, 6)
    cq.shutdown()
    path = cq.directory / file_name(FILE_SIZE)
    with open(path, "r+b") as f:  # unit 6, the next one: only its first field landed
        f.seek(2 * CQ_STORE_UNIT_SIZE)
        f.write(struct.pack(">q", 600))
    again = new_cq(tmp_path)
    assert again.get_max_offset_in_queue() == 6
    assert again.get_last_offset() == 6 * SIZE
    fill(again, 2, start=6)  # the dispatcher writes it again
    assert again.get_unit(6) == (600, SIZE, 1006) and again.get_unit(7) == (700, SIZE, 1007)
    again.shutdown()


def _units(store: ConsumeQueueStore) -> dict[tuple[str, int], list[tuple[int, int, int, int]]]:
    return {
        (t, q): list(cq.iter_units(0, 100))
        for t in store.topics()
        for q in store.queue_ids(t)
        if (cq := store.get(t, q)) is not None
    }


def test_a_dispatched_batch_writes_what_record_by_record_dispatch_writes(
    tmp_path: Path,
) -> None:
    """Runs of one queue across file ends, another queue in between, a transaction's
    half record, a gap and a re-dispatch: the same units either way."""
    requests = [req(i, tag=1000 + i) for i in range(6)]  # crosses the first file's end
    requests += [req(0, topic="other", qid=2), req(1, topic="other", qid=2)]
    requests += [replace(req(6), sys_flag=int(SysFlag.TRANSACTION_PREPARED), queue_offset=0)]
    requests += [req(8, tag=5), req(9, tag=6)]  # a gap: 6 and 7 blank
    requests += [req(3, tag=1003), req(10)]  # a re-dispatch, then the next
    one = ConsumeQueueStore(
        StoreConfig(store_dir=tmp_path / "one", mapped_file_size_consume_queue=FILE_SIZE)
    )
    for r in requests:
        one.dispatch(r)
    many = ConsumeQueueStore(
        StoreConfig(store_dir=tmp_path / "many", mapped_file_size_consume_queue=FILE_SIZE)
    )
    many.dispatch_batch(requests[:3])
    many.dispatch_batch(requests[3:])
    assert _units(many) == _units(one)
    assert [u[0] for u in _units(many)[("t", 0)]] == [0, 1, 2, 3, 4, 5, 8, 9, 10]
    assert many.get_max_physic_offset() == one.get_max_physic_offset() == 11 * SIZE
