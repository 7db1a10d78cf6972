"""Commitlog recovery: find the end of the valid log after a clean or an unclean stop.

Normal recovery (no abort file, a valid checkpoint): the last run flushed everything and
stopped cleanly; the last three files are scanned (every record validated: magic, size,
lengths, body CRC, PHYSICALOFFSET equal to its position) to find the end.

Abnormal recovery (abort file present, or no usable checkpoint): the scan starts at the
last file whose first record is older than every checkpoint timestamp (everything before
it was on disk in commitlog, consume queues and index), else at the first file, and runs
to the first record that is not valid. That is the torn tail, and everything from it on
is zeroed and cut off (later files deleted). The scanned files are then fdatasync'ed: what
the dead process left in the page cache is made durable before anything new is
acknowledged on top of it.

An invalid record is a corruption, not a torn tail. Below the checkpoint's flushed offset
(those bytes were on disk once) a record whose frame still holds (its magic code and
TOTALSIZE are sound and a valid record, a blank record or the file's end follows it) but
whose contents do not (its checksum, lengths, topic or properties) is quarantined: it stays
on disk, is logged (one error line each, every start), counted in
`RecoveryReport.quarantined`, skipped by dispatch, never served (reads refuse its offset),
and `reliable admin store verify` names it; the scan goes on after it. One damaged record
does not keep the broker from starting. Anything else raises `StoreCorrupted` instead of
silently dropping data, when:
- it lies below the checkpoint's flushed offset, or
- under SYNC_FLUSH, a valid record follows it (records are written and flushed in order, so
  a later acknowledged record implies this one was acknowledged too).
Under ASYNC_FLUSH the second case is what a power cut can leave (the page cache reaches the
disk out of order); it is truncated with a warning counting the records dropped.

Consume queues and index are then cut back to the commitlog's end and re-dispatched from
the consume queues' furthest pointer by the store (see `store.MessageStore.start`).
"""

from __future__ import annotations

import logging
import mmap
from dataclasses import dataclass

from broker.store.checkpoint import StoreCheckpoint
from broker.store.codec import (
    BLANK_MAGIC_CODE,
    FIXED_SIZE,
    MESSAGE_MAGIC_CODE,
    RECORD_MAGIC_CODE,
    check_message_and_return_size,
    scan_record,
)
from broker.store.commitlog import CommitLog
from broker.store.config import FlushMode
from broker.store.errors import ForeignFile, StoreCorrupted
from broker.store.mapped_file import MappedFile

log = logging.getLogger(__name__)

NORMAL_RECOVERY_FILES = 3
_MAGICS = tuple(m.to_bytes(4, "big", signed=True) for m in (RECORD_MAGIC_CODE, MESSAGE_MAGIC_CODE))
_MAGIC_PREFIX = _MAGICS[0][:3]  # both record versions' magic codes start DA A3 20
assert all(m.startswith(_MAGIC_PREFIX) for m in _MAGICS)
_ZERO_HEADER = bytes(8)


@dataclass(slots=True, frozen=True)
class RecoveryReport:
    """What recovery found."""

    abnormal: bool
    scanned_from: int  # commitlog offset the scan started at
    end: int  # commitlog offset after the last valid record
    records_scanned: int
    torn_tail: bool  # non-zero bytes past `end` were cut off
    valid_records_dropped: int  # valid records after the first invalid one (ASYNC only)
    # (commitlog offset, TOTALSIZE) of damaged records kept but never served
    quarantined: tuple[tuple[int, int], ...] = ()


@dataclass(slots=True)
class _ScanEnd:
    end: int
    file_index: int
    pos: int
    records: int
    last_store_timestamp: int
    invalid: bool
    quarantined: tuple[tuple[int, int], ...] = ()


_BLANK_BYTES = BLANK_MAGIC_CODE.to_bytes(4, "big", signed=True)


