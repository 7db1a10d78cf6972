"""One consume queue: a (topic, queue id) array of fixed-size pointers into the commitlog.

    consumequeue/<topic>/<queueId>/00000000000000000000   units [0, N)
    consumequeue/<topic>/<queueId>/00000000000006000000   units [N, 2N)   (N = 300,000)

A queue offset `i` is the unit at byte `i * 20` of the queue's offset space; the file holding
it is the one named by the largest 20-digit offset <= `i * 20`. Units are appended by the
dispatcher in queue-offset order, so a queue is an append-only array a consumer can index.

A *blank* unit (commitlog offset 0, size `BLANK_UNIT_SIZE`, tags code 0) fills positions
that hold no message: the head of a queue whose first file starts mid-file (files before it
were deleted) and, defensively, any gap the dispatcher is asked to skip over. Readers skip
blank units.

The store's queues together (creation, registry, load, recovery, cleanup) are
`consume_queue_store.ConsumeQueueStore`'s.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from broker.store.codec import DispatchRequest, is_queued
from broker.store.errors import StoreCorrupted
from broker.store.mapped_file import MappedFile
from broker.store.mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)

# One unit, big-endian, 20 bytes:
#
#   0               8           12              20
#   +---------------+-----------+---------------+
#   | commitlog off |   size    |   tags code   |
#   |     i64       |    i32    |      i64      |
#   +---------------+-----------+---------------+
#
# `size` is the record's TOTALSIZE; `tags code` is the Java String.hashCode of TAGS (or, for
# SCHEDULE_TOPIC_XXXX, the delivery time in ms).
CQ_STORE_UNIT_SIZE = 20
_UNIT = struct.Struct(">qiq")
assert _UNIT.size == CQ_STORE_UNIT_SIZE

BLANK_UNIT_SIZE = 0x7FFFFFFF  # i32 max: "no message here"
_BLANK_UNIT = _UNIT.pack(0, BLANK_UNIT_SIZE, 0)
_SCAN_CHUNK_UNITS = 4096  # units read at a time when looking for a queue's new head

# (queue offset, commitlog offset, size, tags code)
Unit = tuple[int, int, int, int]
StoreTimestampLookup = Callable[[int, int], int]


def _is_valid(phy: int, size: int) -> bool:
    return phy >= 0 and size > 0


def skips_consume_queue(sys_flag: int) -> bool:
    """Half (PREPARED) and rolled-back transaction records never reach a consume queue."""
    return not is_queued(sys_flag)


class ConsumeQueue:
    """One logical queue: append units, read them by queue offset, recover, truncate."""

    def __init__(
        self,
        topic: str,
        queue_id: int,
        store_dir: Path,
        mapped_file_size: int,
        *,
        max_unit_size: int = BLANK_UNIT_SIZE - 1,
    ) -> None:
        if mapped_file_size <= 0 or mapped_file_size % CQ_STORE_UNIT_SIZE:
            raise ValueError(
                f"consume queue file size {mapped_file_size} is not a positive "
                f"multiple of {CQ_STORE_UNIT_SIZE}"
            )
        self.topic = topic
        self.queue_id = queue_id
        self.directory = Path(store_dir) / topic / str(queue_id)
        self.mapped_file_size = mapped_file_size
        self.max_unit_size = max_unit_size
        self.mfq = MappedFileQueue(self.directory, mapped_file_size)
        self.max_physic_offset = -1  # end (offset + size) of the last unit's record
        self.min_logic_offset = 0  # byte offset of the first readable unit
        self._lock = threading.Lock()

    # --- loading and recovery
    def load(self) -> None:
        """Open the queue's files (ForeignFile for a bad name, size or a gap)."""
        self.mfq.load()

    def recover(self) -> None:
        """Find the last valid unit; forget everything after it.

        Scanning starts three files from the end (as RocketMQ does): earlier files are full
        by construction. A zero unit ends the queue (never written); a non-zero unit that is
        not a plausible pointer (negative offset or size, offsets going backwards) means the
        file is not what the dispatcher wrote and raises StoreCorrupted.
        """
        with self._lock:
            files = self.mfq.mapped_files
            if not files:
                self.max_physic_offset = -1
                self.min_logic_offset = 0
                return
            start = max(0, len(files) - 3)
            process_offset = files[start].file_from_offset
            last_phy, max_end = -1, -1
            for mf in files[start:]:
                end, last_phy, max_end = self._scan_valid(mf, last_phy, max_end, mf is files[-1])
                mf.wrote_position = mf.committed_position = mf.flushed_position = end
                process_offset = mf.file_from_offset + end
                if end < mf.file_size:
                    break
            self.max_physic_offset = max_end
            self.mfq.flushed_where = self.mfq.committed_where = process_offset
            self.mfq.truncate_dirty_files(process_offset)
            self._set_min_to_first_file()

    def _scan_valid(
        self, mf: MappedFile, last_phy: int, max_end: int, last_file: bool = False
    ) -> tuple[int, int, int]:
        """(valid prefix length, last commitlog offset, its record end) of `mf`.

        A unit is one 20-byte store, so a kill leaves it whole or absent, except in the
        instant of the copy itself: an implausible unit that is the very last thing
        written (zeros after it, in the last file) is that torn unit, and ends the queue;
        the dispatcher writes it again.
        """
        if not mf.hold():
            return 0, last_phy, max_end
        try:
            data = mf.read(0, mf.file_size)
        finally:
            mf.release()
        pos = 0
        for phy, size, tag in _UNIT.iter_unpack(data):
            if phy == 0 and size == 0 and tag == 0:
                break  # never written
            if size != BLANK_UNIT_SIZE:
                if not _is_valid(phy, size) or size > self.max_unit_size:
                    if last_file and len(data.rstrip(b"\0")) <= pos + CQ_STORE_UNIT_SIZE:
                        log.warning(
                            "%s: torn last unit (%d, %d, %d) at %d dropped",
                            mf.path,
                            phy,
                            size,
                            tag,
                            pos,
                        )
                        break
                    raise StoreCorrupted(
                        mf.path, pos, f"unit ({phy}, {size}, {tag}) is not a commitlog pointer"
                    )
                if phy < last_phy:
                    raise StoreCorrupted(
                        mf.path,
                        pos,
                        f"commitlog offset {phy} goes backwards (previous "
                        f"unit points at {last_phy})",
                    )
                last_phy, max_end = phy, phy + size
            pos += CQ_STORE_UNIT_SIZE
        return pos, last_phy, max_end

    def _set_min_to_first_file(self) -> None:
        first = self.mfq.get_first_mapped_file()
        self.min_logic_offset = first.file_from_offset if first is not None else 0

    # --- writing (the dispatcher's thread)
    def put_message_position_info(self, request: DispatchRequest) -> bool:
        """Write the unit for `request` at index `request.queue_offset`.

        A unit already present (a re-dispatch after recovery) is skipped; a gap before the
        expected position is filled with blank units so indexes stay positional.
        """
        return self.put_unit(
            request.queue_offset, request.commitlog_offset, request.msg_size, request.tags_code
        )

    def put_units(self, requests: Sequence[DispatchRequest]) -> bool:
        """`put_message_position_info` for consecutive records of this queue: the units
        that go right after the last one are written under one lock hold and published
        together (one `wrote_position` for all); from the first that does not (a new
        file, a gap, a re-dispatch), record by record through `put_unit`."""
        done = 0
        with self._lock:
            files = self.mfq.mapped_files
            if files:
                mf = files[-1]
                pos = start = mf.wrote_position
                at = mf.file_from_offset
                end = mf.file_size
                mapping = mf.mapping
                max_phy = self.max_physic_offset
                pack = _UNIT.pack_into
                for r in requests:
                    phy, size = r.commitlog_offset, r.msg_size
                    if phy + size <= max_phy:
                        done += 1  # already dispatched
                        continue
                    if at + pos != r.queue_offset * CQ_STORE_UNIT_SIZE or pos >= end:
                        break
                    pack(mapping, pos, phy, size, r.tags_code)
                    pos += CQ_STORE_UNIT_SIZE
                    max_phy = phy + size
                    done += 1
                if pos != start:
                    mf.wrote_position = mf.committed_position = pos
                    self.max_physic_offset = max_phy
        return all(self.put_message_position_info(r) for r in requests[done:])

    def put_unit(self, queue_offset: int, phy_offset: int, size: int, tags_code: int) -> bool:
        with self._lock:
            if phy_offset + size <= self.max_physic_offset:
                return True  # already dispatched
            expected = queue_offset * CQ_STORE_UNIT_SIZE
            files = self.mfq.mapped_files
            if files:  # the common case: the unit goes right after the last one
                mf = files[-1]
                pos = mf.wrote_position
                if mf.file_from_offset + pos == expected and pos < mf.file_size:
                    _UNIT.pack_into(mf.mapping, pos, phy_offset, size, tags_code)
                    mf.wrote_position = mf.committed_position = pos + CQ_STORE_UNIT_SIZE
                    self.max_physic_offset = phy_offset + size
                    return True
            found = self.mfq.get_last_mapped_file(expected)
            if found is None:
                return False
            mf = found
            current = mf.file_from_offset + mf.wrote_position
            if len(self.mfq.mapped_files) == 1 and mf.wrote_position == 0 and current < expected:
                # a fresh queue that starts mid-file: blank the head, readable from `expected`
                while mf.file_from_offset + mf.wrote_position < expected:
                    mf.append(_BLANK_UNIT)
                self.min_logic_offset = expected
                current = expected
            if expected < current:
                existing = self._read_unit(expected)
                if existing is not None and existing[0] != phy_offset:
                    # two records claim one queue offset: the later one is unreachable
                    log.error(
                        "%s-%d: queue offset %d already holds the record at %d; the "
                        "record at %d is not queued",
                        self.topic,
                        self.queue_id,
                        queue_offset,
                        existing[0],
                        phy_offset,
                    )
                    return True
                log.warning(
                    "%s-%d: unit %d already written; skipped",
                    self.topic,
                    self.queue_id,
                    queue_offset,
                )
                return True
            if current < expected:
                log.error(
                    "%s-%d: gap before queue offset %d; filling %d blank units",
                    self.topic,
                    self.queue_id,
                    queue_offset,
                    (expected - current) // CQ_STORE_UNIT_SIZE,
                )
            while current < expected:
                mf.append(_BLANK_UNIT)
                if mf.is_full():
                    found = self.mfq.get_last_mapped_file(0)
                    if found is None:
                        return False
                    mf = found
                current = mf.file_from_offset + mf.wrote_position
            mf.append(_UNIT.pack(phy_offset, size, tags_code))
            self.max_physic_offset = phy_offset + size
            return True

    def rewrite_unit(self, queue_offset: int, phy_offset: int, size: int, tags_code: int) -> bool:
        """Repair: set the unit at `queue_offset` (already written) to the given pointer;
        True when it held something else. Units not written yet are the dispatcher's."""
        with self._lock:
            logic = queue_offset * CQ_STORE_UNIT_SIZE
            if logic < self.min_logic_offset or logic >= self.mfq.get_max_offset():
                return False
            mf = self.mfq.find_mapped_file_by_offset(logic)
            if mf is None:
                return False
            pos = logic - mf.file_from_offset
            if pos + CQ_STORE_UNIT_SIZE > mf.wrote_position or _UNIT.unpack_from(
                mf.mapping, pos
            ) == (phy_offset, size, tags_code):
                return False
            _UNIT.pack_into(mf.mapping, pos, phy_offset, size, tags_code)
            if logic + CQ_STORE_UNIT_SIZE == self.mfq.get_max_offset():
                self.max_physic_offset = phy_offset + size
            return True

    def _read_unit(self, logic_offset: int) -> tuple[int, int, int] | None:
        mf = self.mfq.find_mapped_file_by_offset(logic_offset)
        if mf is None:
            return None
        raw = mf.read(logic_offset - mf.file_from_offset, CQ_STORE_UNIT_SIZE)
        if len(raw) != CQ_STORE_UNIT_SIZE:
            return None
        phy, size, tag = _UNIT.unpack(raw)
        return int(phy), int(size), int(tag)

    # --- reading
    def get_min_offset_in_queue(self) -> int:
        return self.min_logic_offset // CQ_STORE_UNIT_SIZE

    def get_max_offset_in_queue(self) -> int:
        """The next queue offset to be written (one past the last unit)."""
        return self.mfq.get_max_offset() // CQ_STORE_UNIT_SIZE

    def get_unit(self, index: int) -> tuple[int, int, int] | None:
        """(commitlog offset, size, tags code) of unit `index`; None when absent or blank."""
        for _, phy, size, tag in self.iter_units(index, 1):
            return phy, size, tag
        return None

    def iter_units(self, start_index: int, max_units: int) -> Iterator[Unit]:
        """Units from `start_index` on, at most `max_units` positions (blanks are skipped)."""
        offset = max(start_index * CQ_STORE_UNIT_SIZE, self.min_logic_offset)
        end = min(self.mfq.get_max_offset(), (start_index + max_units) * CQ_STORE_UNIT_SIZE)
        while offset < end:
            mf = self.mfq.find_mapped_file_by_offset(offset)
            if mf is None or not mf.hold():
                return  # deleted under us: nothing more to read here
            try:
                pos = offset - mf.file_from_offset
                stop = min(mf.wrote_position, end - mf.file_from_offset)
                data = mf.read(pos, stop - pos)
            finally:
                mf.release()
            if not data:
                return
            index = offset // CQ_STORE_UNIT_SIZE
            for phy, size, tag in _UNIT.iter_unpack(data):
                if size != BLANK_UNIT_SIZE:
                    yield index, phy, size, tag
                index += 1
            offset += len(data)

    def get_last_offset(self) -> int:
        """End (offset + size) in the commitlog of the last unit's record; -1 when empty."""
        return self.max_physic_offset

    def get_offset_in_queue_by_time(
        self, timestamp_ms: int, lookup_store_ts: StoreTimestampLookup
    ) -> int:
        """The first queue offset whose message was stored at or after `timestamp_ms`.

        Binary search over store timestamps (read from the commitlog through
        `lookup_store_ts(commitlog_offset, size)`, which returns -1 for a record that is
        gone). When every message is older, the max offset (the next to be written).
        """
        lo = self.get_min_offset_in_queue()
        hi = self.get_max_offset_in_queue()
        while lo < hi:
            mid = (lo + hi) // 2
            unit = self.get_unit(mid)
            ts = -1 if unit is None else lookup_store_ts(unit[0], unit[1])
            if ts < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # --- truncation, cleanup
    def truncate_dirty_logic_files(self, phy_offset: int) -> None:
        """Forget every unit pointing at or after commitlog offset `phy_offset`."""
        with self._lock:
            if 0 <= self.max_physic_offset <= phy_offset:
                return  # recovered, and its last unit's record ends before the cut
            cut: int | None = None
            for mf in reversed(self.mfq.mapped_files):
                file_cut: int | None = None
                pos = 0
                for phy, size, _ in _UNIT.iter_unpack(mf.read(0, mf.wrote_position)):
                    if size != BLANK_UNIT_SIZE and phy >= phy_offset:
                        file_cut = pos
                        break
                    pos += CQ_STORE_UNIT_SIZE
                if file_cut is None:
                    break  # this file is entirely below the cut, and so are earlier ones
                cut = mf.file_from_offset + file_cut
                if file_cut > 0:
                    break
            if cut is not None:
                self.mfq.truncate_dirty_files(cut)
            self.max_physic_offset = self._scan_last_end()
            max_logic = self.mfq.get_max_offset()
            if not self.mfq.mapped_files:
                self.min_logic_offset = 0
            elif self.min_logic_offset > max_logic:
                self.min_logic_offset = max_logic

    def _scan_last_end(self) -> int:
        for mf in reversed(self.mfq.mapped_files):
            data = mf.read(0, mf.wrote_position)
            for pos in range(len(data) - CQ_STORE_UNIT_SIZE, -1, -CQ_STORE_UNIT_SIZE):
                phy, size, _ = _UNIT.unpack_from(data, pos)
                if size != BLANK_UNIT_SIZE:
                    return int(phy + size)
        return -1

    def correct_min_offset(self, commitlog_min_offset: int) -> None:
        """Move the queue's min offset to the first unit whose record still exists."""
        with self._lock:
            first = self.mfq.get_first_mapped_file()
            if first is None:
                return
            offset = max(self.min_logic_offset, first.file_from_offset)
            chunk = _SCAN_CHUNK_UNITS * CQ_STORE_UNIT_SIZE
            for mf in self.mfq.mapped_files:
                if mf.file_from_offset + mf.wrote_position <= offset:
                    continue
                pos = max(0, offset - mf.file_from_offset)
                while pos < mf.wrote_position:  # usually the first chunk holds the answer
                    data = mf.read(pos, min(chunk, mf.wrote_position - pos))
                    for phy, size, _ in _UNIT.iter_unpack(data):
                        if size != BLANK_UNIT_SIZE and phy >= commitlog_min_offset:
                            self.min_logic_offset = mf.file_from_offset + pos
                            return
                        pos += CQ_STORE_UNIT_SIZE
            # every unit points below the commitlog: the queue is empty until the next put
            self.min_logic_offset = self.mfq.get_max_offset()

    def delete_expired_file(self, commitlog_min_offset: int) -> int:
        """Delete files (never the last) whose every unit is below the commitlog's min."""
        with self._lock:
            count = self.mfq.delete_expired_file_by_offset(commitlog_min_offset, CQ_STORE_UNIT_SIZE)
        self.correct_min_offset(commitlog_min_offset)
        return count

    def flush(self, least_pages: int) -> bool:
        return self.mfq.flush(least_pages)

    def shutdown(self) -> None:
        self.mfq.shutdown(0)

    def destroy(self) -> None:
        with self._lock:
            self.mfq.destroy()
            self.max_physic_offset = -1
            self.min_logic_offset = 0

    def __repr__(self) -> str:
        return (
            f"ConsumeQueue({self.topic!r}, {self.queue_id}, "
            f"min={self.get_min_offset_in_queue()}, max={self.get_max_offset_in_queue()})"
        )
