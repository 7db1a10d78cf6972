"""The guard's Redis done marks, written off the handler's thread.

After a confirmation commits, its Redis lease becomes the done mark (`leases.py`). The
confirmation row already decides: a copy that arrives before its mark is written finds
the lease still held, asks the database, and is told it is a duplicate. So the handler's
thread does not wait for the mark. One daemon thread per guard writes the waiting marks
together, in one pipeline, instead of one Lua round trip from each handler. A mark lost
(the process stopped first, Redis unreachable, the queue full) leaves the lease to expire
by itself; the database still answers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from idempotency.leases import Leases

log = logging.getLogger(__name__)


class DoneMarks:
    """Marks of confirmed messages waiting for the one thread that writes them."""

    def __init__(
        self,
        leases: Leases,
        redis_errors: tuple[type[BaseException], ...],
        *,
        capacity: int = 10_000,
        batch: int = 256,
        linger: float = 0.005,
    ) -> None:
        self.leases = leases
        self.capacity = capacity
        self.batch = batch
        self.linger = linger
        self.dropped = 0  # marks not written: the queue was full, or Redis failed
        self._redis_errors = redis_errors
        self._waiting: deque[tuple[str, str, bool]] = deque()
        self._writing = 0
        lock = threading.Lock()
        self._work = threading.Condition(lock)  # the writer waits for marks
        self._idle = threading.Condition(lock)  # `flush` waits for the writer
        self._thread: threading.Thread | None = None

    def add(self, key: str, token: str, held: bool) -> None:
        """Mark `key` done for `token`: swapped from the lease `token` holds (`held`), or
        set if absent (False: Redis was down when the message started)."""
        with self._work:
            if len(self._waiting) >= self.capacity:
                self.dropped += 1
                return
            self._waiting.append((key, token, held))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, daemon=True, name="idempotency-done-marks"
                )
                self._thread.start()
            elif len(self._waiting) == 1:
                self._work.notify()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every mark added so far is written (or dropped): True, or False once
        `timeout` seconds passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._waiting or self._writing:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _run(self) -> None:
        while True:
            with self._work:
                while not self._waiting:
                    self._work.wait()
                # the first mark waits `linger` for others: one pipeline for many, instead
                # of a wake-up and a round trip for each
                self._work.wait(self.linger)
                marks = [
                    self._waiting.popleft() for _ in range(min(self.batch, len(self._waiting)))
                ]
                self._writing = len(marks)
            try:
                self.leases.mark_done_many(marks)
            except Exception as exc:  # the leases expire by themselves
                expected = isinstance(exc, self._redis_errors)  # else: its traceback
                log.warning(
                    "could not mark %d messages done in Redis: %s",
                    len(marks),
                    exc,
                    exc_info=not expected,
                )
                with self._work:
                    self.dropped += len(marks)
            finally:
                with self._idle:
                    self._writing = 0
                    if not self._waiting:
                        self._idle.notify_all()
