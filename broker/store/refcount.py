"""Reference counting for mapped store files (RocketMQ's `ReferenceResource`).

Readers `hold()` a file while they use its mapping and `release()` it afterwards; the owner
keeps one reference from the start and drops it when it shuts the file down. Once the file is
no longer available, the last release frees it (`_free`, the subclass's unmap-and-close).
"""

from __future__ import annotations

import threading


class ReferenceResource:
    """Mixin: `hold`/`release` over `_refs`, `_available` and `_ref_lock`."""

    _refs: int
    _available: bool
    _ref_lock: threading.Lock

    def _init_references(self) -> None:
        self._refs = 1  # the owner's own reference, dropped when it shuts the file down
        self._available = True
        self._ref_lock = threading.Lock()

    def hold(self) -> bool:
        """Take a reference; False when the file is shutting down (do not touch it)."""
        with self._ref_lock:
            if not self._available:
                return False
            self._refs += 1
            return True

    def release(self) -> None:
        """Drop a reference taken by `hold`; the last one of a shut-down file frees it."""
        with self._ref_lock:
            self._refs -= 1
            if self._refs <= 0 and not self._available:
                self._free()

    def _free(self) -> None:
        """Unmap and close (at most once); called under `_ref_lock`."""
        raise NotImplementedError
