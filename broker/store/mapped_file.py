"""One fixed-size, pre-allocated, memory-mapped store file.

A mapped file is named by the 20-digit zero-padded store offset of its first byte
(`00000000000001073741824`). It is created at its full size with `posix_fallocate` (real
blocks, not a sparse hole, so a later fdatasync has no allocation to journal) and mapped
read-write once. Writers append into the mapping; readers slice it.

Positions, all relative to the file's first byte:

    0 ............ flushed_position ........ wrote_position ............ file_size
    |  on disk      |  in the page cache only  |  zeros (pre-allocated)      |

`committed_position` equals `wrote_position` here (no transient write buffer).

Durability: `flush()` calls `fdatasync` on the file descriptor. On Linux a shared file
mapping and the descriptor share one page cache, so fdatasync writes back the pages dirtied
through the mapping exactly as `msync(MS_SYNC)` would, without Python's whole-mapping
`mmap.flush()` (measured 2-4x slower for the same bytes).

Lifetime: readers `hold()` the file while they use a buffer of it and `release()` after;
`destroy()` unmaps and deletes it only once nobody holds it (or forcibly after an interval),
so cleanup never pulls a mapping from under a reader.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from broker.store.errors import ForeignFile
from broker.store.refcount import ReferenceResource

OS_PAGE_SIZE = 4096
FILE_NAME_DIGITS = 20
_WARM_CHUNK = 1 << 20  # pre-touch 1 MiB at a time
_WARM_CHUNK_IN_PLACE = 1 << 18  # 256 KiB per populate call
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14
_ZEROS = bytes(_WARM_CHUNK)


def _load_madvise() -> Callable[[int, int, int], int] | None:
    """libc's madvise through ctypes, which releases the GIL for the call (the mmap
    module's `madvise` holds it: populating a window would stall every other thread)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):  # pragma: no cover - not a glibc/musl system
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


_madvise = _load_madvise()


def _round_up(pos: int) -> int:
    return pos + (-pos % OS_PAGE_SIZE)


def file_name(offset: int) -> str:
    """The 20-digit zero-padded name of the file starting at store offset `offset`."""
    return f"{offset:0{FILE_NAME_DIGITS}d}"


def parse_file_name(path: Path) -> int:
    """Start offset encoded in a store file name; ForeignFile for anything else."""
    name = path.name
    if len(name) != FILE_NAME_DIGITS or not name.isdigit():
        raise ForeignFile(path, f"name is not a {FILE_NAME_DIGITS}-digit offset")
    return int(name)


def temp_name(path: Path) -> Path:
    """Where a new file is pre-allocated before it is renamed into place."""
    return path.with_name(f".{path.name}.tmp")


def is_temp_name(name: str) -> bool:
    core = name[1:-4]
    return (
        name.startswith(".")
        and name.endswith(".tmp")
        and len(core) == FILE_NAME_DIGITS
        and core.isdigit()
    )


