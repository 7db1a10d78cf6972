"""One hash index file: a header, hash slots and entries, mapped whole.

    index/20261122053657123   created 2026-11-22 05:36:57.123 UTC
    index/20261122061502004   the next one, once the first holds `max_index_num` entries

A lookup hashes the key (`index_key.index_key_hash`: CRC-32 of the UTF-8 `topic#key`,
masked to 31 bits), reads the slot, and walks the chain of entries that share it, newest
first. Entries carry the full 31-bit key hash, so slot collisions are skipped cheaply;
entries with the *same* hash but another key cannot be told apart here: callers filter
the decoded messages by their real keys (`broker.store.query`).

Files are sparse and mapped whole: a default file is 420 MB of address space, but only the
pages written take disk space. Names are UTC creation times, strictly increasing. The
files of a store are kept by `index_service.IndexService`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

from broker.store.durable_write import fsync_directory
from broker.store.errors import ForeignFile, StoreCorrupted
from broker.store.index_key import index_key_hash
from broker.store.refcount import ReferenceResource

log = logging.getLogger(__name__)

# Header, big-endian, 40 bytes:
#
#   0            8            16           24           32        36        40
#   +------------+------------+------------+------------+---------+---------+
#   | begin ts   | end ts     | begin phy  | end phy    | slots   | index   |
#   | i64 ms     | i64 ms     | i64        | i64        | used i32| count i32
#   +------------+------------+------------+------------+---------+---------+
#
# `slots used` counts hash slots holding a chain; `index count` is one more than the
# number of entries (entry 0 is invalid: a slot or link of 0 means "none").
INDEX_HEADER_SIZE = 40
_HEADER = struct.Struct(">qqqqii")
assert _HEADER.size == INDEX_HEADER_SIZE

# Hash slots: `max_hash_slot_num` x i32, the newest entry of the slot's chain (0 = empty).
HASH_SLOT_SIZE = 4
_SLOT = struct.Struct(">i")

# Entries: `max_index_num` x 20 bytes, appended in commitlog order:
#
#   0          4                 12         16         20
#   +----------+-----------------+----------+----------+
#   | key hash | commitlog off   | time diff| previous |
#   |   i32    |      i64        | i32 (s)  |   i32    |
#   +----------+-----------------+----------+----------+
#
# `time diff` is (store timestamp - begin ts) in whole seconds; `previous` is the next
# older entry of the same slot (0 ends the chain).
INDEX_ENTRY_SIZE = 20
_ENTRY = struct.Struct(">iqii")
assert _ENTRY.size == INDEX_ENTRY_SIZE

INVALID_INDEX = 0
_I32_MAX = 0x7FFFFFFF
_NAME_DIGITS = 17  # yyyyMMddHHmmssSSS
_RESERVE_CHUNK = 4 * 1024 * 1024  # entries get disk blocks this much at a time
_REBUILD_HINT = (
    "; the index is derived data: stop the store and delete the index "
    "directory to rebuild it from the commitlog"
)
_LITTLE = sys.byteorder == "little"
try:  # `put_records`' entry and slot writes, compiled (see _recordpack.c)
    from broker.store._recordpack import index_entries as _index_entries
except ImportError:  # not built, or built from an older source: the Python loop
    _index_entries = None  # type: ignore[assignment]


def index_file_name(ms: int) -> str:
    dt = datetime.fromtimestamp(ms // 1000, tz=UTC)
    return dt.strftime("%Y%m%d%H%M%S") + f"{ms % 1000:03d}"


def parse_index_file_name(path: Path) -> int:
    """Creation time (ms, UTC) encoded in an index file name; ForeignFile otherwise."""
    name = path.name
    if len(name) != _NAME_DIGITS or not name.isdigit():
        raise ForeignFile(path, "name is not a yyyyMMddHHmmssSSS creation time")
    try:
        dt = datetime.strptime(name[:14], "%Y%m%d%H%M%S").replace(tzinfo=UTC)
    except ValueError as exc:
        raise ForeignFile(path, f"name is not a valid time: {exc}") from exc
    return int(dt.timestamp()) * 1000 + int(name[14:])


def index_temp_path(path: Path) -> Path:
    """Where a new index file is sized and headed before it is renamed into place."""
    return path.with_name(f".{path.name}.tmp")


def is_index_temp(name: str) -> bool:
    """`name` is an index file's temporary name (`index_temp_path`)."""
    core = name[1:-4]
    return (
        name.startswith(".")
        and name.endswith(".tmp")
        and len(core) == _NAME_DIGITS
        and core.isdigit()
    )


