"""The consume threads of a push consumer (either engine: pulled queues or receives).

A `ThreadPoolExecutor` builds a Future (a Condition, an RLock) per call and takes two locks
(its own and the interpreter-wide shutdown lock, shared by every puller) per `submit`; a
consumer with the default batch size of one submits once per message, and nobody reads
those futures. `Workers` keeps nothing per call but the call in one queue.

It also runs no more threads than help. In one process only one thread runs Python at a
time: threads help a listener that waits (a database write, another service), and cost
one that only computes, each switch between runnable threads a context switch. With 20
threads taking calls from one `queue.SimpleQueue` and a listener that returned at once,
the consumer made about one context switch a message and spent a fifth of its CPU in the
kernel; with one thread, a twentieth of that, and it consumed 20-40% more a second.

So the pool keeps a limit on its running threads and moves it by what its calls do: one
call in eight is timed on the wall clock and on its thread's CPU clock, and a call that
waited (longer than it computed, and 50 us at least) is one more threads could have
overlapped. Every 10 ms, when under a tenth of the timed calls waited the limit halves;
when over half did, or no call ended at all while calls wait, it doubles, up to
`max_workers`. It starts at `max_workers`, so a listener that waits is never short of
threads while the pool learns. A thread over the limit parks after its call; while calls
wait, the last thread to park wakes every 10 ms to measure, so a listener that starts to
wait after a run of fast calls gets its threads back without a new message.

A call wakes a parked thread only when no woken thread is still on its way to the queue
and fewer threads run than the limit; a thread that takes a call and sees more waiting
wakes the next, one at a time. The queue itself takes no lock (`deque` operations are
atomic in the interpreter); a lock guards only the moves between running and parked, so
a call put while a thread parks is never left behind.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

WINDOW_S = 0.01  # how often the running threads' useful number is measured
SAMPLE_EVERY = 8  # one call in this many is timed (two CPU clock reads, ~1.5 us)
WAIT_S = 50e-6  # a call that waited at least this long, and longer than it computed...
FEW = 0.1  # ... in under this share of the sampled calls: more threads cannot help
MOST = 0.5  # ... in over this share, with calls waiting: more threads can
_STALE_S = 0.5  # a window longer than this (the pool was idle) measures nothing


class _Thread:
    """A consume thread's parking place: a lock it holds, so that acquiring it again parks
    the thread until another releases it."""

    __slots__ = ("park",)

    def __init__(self) -> None:
        self.park = threading.Lock()
        self.park.acquire()


class Workers:
    """`submit(fn, *args)` runs `fn(*args)` on one of at most `max_workers` threads (started
    as calls come, up to the maximum); an exception is logged, the thread goes on.
    `shutdown` as `ThreadPoolExecutor.shutdown`: calls already running finish, queued calls
    run too unless `cancel_futures` drops them."""

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be >= 1")
        self._max = max_workers
        self._prefix = thread_name_prefix
        self._calls: deque[tuple[Callable[..., object], tuple[object, ...]]] = deque()
        self._lock = threading.Lock()  # the moves between running and parked
        self._parked: list[_Thread] = []  # a stack: the thread that parked last runs next
        self._threads: list[threading.Thread] = []
        self._running = 0  # threads not parked (woken ones included)
        self._waking: _Thread | None = None  # woken or started, not at the queue yet
        self.limit = max_workers  # running threads allowed, moved by what is measured
        self._window_at = time.perf_counter()
        self._sampled = 0  # calls timed in this window (counted without a lock: a gauge)
        self._waited = 0  # ... of which waited more than they computed
        self._ticks = 0
        self._shutdown = False
        self.wakes = 0  # threads woken or started: each one a thread switch

    # --- callers
    def submit(self, fn: Callable[..., object], *args: object) -> None:
        if self._shutdown:
            raise RuntimeError("cannot schedule new calls after shutdown")
        self._calls.append((fn, args))
        if self._waking is None and self._wanted():
            self._wake_one()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                self._calls.clear()
            threads = list(self._threads)
            # parked threads wake, run what is left (nothing when cancelled) and end
            while self._parked:
                self._parked.pop().park.release()
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    # --- threads
    def _wanted(self) -> bool:
        """A thread to wake (under the limit), or a standby to start (at it, none parked)."""
        return self._running < self.limit or (not self._parked and len(self._threads) < self._max)

    def _wake_one(self) -> None:
        """Wake the last parked thread, or start one, when fewer than the limit run and no
        woken thread is on its way to the queue."""
        with self._lock:
            if self._waking is not None or self._shutdown:
                return
            if self._running >= self.limit:
                if not self._parked and len(self._threads) < self._max:
                    # calls wait at the limit and no thread is parked to measure whether
                    # the running ones are waiting in their calls: one that parks at once
                    self._start(standby=True)
                return
            parked = bool(self._parked)
            if parked:
                t = self._parked.pop()
            elif len(self._threads) < self._max:
                t = self._start(standby=False)  # it waits for this lock before it arrives
            else:
                return
            # recorded before the thread can run: one released at once (the release lets it
            # run while this holds the lock, not the interpreter) would otherwise arrive
            # first, not find itself `_waking`, and leave that set for good; every later
            # call would then wait for a thread "on its way" that never comes
            self._waking = t
            self._running += 1
            self.wakes += 1
            if parked:
                t.park.release()

    def _start(self, standby: bool) -> _Thread:
        """(Lock held) Start a thread: to take calls, or (`standby`) to park at once."""
        t = _Thread()
        thread = threading.Thread(
            target=self._work,
            args=(t, standby),
            name=f"{self._prefix}_{len(self._threads)}",
            daemon=True,
        )
        self._threads.append(thread)
        thread.start()  # it waits for this lock before it does anything
        return t

    def _arrived(self, me: _Thread) -> None:
        if self._waking is me:
            with self._lock:
                if self._waking is me:
                    self._waking = None

    def _park(self, me: _Thread, over_limit: bool = False, standby: bool = False) -> None:
        """Park until woken (`over_limit`: only if more threads run than the limit). While
        calls wait, the thread on top of the parked stack wakes every `WINDOW_S` to
        measure, and runs again if the limit rose."""
        calls, parked = self._calls, self._parked
        with self._lock:
            if self._shutdown or (over_limit and self._running <= self.limit):
                return
            if not standby:  # a standby thread was never counted as running
                self._running -= 1
            parked.append(me)
        while True:
            if calls:  # put while this one parked, or waiting over the limit
                self._wake_one()  # (this one, when it parked last and the limit allows)
            timed = bool(calls) and self._running > 0 and parked and parked[-1] is me
            if me.park.acquire(timeout=WINDOW_S if timed else -1):
                return  # woken: counted as running again by whoever woke it
            with self._lock:
                woken = me not in parked
            if woken:  # between the timeout and the lock: take that wake-up
                me.park.acquire()
                return
            self._measure(time.perf_counter())

    def _measure(self, now: float) -> None:
        """Move the limit by the last window's sampled calls (one thread at a time)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            wall = now - self._window_at
            if wall < WINDOW_S:
                return
            sampled, waited = self._sampled, self._waited
            self._window_at, self._sampled, self._waited = now, 0, 0
            if wall > _STALE_S and self._running == 0:
                return  # the pool was idle: nothing measured
            if sampled and waited < FEW * sampled:
                self.limit = max(1, self.limit // 2)
            elif self._calls and (not sampled or waited > MOST * sampled):
                # calls wait and the running ones wait too (none ended: all in their calls)
                self.limit = min(self._max, self.limit * 2)
        finally:
            self._lock.release()

    def _work(self, me: _Thread, standby: bool) -> None:
        calls = self._calls
        with self._lock:  # started under it: wait until the starter is done
            pass
        if standby:
            self._park(me, standby=True)
        self._arrived(me)
        while True:
            try:
                fn, args = calls.popleft()
            except IndexError:
                if self._shutdown:
                    return
                self._park(me)
                self._arrived(me)
                continue
            if calls and self._waking is None and self._wanted():
                self._wake_one()  # more waiting and nobody on the way: the next thread
            self._ticks += 1
            timed = not self._ticks % SAMPLE_EVERY
            if timed:
                started, cpu = time.perf_counter(), time.thread_time()
            try:
                fn(*args)
            except BaseException:  # a consume call handles its own failures; never stop
                log.exception("consume call %r failed", fn)
            del fn, args  # no reference to the last message while idle
            if timed:
                now = time.perf_counter()
                waited = (now - started) - (time.thread_time() - cpu)
                self._sampled += 1
                if waited > WAIT_S and waited > now - started - waited:
                    self._waited += 1
                if now - self._window_at >= WINDOW_S:
                    self._measure(now)
            if self._running > self.limit:
                self._park(me, over_limit=True)
                self._arrived(me)