def _create_preallocated(path: Path, file_size: int) -> int:
    """Create `path` at its full size atomically: a crash never leaves a short file.

    The file is allocated under a temporary name, renamed into place, and the directory
    is fsynced so the new name survives a power cut along with the data later synced in it.
    """
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            os.posix_fallocate(fd, 0, file_size)
        except OSError:  # filesystems without fallocate: a sized sparse file
            os.ftruncate(fd, file_size)
        os.rename(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return fd


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class MappedFile(ReferenceResource):
    """A fixed-size store file mapped into memory, with reference counting."""

    def __init__(
        self,
        path: Path,
        file_size: int,
        file_from_offset: int | None = None,
        *,
        clock: Callable[[], int] = _monotonic_ms,
        fsync: Callable[[int], None] = os.fdatasync,
    ) -> None:
        self.path = Path(path)
        self.file_size = file_size
        self.file_from_offset = (
            parse_file_name(self.path) if file_from_offset is None else file_from_offset
        )
        self.wrote_position = 0
        self.committed_position = 0
        self.flushed_position = 0
        self._clock = clock
        self.fsync = fsync  # injectable: tests slow it down or make it fail
        self.warmed = False  # every page past wrote_position pre-touched
        self.warming = False
        self.warmed_to = 0  # pages below it (and past wrote_position) are pre-touched
        self._init_references()  # the owner's own reference is dropped by shutdown()
        self._cleaned = False
        self._first_shutdown_ms = 0
        self._flush_lock = threading.Lock()

        if self.path.exists():
            size = self.path.stat().st_size
            if size != file_size:
                raise ForeignFile(self.path, f"size {size} != expected {file_size}")
            self._fd = os.open(self.path, os.O_RDWR)
        else:
            self._fd = _create_preallocated(self.path, file_size)
        try:
            self._mm = mmap.mmap(
                self._fd, file_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
            )
        except BaseException:
            os.close(self._fd)
            raise

    # --- raw access for the commitlog's append path (single writer, under its lock)
    @property
    def mapping(self) -> mmap.mmap:
        return self._mm

    # --- writing
    def append(self, data: bytes | bytearray | memoryview) -> int:
        """Copy `data` at `wrote_position`; returns the position written at.

        The caller checks `remaining()` first; writing past the end raises ValueError.
        """
        pos = self.wrote_position
        end = pos + len(data)
        if end > self.file_size:
            raise ValueError(f"{self.path}: append of {len(data)} bytes past the end")
        self._mm[pos:end] = data
        self.wrote_position = end
        self.committed_position = end
        return pos

    def pwrite(self, position: int, data: bytes | bytearray | memoryview) -> None:
        """Copy `data` in at `position` through the descriptor (`os.pwrite`), not the
        mapping: the same page cache, so readers of the mapping see it as they would a
        copy into the mapping. What differs is the write-back. A write through the mapping
        dirties the whole page-cache folio it lands in (the kernel cannot tell which bytes
        a store touched), and folios of a file written sequentially grow large: past the
        first tens of MB of a file, an fdatasync after a 1 KiB copy into the mapping wrote
        a whole large folio back, 0.45 ms where `pwrite` + fdatasync took 0.08 ms (the
        kernel marks only the blocks written dirty). The commitlog writes this way under
        SYNC_FLUSH, where every put waits for its fdatasync."""
        view = memoryview(data)
        self._check_inside(position, len(view))
        while view:
            n = os.pwrite(self._fd, view, position)
            view = view[n:]
            position += n

    def write_at(self, position: int, data: bytes | bytearray | memoryview) -> None:
        """Overwrite bytes at `position` (does not move `wrote_position`)."""
        self._check_inside(position, len(data))
        self._mm[position : position + len(data)] = data

    def _check_inside(self, position: int, n: int) -> None:
        if position < 0 or position + n > self.file_size:
            raise ValueError(f"{self.path}: write of {n} bytes at {position} outside the file")

    # --- reading
    def read(self, position: int, size: int) -> bytes:
        """Bytes [position, position+size); short when past the end of the file."""
        return self._mm[position : position + size]

    def buffer(self) -> memoryview:
        """The whole mapping; the caller holds the file and releases the view first."""
        return memoryview(self._mm)

    # --- positions
    def remaining(self) -> int:
        return self.file_size - self.wrote_position

    def is_full(self) -> bool:
        return self.wrote_position >= self.file_size

    @property
    def last_modified_ms(self) -> int:
        try:
            return self.path.stat().st_mtime_ns // 1_000_000
        except FileNotFoundError:
            return 0

    def flush(self, least_pages: int = 0) -> int:
        """fdatasync up to `wrote_position` when at least `least_pages` pages are dirty."""
        with self._flush_lock:
            target = self.wrote_position
            dirty = target - self.flushed_position
            if dirty <= 0:
                return self.flushed_position
            if (
                least_pages > 0
                and dirty // OS_PAGE_SIZE < least_pages
                and not (target >= self.file_size)
            ):
                return self.flushed_position
            if self.hold():
                try:
                    self.fsync(self._fd)
                finally:
                    self.release()
                self.flushed_position = target
            return self.flushed_position

    def sync(self) -> None:
        """fdatasync whatever is in the page cache, regardless of positions."""
        if self.hold():
            try:
                self.fsync(self._fd)
            finally:
                self.release()

    def warm(self, flush: bool = False, limit: int | None = None) -> None:
        """Pre-touch the pages of a file nobody writes yet, so appends never fault.

        Writes zeros (the file's content already) a chunk at a time up to `limit` (the
        whole file by default); with `flush` the zeros are also written back, turning the
        pre-allocated extents into written ones so a later fdatasync only carries data.
        For a file already in use, see `populate()`.
        """
        if not self.hold():
            self.warming = False
            return
        self.warming = True
        stop = self.file_size if limit is None else min(_round_up(limit), self.file_size)
        try:
            pos = _round_up(max(self.wrote_position, self.warmed_to))  # never a page of data
            while pos < stop and self._available:
                end = min(pos + _WARM_CHUNK, stop)
                self._mm[pos:end] = _ZEROS[: end - pos]
                pos = end
            if flush and self._available:
                os.fdatasync(self._fd)
            self.warmed_to = max(self.warmed_to, stop)
            self.warmed = stop >= self.file_size
        except ValueError:  # closed under us (store shutdown): nothing to warm any more
            pass
        finally:
            self.warming = False
            self.release()

    def populate(self, limit: int | None = None, flush: bool = False) -> None:
        """Fault in, writable, the pages past `wrote_position` of a file in use, up to
        `limit` (the whole file by default).

        `MADV_POPULATE_WRITE` maps the pages without changing a byte, so it runs beside
        the writer without its lock; it is called through libc with the GIL released
        (1 MiB a call), so the writer and the event loop keep running meanwhile. With
        `flush` the populated (dirty, zero) pages are written back through a descriptor of
        its own, so the group commit's fdatasyncs carry only data and a write-back error
        it meets stays reported on the writer's descriptor. A kernel without the advice
        (before 5.14) leaves the file as is.
        """
        if not self.hold():
            self.warming = False
            return
        self.warming = True
        stop = self.file_size if limit is None else min(_round_up(limit), self.file_size)
        try:
            pos = _round_up(max(self.wrote_position, self.warmed_to))
            if pos >= stop:
                return
            if _madvise is not None:
                base = ctypes.addressof(ctypes.c_char.from_buffer(self._mm))
                while pos < stop and self._available:
                    end = min(pos + _WARM_CHUNK, stop)
                    if _madvise(base + pos, end - pos, MADV_POPULATE_WRITE) != 0:
                        raise OSError(ctypes.get_errno(), "madvise(MADV_POPULATE_WRITE)")
                    pos = end
            else:  # pragma: no cover - no libc through ctypes
                while pos < stop and self._available:
                    end = min(pos + _WARM_CHUNK_IN_PLACE, stop)
                    self._mm.madvise(MADV_POPULATE_WRITE, pos, end - pos)
                    pos = end
                    time.sleep(0)
            if flush and self._available:
                fd = os.open(self.path, os.O_RDWR)
                try:
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
            self.warmed_to = max(self.warmed_to, stop)
            self.warmed = stop >= self.file_size
        except (OSError, ValueError, BufferError):  # unsupported, or closed under us
            pass
        finally:
            self.warming = False
            self.release()

    # --- reference counting (hold/release: ReferenceResource)
    @property
    def available(self) -> bool:
        return self._available

    def shutdown(self, interval_forcibly_ms: int) -> None:
        """Stop new holders; drop the owner's reference; force after the interval."""
        with self._ref_lock:
            if self._available:
                self._available = False
                self._first_shutdown_ms = self._clock()
                self._refs -= 1
                if self._refs <= 0:
                    self._free()
                return
            if self._refs > 0 and self._clock() - self._first_shutdown_ms >= interval_forcibly_ms:
                self._refs = 0
                self._free()

    def _free(self) -> None:
        if self._cleaned:
            return
        # a view still exported keeps the mapping alive until it is released
        with contextlib.suppress(BufferError):
            self._mm.close()
        os.close(self._fd)
        self._cleaned = True

    @property
    def cleaned(self) -> bool:
        return self._cleaned

    def destroy(self, interval_forcibly_ms: int) -> bool:
        """Unmap and delete the file once nobody holds it; True when it is gone."""
        self.shutdown(interval_forcibly_ms)
        if not self._cleaned:
            return False
        self.path.unlink(missing_ok=True)
        return True

    def close(self) -> None:
        """Unmap and close without deleting (store shutdown)."""
        self.shutdown(0)
        if not self._cleaned:
            with self._ref_lock:
                self._refs = 0
                self._free()

    def __repr__(self) -> str:
        return (
            f"MappedFile({self.path.name}, wrote={self.wrote_position}, "
            f"flushed={self.flushed_position})"
        )
