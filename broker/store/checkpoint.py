"""The checkpoint file and the abort file: what decides how the store recovers.

Checkpoint (`<store>/checkpoint`), 4096 bytes, big-endian; the first 24 bytes are
RocketMQ's layout:

    offset size  field
     0     8     physic_msg_timestamp   store time of a commitlog record known flushed
     8     8     logics_msg_timestamp   store time of a record whose consume-queue unit is flushed
    16     8     index_msg_timestamp    store time of a record whose index entry is flushed
    24     8     physic_flushed_offset  commitlog offset known flushed (everything below it)
    32     4     MAGIC                  b"RCKP"
    36     4     VERSION                1
    40     4     CRC                    zlib.crc32 of bytes [0, 40)
    44  4052     zeros

It is replaced atomically (temp file, fdatasync, rename, fsync of the directory), so a crash
leaves either the old or the new checkpoint, never a mix. Timestamps are lower bounds:
each is read before the flush it describes.

Abort file (`<store>/abort`): empty; created (and its directory entry fsynced) when the
store starts, removed when it shuts down cleanly. Present at start => the last run did not
shut down => abnormal recovery.
The store directory's lock file is `store_lock.py`'s.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from broker.store.durable_write import fsync_directory
from broker.store.errors import ForeignFile

CHECKPOINT_FILE_SIZE = 4096
CHECKPOINT_MAGIC = b"RCKP"
CHECKPOINT_VERSION = 1
_BODY = struct.Struct(">qqqq4si")  # the 40 bytes the CRC covers
_CRC = struct.Struct(">I")
assert _BODY.size == 40


@dataclass(slots=True)
class StoreCheckpoint:
    """In-memory values of the checkpoint; `flush()` writes them out atomically."""

    path: Path
    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    physic_flushed_offset: int = 0
    loaded: bool = False  # a valid checkpoint was read at open

    @classmethod
    def open(cls, path: Path) -> StoreCheckpoint:
        """Read the checkpoint; a missing or torn one gives zeros with `loaded=False`.

        ForeignFile when the file is not a checkpoint at all (wrong size or magic).
        """
        cp = cls(Path(path))
        try:
            raw = cp.path.read_bytes()
        except FileNotFoundError:
            return cp
        if len(raw) != CHECKPOINT_FILE_SIZE:
            raise ForeignFile(
                path, f"checkpoint of {len(raw)} bytes, expected {CHECKPOINT_FILE_SIZE}"
            )
        physic, logics, index, flushed, magic, version = _BODY.unpack_from(raw, 0)
        if magic != CHECKPOINT_MAGIC:
            raise ForeignFile(path, "no checkpoint magic")
        (crc,) = _CRC.unpack_from(raw, _BODY.size)
        if crc != zlib.crc32(raw[: _BODY.size]) or version != CHECKPOINT_VERSION:
            return cp  # torn or from a future version: trust nothing in it
        cp.physic_msg_timestamp = physic
        cp.logics_msg_timestamp = logics
        cp.index_msg_timestamp = index
        cp.physic_flushed_offset = flushed
        cp.loaded = True
        return cp

    def encode(self) -> bytes:
        body = _BODY.pack(
            self.physic_msg_timestamp,
            self.logics_msg_timestamp,
            self.index_msg_timestamp,
            self.physic_flushed_offset,
            CHECKPOINT_MAGIC,
            CHECKPOINT_VERSION,
        )
        raw = body + _CRC.pack(zlib.crc32(body))
        return raw + bytes(CHECKPOINT_FILE_SIZE - len(raw))

    def flush(self) -> None:
        """Replace the file atomically: temp, fdatasync, rename, fsync directory."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, self.encode())
            os.fdatasync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        fsync_directory(self.path.parent)

    def min_timestamp(self, index_safe: bool = False) -> int:
        """Store time below which commitlog, consume queues (and index) are all on disk."""
        low = min(self.physic_msg_timestamp, self.logics_msg_timestamp)
        if index_safe:
            low = min(low, self.index_msg_timestamp)
        return low


def abort_file_exists(path: Path) -> bool:
    return path.exists()


def create_abort_file(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    os.close(fd)
    fsync_directory(path.parent)


def remove_abort_file(path: Path) -> None:
    path.unlink(missing_ok=True)
    fsync_directory(path.parent)