def _starts_like_ours(mf: MappedFile) -> bool:
    """Every commitlog file starts with a record, a blank record, or nothing yet.

    A crash while the first record was being copied can leave a prefix of it: TOTALSIZE and
    part of MAGICCODE. Anything else at offset 0 was not written by this store.
    """
    head = mf.read(0, 8)
    magic = head[4:8]
    if magic in _MAGICS or magic == _BLANK_BYTES or head == _ZERO_HEADER:
        return True
    k = len(magic.rstrip(b"\0"))
    return any(m.startswith(magic[:k]) for m in (*_MAGICS, _BLANK_BYTES))


_CHUNK = 1 << 20
_ZERO_CHUNK = bytes(_CHUNK)


def _find_magic(mm: mmap.mmap, start: int) -> int:
    """Position of the next record magic code (either version) at or after `start`.

    The rest of the last file is mostly zeros (never written, or warmed): a chunk equal to
    zeros (a compare, ~10x faster than a search through it) holds no magic code."""
    size = len(mm)
    pos = start
    while pos < size:
        stop = min(size, pos - pos % _CHUNK + _CHUNK)
        if mm[pos:stop] != _ZERO_CHUNK[: stop - pos]:
            # a magic code starting in this chunk may end in the next one
            at = mm.find(_MAGIC_PREFIX, pos, stop + len(_MAGIC_PREFIX) - 1)
            while at >= 0 and mm[at : at + 4] not in _MAGICS:
                at = mm.find(_MAGIC_PREFIX, at + 1, stop + len(_MAGIC_PREFIX) - 1)
            if at >= 0:
                return at
        pos = stop
    return -1


def _first_record_older_than(mf: MappedFile, limit_ts: int) -> bool:
    if not mf.hold():
        return False
    try:
        with mf.buffer() as buf:
            size, req = check_message_and_return_size(buf, 0, True, mf.file_from_offset)
        return (
            size > 0
            and req is not None
            and req.store_timestamp != 0
            and req.store_timestamp <= limit_ts
        )
    finally:
        mf.release()


def _framed_size(buf: memoryview, pos: int, base: int) -> int:
    """TOTALSIZE of the invalid record at `pos` when its frame holds (see the module's
    docstring), else 0: the magic code is a record's, the size fits the file, and what
    follows is a valid record at the offset the size says, a blank record or the end."""
    left = len(buf) - pos
    if left < FIXED_SIZE:
        return 0
    total = int.from_bytes(buf[pos : pos + 4], "big", signed=True)
    if bytes(buf[pos + 4 : pos + 8]) not in _MAGICS or not FIXED_SIZE <= total <= left:
        return 0
    size, _ = check_message_and_return_size(buf, pos + total, True, base + pos + total)
    return total if size >= 0 else 0


def _scan(files: list[MappedFile], start: int, flushed: int = 0) -> _ScanEnd:
    records = 0
    last_ts = 0
    quarantined: list[tuple[int, int]] = []
    for i in range(start, len(files)):
        mf = files[i]
        base = mf.file_from_offset
        if not mf.hold():  # pragma: no cover - nothing else runs during recovery
            raise StoreCorrupted(mf.path, 0, "file closed during recovery")
        try:
            with mf.buffer() as buf:
                pos = 0
                while True:
                    size, store_ts = scan_record(buf, pos, base + pos)
                    if size > 0:
                        pos += size
                        records += 1
                        last_ts = store_ts
                        continue
                    if size == 0:
                        break  # blank record or exact end: the next file goes on
                    framed = _framed_size(buf, pos, base) if base + pos < flushed else 0
                    if framed:
                        log.error(
                            "commitlog %s: the record at offset %d is damaged (run "
                            "`reliable admin store verify`); quarantined: kept on disk, "
                            "never served",
                            mf.path,
                            base + pos,
                        )
                        quarantined.append((base + pos, framed))
                        pos += framed
                        continue
                    return _ScanEnd(base + pos, i, pos, records, last_ts, True, tuple(quarantined))
        finally:
            mf.release()
    last = files[-1]
    return _ScanEnd(
        last.file_from_offset + last.file_size,
        len(files) - 1,
        last.file_size,
        records,
        last_ts,
        False,
        tuple(quarantined),
    )


