"""The consume threads of a push consumer over pulled queues.

A `ThreadPoolExecutor` builds a Future (a Condition, an RLock) per call and takes two locks
(its own and the interpreter-wide shutdown lock, shared by every puller) per `submit`; a
consumer with the default batch size of one submits once per message, and nobody reads
those futures. `Workers` hands each call to its threads through one `SimpleQueue` (a C
queue: a put wakes one waiting thread) and keeps nothing per call.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from queue import Empty, SimpleQueue
from typing import Any

log = logging.getLogger(__name__)

_STOP = None


class Workers:
    """`submit(fn, *args)` runs `fn(*args)` on one of at most `max_workers` threads (started
    as calls come, up to the maximum); an exception is logged, the thread goes on.
    `shutdown` as `ThreadPoolExecutor.shutdown`: calls already running finish; with
    `cancel_futures` those not yet started are dropped."""

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be >= 1")
        self._max = max_workers
        self._prefix = thread_name_prefix
        self._calls: SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._shutdown = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._shutdown:
            raise RuntimeError("cannot schedule new calls after shutdown")
        self._calls.put((fn, args))
        if len(self._threads) < self._max:
            self._start_thread()

    def _start_thread(self) -> None:
        with self._lock:
            if self._shutdown or len(self._threads) >= self._max:
                return
            t = threading.Thread(
                target=self._work, name=f"{self._prefix}_{len(self._threads)}", daemon=True
            )
            self._threads.append(t)
        t.start()

    def _work(self) -> None:
        calls = self._calls
        while True:
            call = calls.get()
            if call is _STOP:
                return
            fn, args = call
            try:
                fn(*args)
            except BaseException:  # a consume call handles its own failures; never stop
                log.exception("consume call %r failed", fn)
            del call, fn, args  # no reference to the last message while idle

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
        if cancel_futures:
            try:
                while True:
                    self._calls.get_nowait()
            except Empty:
                pass
        for _ in threads:
            self._calls.put(_STOP)  # after the calls still queued (none when cancelled)
        if wait:
            for t in threads:
                if t is not threading.current_thread():
                    t.join()
