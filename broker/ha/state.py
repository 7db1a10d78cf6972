"""What replication keeps on disk, in `<store>/ha/`: the epoch history and the highest
offset a slave acknowledged.

**Epochs** (`epochs.json`): `[[epoch, start offset], ...]`, oldest first. A store's log
belongs to epoch 1 from offset 0 until a promotion: the promoted slave appends
`[epoch + 1, its log end]` before it takes a write. A slave takes its master's history
with the configuration (config sync), so every broker of a group agrees on it; two logs
are equal up to the point where their histories part (`branch_point`), which is where a
rejoining old master cuts its own (docs/ha.md, "Rejoining").

**Acknowledged offset** (`acked`): the furthest offset a slave acknowledged to this
broker while it was a master, written as the acknowledgements arrive and before a
SYNC_MASTER send waiting for one is answered (16 bytes: offset, CRC32; fsynced every
second and at shutdown). Bytes below it were confirmed as replicated: a rejoin that would
cut them is refused.

**Role** (`role.json`): the role this store was last run with (`{"role", "broker_name",
"broker_id", "master"}`), written as a broker with a replication role starts and at a
promotion, so a stopped store still says what it was (`reliable admin broker status
--store`).
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
import zlib
from pathlib import Path

from broker.ha.errors import RejoinRefused
from broker.store.durable_write import write_atomically

HA_DIR = "ha"
EPOCHS_FILE = "epochs.json"
ACKED_FILE = "acked"
ROLE_FILE = "role.json"
_ACKED = struct.Struct(">qI")

Epoch = tuple[int, int]  # (epoch, start offset)


def ha_dir(store_dir: Path) -> Path:
    return Path(store_dir) / HA_DIR


class EpochHistory:
    """The epochs of one store's log (see the module docstring)."""

    def __init__(self, store_dir: Path) -> None:
        self.path = ha_dir(store_dir) / EPOCHS_FILE
        self._lock = threading.Lock()
        self._entries: list[Epoch] = [(1, 0)]
        if self.path.exists():
            self._entries = parse_epochs(json.loads(self.path.read_text()))

    @property
    def entries(self) -> list[Epoch]:
        with self._lock:
            return list(self._entries)

    @property
    def last(self) -> Epoch:
        with self._lock:
            return self._entries[-1]

    def replace(self, entries: list[Epoch]) -> bool:
        """Take a master's history (a slave, at config sync); True when it changed."""
        entries = parse_epochs(entries)
        with self._lock:
            if entries == self._entries:
                return False
            self._entries = entries
            self._save()
        return True

    def begin(self, start: int, epoch: int | None = None) -> Epoch:
        """A promotion: a new epoch from `start` (this log's end), durable on return.
        `epoch`: its number, when a coordinator decided it (after the last one's);
        None: the next."""
        with self._lock:
            last, first = self._entries[-1]
            if start < first:
                raise ValueError(f"epoch start {start} before the last one's ({first})")
            if epoch is not None and epoch <= last:
                raise ValueError(f"epoch {epoch} does not follow the last one ({last})")
            entry = (epoch if epoch is not None else last + 1, start)
            self._entries.append(entry)
            self._save()
        return entry

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, json.dumps([list(e) for e in self._entries]).encode())


def parse_epochs(value: object) -> list[Epoch]:
    """A history from JSON (`[[epoch, start], ...]`); ValueError when it is not one."""
    if not isinstance(value, list) or not value:
        raise ValueError("an epoch history is a non-empty list")
    out: list[Epoch] = []
    for item in value:
        if (
            not isinstance(item, list | tuple)
            or len(item) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in item)
        ):
            raise ValueError(f"epoch entry {item!r:.40} is not [epoch, start]")
        epoch, start = int(item[0]), int(item[1])
        if out and (epoch <= out[-1][0] or start < out[-1][1]):
            raise ValueError(f"epoch entry {item!r:.40} does not follow {list(out[-1])}")
        out.append((epoch, start))
    return out


def epoch_end(history: list[Epoch], epoch: Epoch, log_end: int) -> int | None:
    """Where `epoch` ends in a log with this history and end: the next epoch's start, or
    the log's end for the last one; None when the history has no such epoch."""
    for i, entry in enumerate(history):
        if entry == epoch:
            return history[i + 1][1] if i + 1 < len(history) else log_end
    return None


