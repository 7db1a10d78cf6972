"""The store directory lock: one process at a time writes a store.

Lock file (`<store>/lock`): an exclusive `flock` held while the store is open, so two
processes never write one store. The kernel drops it when the holder dies (kill -9 too).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from broker.store.errors import StoreLocked


class StoreLock:
    """An exclusive advisory lock on `<store>/lock` for the life of the store."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock; `StoreLocked` when another process holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLocked(self.path.parent) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