def _count_valid_after(files: list[MappedFile], index: int, pos: int) -> tuple[int, int]:
    """(count, first offset) of valid records anywhere after (file `index`, `pos`)."""
    count, first = 0, -1
    for i in range(index, len(files)):
        mf = files[i]
        if not mf.hold():  # pragma: no cover
            continue
        try:
            mm = mf.mapping
            at = _find_magic(mm, pos + 4 if i == index else 4)
            with mf.buffer() as buf:
                while at >= 0:
                    start = at - 4
                    size, _ = check_message_and_return_size(
                        buf, start, True, mf.file_from_offset + start
                    )
                    if size > 0:
                        count += 1
                        if first < 0:
                            first = mf.file_from_offset + start
                        at = _find_magic(mm, start + size + 4)
                    else:
                        at = _find_magic(mm, at + 1)
        finally:
            mf.release()
    return count, first


def recover_commitlog(
    commitlog: CommitLog, checkpoint: StoreCheckpoint, abnormal: bool, index_safe: bool = False
) -> RecoveryReport:
    """Find and set the commitlog's end; raise StoreCorrupted where data cannot be trusted."""
    q = commitlog.queue
    files = q.mapped_files
    abnormal = abnormal or not checkpoint.loaded
    if not files:
        q.flushed_where = q.committed_where = 0
        return RecoveryReport(abnormal, 0, 0, 0, False, 0)
    for mf in files:
        if not _starts_like_ours(mf):
            raise ForeignFile(mf.path, "does not start with a commitlog record")

    if not abnormal:
        start = max(0, len(files) - NORMAL_RECOVERY_FILES)
    else:
        start = 0
        if checkpoint.loaded:
            limit = checkpoint.min_timestamp(index_safe)
            for i in range(len(files) - 1, -1, -1):
                if _first_record_older_than(files[i], limit):
                    start = i
                    break
    scanned_from = files[start].file_from_offset
    flushed = checkpoint.physic_flushed_offset if checkpoint.loaded else 0
    found = _scan(files, start, flushed)
    end = found.end
    torn = False
    dropped = 0
    if found.invalid:
        mf = files[found.file_index]
        header = mf.read(found.pos, 8)
        torn = header != _ZERO_HEADER[: len(header)]
        if end < flushed:
            raise StoreCorrupted(
                mf.path, found.pos, f"invalid record below the flushed offset {flushed}"
            )
        if abnormal or torn:
            dropped, first_valid = _count_valid_after(files, found.file_index, found.pos)
            if dropped:
                if commitlog.config.flush_mode is FlushMode.SYNC_FLUSH:
                    raise StoreCorrupted(
                        mf.path,
                        found.pos,
                        f"invalid record followed by {dropped} valid record(s) from offset "
                        f"{first_valid}; acknowledged data would be lost by truncating",
                    )
                log.warning(
                    "commitlog %s: invalid record at %d followed by %d valid "
                    "record(s) (unflushed at the crash); truncating them",
                    mf.path,
                    end,
                    dropped,
                )
                torn = True
    q.truncate_dirty_files(end, zero_tail=torn or abnormal)
    files = q.mapped_files
    if abnormal:
        for mf in files[start:]:
            mf.sync()
    for mf in files:
        if mf.file_from_offset + mf.file_size <= end:
            mf.flushed_position = mf.committed_position = mf.wrote_position = mf.file_size
    q.flushed_where = q.committed_where = end
    commitlog.last_store_timestamp = max(commitlog.last_store_timestamp, found.last_store_timestamp)
    if torn:
        log.warning("commitlog recovered to offset %d: torn tail cut off", end)
    if found.quarantined:
        log.error(
            "commitlog recovered to offset %d with %d damaged record(s) quarantined",
            end,
            len(found.quarantined),
        )
    return RecoveryReport(
        abnormal, scanned_from, end, found.records, torn, dropped, found.quarantined
    )