def index_file_size(hash_slot_num: int, index_num: int) -> int:
    return INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE + index_num * INDEX_ENTRY_SIZE


class IndexFile(ReferenceResource):
    """One hash index file, mapped whole; reference counted like a mapped file."""

    def __init__(
        self,
        path: Path,
        hash_slot_num: int,
        index_num: int,
        *,
        create_after: tuple[int, int] | None = None,
    ) -> None:
        """Open `path`, or create it when `create_after` = (end phy, end ts) of the previous."""
        if hash_slot_num <= 0 or index_num <= 1:
            raise ValueError("an index file needs at least 1 hash slot and 2 entries")
        self.path = Path(path)
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.file_size = index_file_size(hash_slot_num, index_num)
        self._entries_at = INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE
        self._init_references()
        self._closed = False
        self._dirty = create_after is not None  # written since the last flush
        if create_after is None:
            size = self.path.stat().st_size
            if size != self.file_size:
                raise ForeignFile(
                    self.path,
                    f"size {size} != {self.file_size} expected for "
                    f"{hash_slot_num} hash slots and {index_num} entries",
                )
            self._fd = os.open(self.path, os.O_RDWR)
        else:
            # created under a temporary name, renamed into place once sized and headed:
            # a crash never leaves a short or headerless file under an index file's name
            if self.path.exists():
                raise FileExistsError(self.path)
            tmp = index_temp_path(self.path)
            self._fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if create_after is not None:
                os.ftruncate(self._fd, self.file_size)  # sparse: pages cost disk when written
                self._reserve(0, self._entries_at)  # header + slots: written anywhere
            self._mm = mmap.mmap(self._fd, self.file_size)
        except BaseException:
            os.close(self._fd)
            if create_after is not None:
                index_temp_path(self.path).unlink(missing_ok=True)
            raise
        # bytes known to have disk blocks; an opened file is reserved again on first write
        self._reserved_to = self._entries_at if create_after is not None else 0
        if create_after is None:
            header = [int(v) for v in _HEADER.unpack_from(self._mm, 0)]
            (
                self.begin_timestamp,
                self.end_timestamp,
                self.begin_phy_offset,
                self.end_phy_offset,
                self.hash_slot_count,
                self.index_count,
            ) = header
            if self.index_count == 0:  # created, never written
                self.index_count = 1
            try:
                self._validate()
            except BaseException:
                self.close()
                raise
        else:
            end_phy, end_ts = create_after
            self.begin_phy_offset = self.end_phy_offset = end_phy
            self.begin_timestamp = self.end_timestamp = end_ts
            self.hash_slot_count = 0
            self.index_count = 1
            self._write_header()
            os.rename(index_temp_path(self.path), self.path)
            fsync_directory(self.path.parent)

    def _reserve(self, start: int, end: int) -> None:
        """Give [start, end) real disk blocks before it is written through the mapping.

        A store through a mapping into a sparse hole needs a block; on a full disk the
        kernel answers with SIGBUS, which kills the process. posix_fallocate turns that
        into an OSError the dispatcher retries. Filesystems without it stay sparse.
        """
        try:
            os.posix_fallocate(self._fd, start, end - start)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise

    def _reserve_entries(self, count: int) -> None:
        """Make sure entries up to `count` (exclusive) have disk blocks."""
        need = self._entry_pos(count)
        if need <= self._reserved_to:
            return
        start = self._reserved_to if self._reserved_to else 0
        end = min(self.file_size, need + _RESERVE_CHUNK - need % _RESERVE_CHUNK)
        self._reserve(start, end)
        self._reserved_to = end

    def _validate(self) -> None:
        """Check the header and repair what a crash between two writes leaves behind.

        The durable state is the header's index count: `put_records` writes entries, then
        the slots, then the header; `truncate` writes the header, then the slots, then
        zeros the entries. A process killed in between leaves slots pointing at entries
        the header does not count (or no longer counts). Those entries were never
        written as far as the file is concerned: such a slot is set back to the first
        entry of its chain below the count (each entry's `previous` is the slot's older
        value), and the dispatcher re-indexes the newest record after an abnormal stop.
        Only values no crash can produce (outside the file, a last entry that is not the
        header's) are StoreCorrupted; the index is rebuilt from the commitlog when its
        directory is deleted.
        """
        n = self.index_count
        if not 1 <= n <= self.index_num:
            raise StoreCorrupted(
                self.path, 36, f"index count {n} outside 1..{self.index_num}{_REBUILD_HINT}"
            )
        if self.begin_phy_offset < 0 or self.end_phy_offset < self.begin_phy_offset:
            raise StoreCorrupted(
                self.path,
                16,
                f"phy offsets {self.begin_phy_offset}.."
                f"{self.end_phy_offset} are not a range{_REBUILD_HINT}",
            )
        slots = array("i")
        slots.frombytes(self._mm[INDEX_HEADER_SIZE : self._entries_at])
        if _LITTLE:
            slots.byteswap()
        if slots and (min(slots) < 0 or max(slots) >= self.index_num):
            raise StoreCorrupted(
                self.path,
                INDEX_HEADER_SIZE,
                f"a hash slot points outside entries 0..{self.index_num - 1}{_REBUILD_HINT}",
            )
        if slots and max(slots) >= n:
            repaired = 0
            for i, value in enumerate(slots):
                if value >= n:
                    _SLOT.pack_into(
                        self._mm, INDEX_HEADER_SIZE + i * HASH_SLOT_SIZE, self._live_link(value, n)
                    )
                    repaired += 1
            self._dirty = True
            log.warning(
                "%s: %d hash slot(s) pointed past the %d entries counted (a crash "
                "between two writes); set back to their chains' counted entries",
                self.path,
                repaired,
                n - 1,
            )
            slots = array("i")
            slots.frombytes(self._mm[INDEX_HEADER_SIZE : self._entries_at])
        # a statistic: recounted rather than trusted (a crash can leave it one step off)
        self.hash_slot_count = len(slots) - slots.count(0)
        if n > 1:
            _, phy, _, prev = _ENTRY.unpack_from(self._mm, self._entry_pos(n - 1))
            if phy != self.end_phy_offset or not 0 <= prev < n - 1:
                raise StoreCorrupted(
                    self.path,
                    self._entry_pos(n - 1),
                    f"last entry does not match the header{_REBUILD_HINT}",
                )

    def _live_link(self, value: int, count: int) -> int:
        """Follow `previous` links from entry `value` down to the first entry below
        `count` (0 when the chain has none)."""
        while value >= count:
            if value >= self.index_num:
                return INVALID_INDEX
            prev = _ENTRY.unpack_from(self._mm, self._entry_pos(value))[3]
            if not 0 <= prev < value:
                return INVALID_INDEX  # never written (zeros) or not a chain
            value = prev
        return value

    # --- layout helpers
    def _entry_pos(self, index: int) -> int:
        return self._entries_at + index * INDEX_ENTRY_SIZE

    def _slot_pos(self, key_hash: int) -> int:
        return INDEX_HEADER_SIZE + (key_hash % self.hash_slot_num) * HASH_SLOT_SIZE

    def _write_header(self) -> None:
        self._dirty = True
        _HEADER.pack_into(
            self._mm,
            0,
            self.begin_timestamp,
            self.end_timestamp,
            self.begin_phy_offset,
            self.end_phy_offset,
            self.hash_slot_count,
            self.index_count,
        )

    # --- state
    @property
    def entry_count(self) -> int:
        return self.index_count - 1

    def is_full(self) -> bool:
        return self.index_count >= self.index_num

    def is_time_matched(self, begin_ms: int, end_ms: int) -> bool:
        return (
            self.entry_count > 0
            and self.begin_timestamp <= end_ms
            and self.end_timestamp >= begin_ms
        )

    # --- writing (one writer: the dispatcher, under the service's lock)
    def put_hashes(self, hashes: Sequence[int], phy_offset: int, store_timestamp: int) -> int:
        """Append an entry per key hash of one record; returns how many fit (the rest go
        to the next file). Written as `put_records` writes: entries, slots, header."""
        room = max(0, self.index_num - self.index_count)
        fit = hashes if len(hashes) <= room else hashes[:room]
        if fit:
            self.put_records([(fit, phy_offset, store_timestamp)])
        return len(fit)

    def put_records(self, records: Sequence[tuple[Sequence[int], int, int]]) -> int:
        """Append the entries of records, (hashes, commitlog offset, store time) each, in
        commitlog order, with the header and the slots written once for all of them.
        Takes the leading records whose entries all fit in this file; returns how many it
        took (the caller puts the rest).

        Crash-safe order (a SIGKILL keeps every store already made through the mapping):
        1. the entries, past the header's count (not yet counted, so never read);
        2. the hash slots: a slot pointing past the count is a crash leftover that the load
           repairs (`_validate`: back along the entries' `previous` links, below the count);
        3. the header: count, end offset and time, which counts every record at once.
        Killed before 3, none of the records is indexed, and recovery re-dispatches them
        all (it re-indexes from the newest record the header counts). The slots go before
        the header because the header counts several records: written first, it would
        leave every record but the newest unreachable after a kill, and only the newest
        is re-indexed.
        """
        room = self.index_num - self.index_count
        take = 0
        need = 0
        for hashes, _, _ in records:
            if need + len(hashes) > room:
                break
            need += len(hashes)
            take += 1
        if take == 0 or need == 0:
            return take
        mm = self._mm
        slots = self.hash_slot_num
        entries_at = self._entries_at
        if entries_at + (self.index_count + need) * INDEX_ENTRY_SIZE > self._reserved_to:
            self._reserve_entries(min(self.index_num, self.index_count + need))
        index = first = self.index_count
        if index == 1:
            for hashes, phy, ts in records[:take]:
                if hashes:
                    self.begin_timestamp, self.begin_phy_offset = ts, phy
                    break
        begin = self.begin_timestamp
        taken = records[:take]
        written = None
        if _index_entries is not None:  # steps 1 and 2 in one call, or nothing written
            # a value that does not fit raises before any write: the loop names it then
            with contextlib.suppress(TypeError, ValueError, OverflowError, IndexError):
                written = _index_entries(
                    mm,
                    entries_at,
                    slots,
                    first,
                    begin,
                    self.end_timestamp,
                    self.hash_slot_count,
                    list(taken),
                )
        if written is None:
            written = self._put_entries(taken, first, begin)
        self.index_count, self.hash_slot_count, self.end_timestamp, self.end_phy_offset = written
        self._write_header()
        return take

    def _put_entries(
        self, records: Sequence[tuple[Sequence[int], int, int]], first: int, begin: int
    ) -> tuple[int, int, int, int]:
        """Steps 1 and 2 of `put_records` (entries from index `first`, then their slots):
        (index count, slots used, end time, end offset) for its header."""
        mm = self._mm
        slots = self.hash_slot_num
        entries_at = self._entries_at
        index = first
        used = self.hash_slot_count
        end_ts = self.end_timestamp
        phy = self.end_phy_offset
        pack_entry = _ENTRY.pack_into
        unpack_slot = _SLOT.unpack_from
        new_slots: dict[int, int] = {}
        for hashes, phy, ts in records:
            diff = (ts - begin) // 1000
            diff = 0 if diff < 0 else min(diff, _I32_MAX)
            if ts > end_ts:
                end_ts = ts
            for key_hash in hashes:
                slot_pos = INDEX_HEADER_SIZE + (key_hash % slots) * HASH_SLOT_SIZE
                slot_value = new_slots.get(slot_pos)
                if slot_value is None:
                    slot_value = unpack_slot(mm, slot_pos)[0]
                    if slot_value <= INVALID_INDEX or slot_value >= first:
                        slot_value = INVALID_INDEX
                        used += 1
                pack_entry(
                    mm, entries_at + index * INDEX_ENTRY_SIZE, key_hash, phy, diff, slot_value
                )
                new_slots[slot_pos] = index
                index += 1
        pack_slot = _SLOT.pack_into
        for slot_pos, value in new_slots.items():
            pack_slot(mm, slot_pos, value)
        return index, used, end_ts, phy

    def truncate(self, phy_offset: int) -> None:
        """Undo every entry pointing at or after `phy_offset`, newest first.

        Crash-safe order: the header first (the entries stop being counted), then the
        slots set back to the entries' `previous`, then the entries zeroed. Killed after
        the header, the load repairs slots left pointing past the count (`_validate`).
        """
        mm = self._mm
        n = self.index_count
        restored: dict[int, int] = {}
        used = self.hash_slot_count
        while n > 1:
            key_hash, phy, _, prev = _ENTRY.unpack_from(mm, self._entry_pos(n - 1))
            if phy < phy_offset:
                break
            slot_pos = self._slot_pos(key_hash)
            current = restored.get(slot_pos)
            if current is None:
                current = _SLOT.unpack_from(mm, slot_pos)[0]
            if current == n - 1:  # always, entries are undone in reverse order
                restored[slot_pos] = prev
                if prev == INVALID_INDEX:
                    used -= 1
            n -= 1
        if n == self.index_count:
            return
        old_count = self.index_count
        self.index_count = n
        self.hash_slot_count = max(used, 0)
        if n > 1:
            _, phy, diff, _ = _ENTRY.unpack_from(mm, self._entry_pos(n - 1))
            self.end_phy_offset = int(phy)
            self.end_timestamp = self.begin_timestamp + int(diff) * 1000 + 999
        else:
            self.end_phy_offset = self.begin_phy_offset
            self.end_timestamp = self.begin_timestamp
        self._write_header()
        for slot_pos, value in restored.items():
            _SLOT.pack_into(mm, slot_pos, value)
        mm[self._entry_pos(n) : self._entry_pos(old_count)] = bytes(
            (old_count - n) * INDEX_ENTRY_SIZE
        )

    # --- reading
    def iter_offsets(
        self, key: str, begin_ms: int, end_ms: int, budget: list[int]
    ) -> Iterator[int]:
        """Commitlog offsets of entries with `key`'s hash stored within [begin, end].

        `budget[0]` is how many entries may still be visited; it is decremented in place so
        a query over many files stays bounded. The caller holds the file.
        """
        key_hash = index_key_hash(key)
        (current,) = _SLOT.unpack_from(self._mm, self._slot_pos(key_hash))
        count = self.index_count
        while INVALID_INDEX < current < count and budget[0] > 0:
            budget[0] -= 1
            entry_hash, phy, diff, prev = _ENTRY.unpack_from(self._mm, self._entry_pos(current))
            # the entry's time is known to the second: it lies in [t, t + 999]
            t = self.begin_timestamp + diff * 1000
            if entry_hash == key_hash and t <= end_ms and t + 999 >= begin_ms:
                yield phy
            if prev >= current or t + 999 < begin_ms:
                return  # chains only go back in time: nothing older can match
            current = prev

    # --- lifetime (hold/release: ReferenceResource)
    def flush(self) -> None:
        """Write the mapping's dirty pages to disk when anything was written since the last
        flush: fdatasync on the descriptor (one page cache with the mapping, as
        `broker.store.mapped_file` explains), which releases the GIL; Python's
        `mmap.flush()` holds it for the whole msync, stalling every other thread (the
        server's event loop) for as long as the disk takes, milliseconds under load."""
        if self._dirty and self.hold():
            try:
                self._dirty = False
                os.fdatasync(self._fd)
            finally:
                self.release()

    def _free(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(BufferError):  # a view is still exported: freed with it
            self._mm.close()
        os.close(self._fd)

    def close(self) -> None:
        with self._ref_lock:
            if self._available:
                self._available = False
                self._refs -= 1
            if self._refs <= 0:
                self._free()

    def destroy(self) -> None:
        """Delete the file now; the mapping goes when the last reader releases it."""
        self.close()
        self.path.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return (
            f"IndexFile({self.path.name}, entries={self.entry_count}, "
            f"phy={self.begin_phy_offset}..{self.end_phy_offset})"
        )
