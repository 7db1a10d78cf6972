"""What the send pipeline and the ack batcher share: one thread that sends batches which
leave when full, when nothing is in flight, or once their oldest item waited the linger.

A subclass fills its own queues under `_cond`, bumps `_pending` per accepted item (and
lowers it when the item completes), notifies `_cond` when a batch may be ready and the
thread is `_waiting`, and supplies

    _collect(now) -> (batches, seconds to wait or None)   # under _cond
    _emit(batch)                                          # outside the lock

`close()` lets everything accepted leave and complete, then stops the thread.
"""

from __future__ import annotations

import threading
import time
from typing import Any


class LingeringSender:
    def __init__(
        self, *, linger_ms: float, batch_size: int, max_in_flight: int, thread_name: str
    ) -> None:
        self._linger_s = linger_ms / 1000
        self._batch_size = batch_size
        self._max_in_flight = max_in_flight
        # `_lock` is `_cond`'s own lock: holding it is holding the condition (notify may
        # be called under it); `with self._lock` skips Condition.__enter__/__exit__, two
        # Python calls per message on the send path
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._in_flight = 0
        self._pending = 0  # items accepted and not yet completed
        self._waiting = False  # the thread sleeps on the condition
        self._closing = False
        self.requests = 0  # requests sent (observability, tests)
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    def _start_thread(self) -> None:
        self._thread.start()

    def close(self, timeout_s: float = 30.0) -> None:
        """Send what waits, let requests in flight complete, stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    batches, wait_s = self._collect(time.monotonic())
                    if batches:
                        break
                    if self._closing and self._pending == 0:
                        return
                    self._waiting = True
                    self._cond.wait(wait_s)
                    self._waiting = False
            for batch in batches:
                self._emit(batch)

    def _collect(self, now: float) -> tuple[list[Any], float | None]:
        raise NotImplementedError

    def _emit(self, batch: Any) -> None:
        raise NotImplementedError
