"""A process queue: the messages pulled from one queue and not yet finished.

The offset a consumer may commit is the smallest offset still in flight (or, with nothing in
flight, one past the largest offset seen), so a slow message holds the commit back: after a
crash its successors may be delivered again (duplicates), but nothing is skipped (no loss).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterable

from reliable.message import ReceivedMessage


class ProcessQueue:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.RLock()
        self._offsets: list[int] = []  # sorted offsets of cached messages
        self._msgs: dict[int, ReceivedMessage] = {}
        self._max_offset = -1
        self._consuming: dict[int, ReceivedMessage] = {}  # orderly: taken, not yet committed
        self.dropped = False
        self.last_pull = clock()
        self.last_consume = clock()
        self.consuming = False  # orderly: a consume task is queued or running
        self.consume_lock = threading.Lock()  # orderly: one thread per queue

    # --- both modes
    def put(self, messages: Iterable[ReceivedMessage]) -> int:
        """Cache pulled messages; return how many were new."""
        added = 0
        with self._lock:
            for m in messages:
                off = m.queue_offset
                if off in self._msgs or off in self._consuming:
                    continue
                bisect.insort(self._offsets, off)
                self._msgs[off] = m
                self._max_offset = max(self._max_offset, off)
                added += 1
        return added

    @property
    def cached_count(self) -> int:
        with self._lock:
            return len(self._msgs) + len(self._consuming)

    @property
    def max_offset(self) -> int:
        with self._lock:
            return self._max_offset

    def commit_offset(self) -> int:
        """The offset safe to commit now (-1: nothing seen yet)."""
        with self._lock:
            return self._commit_offset_locked()

    def _commit_offset_locked(self) -> int:
        heads = self._offsets[:1] + ([min(self._consuming)] if self._consuming else [])
        if heads:
            return min(heads)
        return self._max_offset + 1 if self._max_offset >= 0 else -1

    # --- concurrent mode
    def remove(self, messages: Iterable[ReceivedMessage]) -> int:
        """Finish messages; return the offset safe to commit."""
        with self._lock:
            for m in messages:
                off = m.queue_offset
                if self._msgs.pop(off, None) is not None:
                    i = bisect.bisect_left(self._offsets, off)
                    if i < len(self._offsets) and self._offsets[i] == off:
                        del self._offsets[i]
            self.last_consume = self._clock()
            return self._commit_offset_locked()

    # --- orderly mode
    def take(self, n: int) -> list[ReceivedMessage]:
        """The next `n` messages in offset order, moved to the consuming set."""
        with self._lock:
            taken: list[ReceivedMessage] = []
            while self._offsets and len(taken) < n:
                off = self._offsets.pop(0)
                m = self._msgs.pop(off)
                self._consuming[off] = m
                taken.append(m)
            return taken

    def commit_taken(self) -> int:
        """The taken messages are done; return the offset safe to commit."""
        with self._lock:
            self._consuming.clear()
            self.last_consume = self._clock()
            return self._commit_offset_locked()

    def put_back(self, messages: Iterable[ReceivedMessage]) -> None:
        """Taken messages must be consumed again (orderly retry): back in front."""
        with self._lock:
            for m in messages:
                off = m.queue_offset
                self._consuming.pop(off, None)
                if off not in self._msgs:
                    bisect.insort(self._offsets, off)
                    self._msgs[off] = m

    def discard_taken(self, messages: Iterable[ReceivedMessage]) -> None:
        """Some taken messages are finished (parked or dropped) without the rest."""
        with self._lock:
            for m in messages:
                self._consuming.pop(m.queue_offset, None)
            self.last_consume = self._clock()

    def has_pending(self) -> bool:
        with self._lock:
            return bool(self._offsets)

    def clear(self) -> None:
        with self._lock:
            self._offsets.clear()
            self._msgs.clear()
            self._consuming.clear()