def branch_point(mine: list[Epoch], my_end: int, theirs: list[Epoch], their_end: int) -> int:
    """The offset up to which two logs with these histories and ends hold the same
    records: the end of the last epoch they share (the shorter of the two). RejoinRefused
    when they share none."""
    common = -1
    for i, (a, b) in enumerate(zip(mine, theirs, strict=False)):
        if a != b:
            break
        common = i
    if common < 0:
        raise RejoinRefused(
            f"this store's epochs {mine} and the master's {theirs} share no epoch: "
            "start the slave from an empty store"
        )
    own = mine[common + 1][1] if common + 1 < len(mine) else my_end
    other = theirs[common + 1][1] if common + 1 < len(theirs) else their_end
    return min(own, other, my_end)


def shared_epochs(mine: list[Epoch], theirs: list[Epoch]) -> list[Epoch]:
    """The epochs both histories begin with (a rejoined slave keeps only these: the
    master's config sync brings the rest)."""
    shared: list[Epoch] = []
    for a, b in zip(mine, theirs, strict=False):
        if a != b:
            break
        shared.append(a)
    return shared


class AckedCheckpoint:
    """The highest offset a slave acknowledged to this broker as a master (see above)."""

    SYNC_EVERY_S = 1.0

    def __init__(self, store_dir: Path) -> None:
        self.path = ha_dir(store_dir) / ACKED_FILE
        self._fd: int | None = None
        self._lock = threading.Lock()
        self.offset = read_acked(store_dir)
        self._synced_at = time.monotonic()
        self._dirty = False

    def advance(self, offset: int) -> None:
        """Record that a slave has the log up to `offset` (no-op when not further)."""
        with self._lock:
            if offset <= self.offset:
                return
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            raw = offset.to_bytes(8, "big", signed=True)
            os.pwrite(self._fd, _ACKED.pack(offset, zlib.crc32(raw)), 0)
            self.offset = offset
            self._dirty = True
            now = time.monotonic()
            if now - self._synced_at >= self.SYNC_EVERY_S:
                os.fdatasync(self._fd)
                self._synced_at = now
                self._dirty = False

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                if self._dirty:
                    os.fdatasync(self._fd)
                os.close(self._fd)
                self._fd = None


def read_acked(store_dir: Path) -> int:
    """The acknowledged offset kept in a store (-1: none); RejoinRefused when the file is
    damaged (what was acknowledged is then unknown)."""
    path = ha_dir(store_dir) / ACKED_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return -1
    if len(data) < _ACKED.size:
        raise RejoinRefused(f"{path}: {len(data)} bytes, expected {_ACKED.size}")
    offset, crc = _ACKED.unpack_from(data)
    if zlib.crc32(offset.to_bytes(8, "big", signed=True)) != crc:
        raise RejoinRefused(f"{path}: checksum mismatch; what slaves acknowledged is unknown")
    return int(offset)


def save_role(
    store_dir: Path, role: str, broker_name: str, broker_id: int, master: str | None
) -> None:
    """Record the role this store runs with (see the module docstring)."""
    path = ha_dir(store_dir) / ROLE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"role": role, "broker_name": broker_name, "broker_id": broker_id, "master": master}
    write_atomically(path, json.dumps(body).encode())


def stored_status(store_dir: Path, max_offset: int) -> dict[str, object]:
    """`HaStatus` of a stopped store: the role it last ran with (`none` when it never
    ran with one), its log end, epochs and acknowledged offset."""
    out: dict[str, object] = {"role": "none", "running": False, "max_offset": max_offset}
    try:
        saved = json.loads((ha_dir(store_dir) / ROLE_FILE).read_text())
    except (OSError, ValueError):
        saved = None
    if isinstance(saved, dict) and isinstance(saved.get("role"), str):
        out.update({k: saved.get(k) for k in ("role", "broker_name", "broker_id", "master")})
    if (ha_dir(store_dir) / EPOCHS_FILE).exists():
        out["epochs"] = [list(e) for e in EpochHistory(store_dir).entries]
    try:
        acked = read_acked(store_dir)
    except RejoinRefused:
        acked = None
    out["acked_checkpoint"] = acked if acked is None or acked >= 0 else None
    return out
