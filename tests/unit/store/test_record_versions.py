"""A store written with version-1 records (body CRC only) opens, serves and verifies like
one of version 2, and new records on top of it are version 2."""

from __future__ import annotations

import shutil
from pathlib import Path

from broker.store.codec import MESSAGE_MAGIC_CODE, RECORD_MAGIC_CODE, reseal
from broker.store.store import MessageStore
from broker.store.verify import verify_store
from tests.unit.store._helpers import message, small_config

V1 = MESSAGE_MAGIC_CODE.to_bytes(4, "big", signed=True)
V2 = RECORD_MAGIC_CODE.to_bytes(4, "big", signed=True)


def _downgrade(store: MessageStore, offsets: list[int], cfg_size: int, root: Path) -> None:
    """Rewrite every record as version 1, as an older release wrote it."""
    for offset in offsets:
        path = root / "commitlog" / f"{offset - offset % cfg_size:020d}"
        raw = bytearray(path.read_bytes())
        pos = offset % cfg_size
        assert raw[pos + 4 : pos + 8] == V2
        raw[pos + 4 : pos + 8] = V1
        reseal(raw, pos)
        path.write_bytes(bytes(raw))


def test_version_1_records_are_read_and_new_ones_are_version_2(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    store = MessageStore(cfg)
    store.start()
    results = [store.put_message(message(i, queue_id=i % 2)) for i in range(40)]
    offsets = [r.append.wrote_offset for r in results if r.append is not None]
    assert len(offsets) == 40
    store.shutdown()
    _downgrade(store, offsets, cfg.mapped_file_size_commitlog, tmp_path)
    assert verify_store(cfg).ok

    again = MessageStore(small_config(tmp_path))
    again.start()
    try:
        for i, offset in enumerate(offsets):
            got = again.look_message_by_offset(offset)
            assert got is not None and got.body == message(i).body
            assert got.properties == message(i, queue_id=i % 2).properties
        got_q = again.get_messages("g", "TopicA", 1, 0, 64)
        assert [m.body for m in got_q.messages] == [message(i).body for i in range(1, 40, 2)]
        assert [m.commitlog_offset for m in again.query_message_by_key("TopicA", "key-7")] == [
            offsets[7]
        ]
        new = again.put_message(message(40))
        assert new.append is not None
        raw = again.commitlog.get_message(new.append.wrote_offset, new.append.wrote_bytes)
        assert raw is not None and raw[4:8] == V2
    finally:
        again.shutdown()
    assert verify_store(small_config(tmp_path)).ok


def test_a_damaged_record_below_the_flushed_offset_is_quarantined_not_fatal(tmp_path: Path) -> None:
    """One damaged record of each version in a cleanly stopped store: the store starts,
    both are kept on disk and never served (not even the version-1 one, whose read path
    has no checksum), the rest are served, dispatch steps over them, and the next start
    quarantines them again."""
    cfg = small_config(tmp_path)
    store = MessageStore(cfg)
    store.start()
    results = [store.put_message(message(i, queue_id=0)) for i in range(12)]
    offsets = [r.append.wrote_offset for r in results if r.append is not None]
    store.shutdown()
    size = cfg.mapped_file_size_commitlog
    _downgrade(store, offsets[3:4], size, tmp_path)  # record 3 is version 1
    for victim in (3, 7):  # record 3: a body byte; record 7 (version 2): a property byte
        path = tmp_path / "commitlog" / f"{offsets[victim] - offsets[victim] % size:020d}"
        raw = bytearray(path.read_bytes())
        end = offsets[victim] % size + results[victim].append.wrote_bytes  # type: ignore
        target = raw.index(message(victim).body, offsets[victim] % size) if victim == 3 else end - 2
        raw[target] ^= 0x01
        path.write_bytes(bytes(raw))
    assert not verify_store(small_config(tmp_path)).ok

    served = [message(i).body for i in range(12) if i not in (3, 7)]
    for n in range(2):  # the next start finds and quarantines them again
        again = MessageStore(small_config(tmp_path))
        again.start()
        try:
            assert again.recovery is not None
            assert [at for at, _ in again.recovery.quarantined] == [offsets[3], offsets[7]]
            assert again.look_message_by_offset(offsets[3]) is None
            assert again.look_message_by_offset(offsets[7]) is None
            got = again.get_messages("g", "TopicA", 0, 0, 64)
            assert [m.body for m in got.messages] == served
            assert again.put_message(message(12 + n, queue_id=0)).status.stored
            served.append(message(12 + n).body)
            assert again.wait_dispatched(10)
            assert again.get_max_offset_in_queue("TopicA", 0) == 13 + n
        finally:
            again.shutdown()
    # the queue rebuilt from the commitlog steps over them (blank units keep positions)
    shutil.rmtree(tmp_path / "consumequeue" / "TopicA" / "0")
    rebuilt = MessageStore(small_config(tmp_path))
    rebuilt.start()
    try:
        assert [m.body for m in rebuilt.get_messages("g", "TopicA", 0, 0, 64).messages] == served
        assert rebuilt.get_max_offset_in_queue("TopicA", 0) == 14
    finally:
        rebuilt.shutdown()
    problems = verify_store(small_config(tmp_path)).problems
    assert sorted({p.offset for p in problems if "commitlog" in str(p.file)}) == [
        offsets[3] % size,
        offsets[7] % size,
    ]
