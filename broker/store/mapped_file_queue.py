"""A directory of equally sized mapped files forming one contiguous offset space.

    directory/00000000000000000000   offsets [0, size)
    directory/00000000000001048576   offsets [size, 2*size)       (size = 1 MiB here)
    ...

File k starts at k * size; a gap, a wrongly sized file or a name that is not 20 digits is a
`ForeignFile`. The list `mapped_files` is replaced, never mutated, so a reader can iterate a
snapshot without a lock. The next file can be created and pre-touched ahead of time by a
`MappedFileAllocator` so the writer never pays for allocation or cold page faults.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from broker.store.errors import ForeignFile
from broker.store.mapped_file import MappedFile, file_name, is_temp_name, parse_file_name

log = logging.getLogger(__name__)

_I64 = struct.Struct(">q")


class MappedFileAllocator:
    """Creates the next mapped file (and pre-touches it) on a background thread.

    `get(path, size)` hands out the file prepared for `path` when there is one (waiting for
    it if it is being prepared), else creates it in the caller, then starts preparing the
    file after it.
    """

    def __init__(
        self, warm: bool = True, flush_on_warm: bool = False, warm_limit: int | None = None
    ) -> None:
        self.warm = warm
        self.flush_on_warm = flush_on_warm
        # pre-touch only the first `warm_limit` bytes (None: all); the writer's warm-ahead
        # (CommitLog) carries on from there as it writes
        self.warm_limit = warm_limit
        self._lock = threading.Lock()
        self._pending: dict[Path, threading.Thread] = {}
        self._ready: dict[Path, MappedFile] = {}
        self._errors: dict[Path, BaseException] = {}
        self._closed = False

    def _prepare(self, path: Path, size: int) -> None:
        try:
            mf = MappedFile(path, size)
            if self.warm:
                mf.warm(self.flush_on_warm, self.warm_limit)
        except BaseException as exc:  # reported to the caller of get()
            with self._lock:
                self._errors[path] = exc
                self._pending.pop(path, None)
            return
        with self._lock:
            self._pending.pop(path, None)
            if not self._closed:
                self._ready[path] = mf
                return
        mf.close()  # closed while preparing: leave nothing behind
        path.unlink(missing_ok=True)

    def request(self, path: Path, size: int) -> None:
        with self._lock:
            if self._closed or path in self._pending or path in self._ready or path.exists():
                return
            t = threading.Thread(
                target=self._prepare, args=(path, size), name=f"allocate-{path.name}", daemon=True
            )
            self._pending[path] = t
        t.start()

    def get(self, path: Path, size: int, next_path: Path | None = None) -> MappedFile:
        with self._lock:
            pending = self._pending.get(path)
        if pending is not None:
            pending.join()
        with self._lock:
            mf = self._ready.pop(path, None)
            self._errors.pop(path, None)
        if mf is None:
            mf = MappedFile(path, size)
        if next_path is not None:
            self.request(next_path, size)
        return mf

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pending = list(self._pending.values())
        for t in pending:
            t.join()
        with self._lock:
            ready = list(self._ready.values())
            self._ready.clear()
        for mf in ready:  # prepared but never used: keep nothing behind
            mf.close()
            mf.path.unlink(missing_ok=True)


class MappedFileQueue:
    """Ordered mapped files of one size in one directory."""

    def __init__(
        self,
        directory: Path,
        mapped_file_size: int,
        allocator: MappedFileAllocator | None = None,
        fsync: Callable[[int], None] = os.fdatasync,
    ) -> None:
        self.directory = Path(directory)
        self.fsync = fsync
        self.mapped_file_size = mapped_file_size
        self.allocator = allocator
        self.mapped_files: list[MappedFile] = []
        self.flushed_where = 0
        self.committed_where = 0
        self.store_timestamp = 0  # store time of the last flushed record (checkpoint)
        self._lock = threading.Lock()
        # a flush and a cut of a running queue's tail never interleave (a flush would
        # otherwise move `flushed_where` back past the new end)
        self._flush_lock = threading.Lock()

    # --- loading
    def load(self) -> None:
        """Open every file in the directory (positions set to full; recovery fixes them)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        entries = []
        for path in sorted(self.directory.iterdir(), key=lambda p: p.name):
            if is_temp_name(path.name) and path.is_file():
                path.unlink()  # a file whose creation a crash interrupted: never used
                continue
            entries.append(path)
        files: list[MappedFile] = []
        expected: int | None = None
        try:
            for path in entries:
                if not path.is_file():
                    raise ForeignFile(path, "a directory among store files")
                start = parse_file_name(path)
                if start % self.mapped_file_size:
                    raise ForeignFile(
                        path,
                        f"offset {start} is not a multiple of the "
                        f"file size {self.mapped_file_size}",
                    )
                if expected is not None and start != expected:
                    raise ForeignFile(path, f"gap: expected a file at offset {expected}")
                mf = MappedFile(path, self.mapped_file_size, start, fsync=self.fsync)
                mf.wrote_position = mf.committed_position = mf.flushed_position = (
                    self.mapped_file_size
                )
                files.append(mf)
                expected = start + self.mapped_file_size
        except BaseException:
            for mf in files:
                mf.close()
            raise
        self.mapped_files = files

    # --- lookup
    def get_first_mapped_file(self) -> MappedFile | None:
        files = self.mapped_files
        return files[0] if files else None

    def get_last_mapped_file(self, start_offset: int = 0, create: bool = True) -> MappedFile | None:
        """The last file; a new one when there is none or it is full and `create`."""
        files = self.mapped_files
        last = files[-1] if files else None
        if last is not None and not last.is_full():
            return last
        if not create:
            return last
        if last is None:
            create_offset = start_offset - start_offset % self.mapped_file_size
        else:
            create_offset = last.file_from_offset + self.mapped_file_size
        return self._create(create_offset)

    def _create(self, offset: int) -> MappedFile:
        with self._lock:
            files = self.mapped_files
            if files and files[-1].file_from_offset >= offset:
                return files[-1]
            path = self.directory / file_name(offset)
            self.directory.mkdir(parents=True, exist_ok=True)
            if self.allocator is not None:
                mf = self.allocator.get(path, self.mapped_file_size)
            else:
                mf = MappedFile(path, self.mapped_file_size, offset)
            mf.fsync = self.fsync
            self.mapped_files = [*files, mf]
            return mf

    def prepare_next_file(self) -> None:
        """Have the allocator create (and warm) the file after the last one, ahead of time."""
        files = self.mapped_files
        if self.allocator is not None and files:
            nxt = files[-1].file_from_offset + self.mapped_file_size
            self.allocator.request(self.directory / file_name(nxt), self.mapped_file_size)

    def find_mapped_file_by_offset(
        self, offset: int, return_first_on_not_found: bool = False
    ) -> MappedFile | None:
        files = self.mapped_files
        if not files:
            return None
        first = files[0]
        index = offset // self.mapped_file_size - first.file_from_offset // self.mapped_file_size
        if 0 <= index < len(files):
            mf = files[index]
            if mf.file_from_offset <= offset < mf.file_from_offset + self.mapped_file_size:
                return mf
        return first if return_first_on_not_found else None

    def get_min_offset(self) -> int:
        files = self.mapped_files
        return files[0].file_from_offset if files else -1

    def get_max_offset(self) -> int:
        files = self.mapped_files
        if not files:
            return 0
        last = files[-1]
        return last.file_from_offset + last.wrote_position

    # --- flushing
    def flush(self, least_pages: int) -> bool:
        """Flush the file holding `flushed_where`; True when nothing was left to flush."""
        with self._flush_lock:
            mf = self.find_mapped_file_by_offset(self.flushed_where, self.flushed_where == 0)
            if mf is None:
                return True
            where = mf.file_from_offset + mf.flush(least_pages)
            result = where == self.flushed_where
            if where > self.flushed_where:
                self.flushed_where = where
            return result

    def flush_to(self, offset: int) -> int:
        """Flush every file until `flushed_where` >= `offset`; returns `flushed_where`."""
        while self.flushed_where < offset:
            before = self.flushed_where
            self.flush(0)
            if self.flushed_where == before:
                break
        return self.flushed_where

    # --- truncation and deletion
    def truncate_dirty_files(self, offset: int, zero_tail: bool = True) -> None:
        """Forget everything at and after `offset`: the tail is zeroed, later files deleted.

        `zero_tail=False` skips zeroing the rest of the file holding `offset` (the caller
        knows it holds only zeros already, e.g. after a clean shutdown).
        """
        with self._flush_lock:
            keep: list[MappedFile] = []
            gone: list[MappedFile] = []
            for mf in self.mapped_files:
                tail = mf.file_from_offset + self.mapped_file_size
                if tail <= offset:
                    keep.append(mf)
                elif mf.file_from_offset <= offset:
                    pos = offset - mf.file_from_offset
                    # readers see the new end before the bytes beyond it are zeroed
                    mf.wrote_position = mf.committed_position = mf.flushed_position = pos
                    # stale bytes past the new end would be rescanned by a later recovery
                    if zero_tail:
                        _zero_range(mf, pos, self.mapped_file_size)
                        mf.sync()
                    keep.append(mf)
                else:
                    gone.append(mf)
            self.mapped_files = keep  # before the files go: no new reader finds them
            for mf in gone:
                mf.destroy(1000)
            self.flushed_where = min(self.flushed_where, offset)
            self.committed_where = min(self.committed_where, offset)

    def delete_expired_file_by_time(
        self,
        expired_ms: int,
        delete_interval_ms: int,
        interval_forcibly_ms: int,
        clean_immediately: bool,
        max_batch: int,
        now_ms: int,
        sleep: Callable[[float], None] = time.sleep,
    ) -> int:
        """Delete files last modified `expired_ms` ago (all but the last); returns the count."""
        files = self.mapped_files
        deleted: list[MappedFile] = []
        for mf in files[:-1]:
            if not (clean_immediately or now_ms >= mf.last_modified_ms + expired_ms):
                break
            if not mf.destroy(interval_forcibly_ms):
                break  # still held by a reader: try again next round
            deleted.append(mf)
            if len(deleted) >= max_batch:
                break
            if delete_interval_ms > 0:
                sleep(delete_interval_ms / 1000)
        self._remove(deleted)
        return len(deleted)

    def delete_expired_file_by_offset(self, offset: int, unit_size: int) -> int:
        """Delete files (all but the last) whose last unit points below commitlog `offset`."""
        files = self.mapped_files
        deleted: list[MappedFile] = []
        for mf in files[:-1]:
            if not mf.hold():
                break
            try:
                last_unit = mf.read(self.mapped_file_size - unit_size, 8)
            finally:
                mf.release()
            (max_phy,) = _I64.unpack(last_unit)
            if max_phy >= offset:
                break
            if not mf.destroy(60_000):
                break
            deleted.append(mf)
        self._remove(deleted)
        return len(deleted)

    def _remove(self, gone: list[MappedFile]) -> None:
        if not gone:
            return
        with self._lock:
            ids = {id(mf) for mf in gone}
            self.mapped_files = [mf for mf in self.mapped_files if id(mf) not in ids]

    def shutdown(self, interval_forcibly_ms: int) -> None:
        for mf in self.mapped_files:
            mf.close()
        if self.allocator is not None:
            self.allocator.close()

    def destroy(self) -> None:
        for mf in self.mapped_files:
            mf.destroy(0)
        self.mapped_files = []
        self.flushed_where = 0
        self.committed_where = 0


def _zero_range(mf: MappedFile, start: int, end: int) -> None:
    """Zero [start, end), writing only the chunks that are not zero already."""
    end = min(end, mf.file_size)
    chunk = 1 << 20
    zeros = bytes(chunk)
    pos = start
    while pos < end:
        n = min(chunk - pos % chunk, end - pos)
        if mf.read(pos, n) != zeros[:n]:
            mf.write_at(pos, zeros[:n])
        pos += n


__all__ = ["MappedFileAllocator", "MappedFileQueue", "parse_file_name"]
