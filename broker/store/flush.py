"""Flushing the commitlog to disk: ASYNC_FLUSH and SYNC_FLUSH with group commit.

ASYNC_FLUSH (`FlushCommitLogService`): a put is acknowledged once its bytes are in the page
cache. A background loop flushes every `flush_interval_commitlog_ms` when at least
`flush_least_pages_commitlog` pages are dirty, and thoroughly (any dirty byte) every
`flush_thorough_interval_commitlog_ms`. A crash of the process loses nothing (the page cache
survives it); a power cut loses at most the last interval.

SYNC_FLUSH (`GroupCommitService`): a put is acknowledged only once its bytes are on disk.
Producers append concurrently and then wait on one condition for `flushed_where` to pass
the end of their record; one flusher thread runs fsync rounds, each flushing everything
written so far (not only what was requested), so one fdatasync acknowledges every
producer whose record was written before the round started. A waiter gives up after
`sync_flush_timeout_ms` with FLUSH_DISK_TIMEOUT (the record stays stored; the round still
completes). The flusher, not the waiters, calls fsync, so a slow disk never holds a
waiting producer longer than its timeout.

A lone producer may lead instead (`lead`): when no round is in flight, no one else waits,
the last round acknowledged at most one producer and the last fsync was fast (under
`LEAD_MAX_S`), it runs the round on its own thread and is answered as soon as the fsync
returns, without the two thread hops (to the flusher and back) that otherwise cost more
than the fsync itself (the event loop's one-at-a-time send over the native wire: see
docs/performance.md). One round runs at a time: producers arriving during a leader's
round wait for the flusher's next one, which starts when the leader's ends. A leader has
no timeout: a disk that turns slow holds it for that fsync (once: a slow round stops
leading until a round is fast again). Callers that must never be held, the thread
waiters of `wait_flushed` and the callbacks of `submit`, never lead.

Group size is adaptive. Producers acknowledged by one fsync come back with their next put
a few microseconds apart (each needs the interpreter in turn), so a round that starts at
the first request catches only part of them, and the next fsync the rest: many small
groups. A round therefore waits until as many producers are waiting as the previous round
acknowledged, or at most `group_commit_max_wait_ms` (1 ms, about one fsync), whichever
comes first, as PostgreSQL's commit_delay or MySQL's binlog group commit delay do, but
only while the groups are that large: a lone producer, or fewer producers than last time
(the next round sizes itself on this one), never waits.

The flush primitive is fdatasync on the file descriptor (see `mapped_file`): same page
cache as the mapping, 2-4x cheaper than msync of the whole mapping on our machines.

A failed fsync is not retried: after an fsync error Linux may have dropped the dirty pages
and a second fsync would report success for data that never reached the disk. The service
records the error, every waiter then gets FLUSH_DISK_TIMEOUT, and the store must be
restarted (recovery rescans the commitlog).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from broker.store.config import StoreConfig
from broker.store.mapped_file_queue import MappedFileQueue
from broker.store.service import ServiceThread
from protocol.stats import BATCH_BUCKETS, Histogram

log = logging.getLogger(__name__)

_RETRY_FINAL_FLUSH = 10
LEAD_MAX_S = 0.005  # a caller leads a round only while the last fsync took less than this


class FlushedLog(Protocol):
    """What the flush services need of the commitlog (`commitlog.CommitLog`)."""

    @property
    def queue(self) -> MappedFileQueue: ...

    @property
    def last_store_timestamp(self) -> int: ...

    def get_max_offset(self) -> int: ...

    @property
    def records_put(self) -> int: ...


class FsyncStats:
    """What the flush services measure for metrics: seconds per fsync and records made
    durable per fsync (the group commit's group size), observed once per fsync round."""

    def __init__(self) -> None:
        self.seconds = Histogram()
        self.records = Histogram(BATCH_BUCKETS)
        self._records_before = 0

    def round(self, seconds: float, records_put: int) -> None:
        self.seconds.observe(seconds)
        self.records.observe(records_put - self._records_before)
        self._records_before = records_put


class FlushCommitLogService(ServiceThread):
    """ASYNC_FLUSH: periodic flush with a page threshold and a thorough interval."""

    name = "flush-commitlog"

    def __init__(
        self, commitlog: FlushedLog, config: StoreConfig, clock: Callable[[], int]
    ) -> None:
        super().__init__()
        self._commitlog = commitlog
        self._interval_s = config.flush_interval_commitlog_ms / 1000
        self._least_pages = config.flush_least_pages_commitlog
        self._thorough_ms = config.flush_thorough_interval_commitlog_ms
        self._clock = clock
        self._last_thorough_ms = clock()
        self.fsync_count = 0
        self.flushed_store_timestamp = 0  # store time of a record known to be on disk
        self.failed: OSError | None = None
        self.stats = FsyncStats()

    def do_flush(self, thorough: bool = False) -> None:
        """One round: flush when enough pages are dirty, or everything when thorough/due."""
        now = self._clock()
        least = self._least_pages
        if thorough or now - self._last_thorough_ms >= self._thorough_ms:
            least = 0
            self._last_thorough_ms = now
        cl = self._commitlog
        ts = cl.last_store_timestamp  # read before the offset: the record is below it
        target = cl.get_max_offset()
        q = cl.queue
        records = cl.records_put
        for _ in range(len(q.mapped_files) + 1):
            before = q.flushed_where
            started = time.perf_counter()
            q.flush(least)
            if q.flushed_where == before:
                break
            self.fsync_count += 1
            self.stats.round(time.perf_counter() - started, records)
        if q.flushed_where >= target:
            self.flushed_store_timestamp = ts

    def run(self) -> None:
        while not self.stopped:
            self.wait_for_running(self._interval_s)
            try:
                self.do_flush()
            except OSError as exc:
                self.failed = exc
                log.error("commitlog flush failed: %s", exc)
                return
        for _ in range(_RETRY_FINAL_FLUSH):
            try:
                self.do_flush(thorough=True)
            except OSError as exc:
                self.failed = exc
                log.error("final commitlog flush failed: %s", exc)
                return
            if self._commitlog.queue.flushed_where >= self._commitlog.get_max_offset():
                break


class GroupCommitService(ServiceThread):
    """SYNC_FLUSH: producers wait; one fsync per round acknowledges all of them."""

    name = "group-commit"

    def __init__(self, commitlog: FlushedLog, timeout_ms: int, max_wait_ms: float = 1.0) -> None:
        super().__init__()
        self._commitlog = commitlog
        self._timeout_s = timeout_ms / 1000
        self._max_wait_s = max(0.0, max_wait_ms) / 1000
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # waiters: flushed_where moved
        self._arrived = threading.Condition(lock)  # the flusher: a waiter arrived
        self._waiting = 0  # producers blocked in wait_flushed
        self._last_group = 0  # waiters + callbacks the previous fsync round acknowledged
        self._requested = 0
        # async puts in submission order: (end offset, monotonic deadline, callback)
        self._callbacks: deque[tuple[int, float, Callable[[bool], None]]] = deque()
        self._reaper: threading.Thread | None = None
        self._reap_wakeup = threading.Event()
        self._reap_at = 0.0  # when the reaper looks next (monotonic): later deadlines wait
        self._flushing = False  # a round is in flight (the flusher's or a leader's)
        self._flusher_waiting = False  # the flusher waits for a leader's round to end
        self._last_round_s = LEAD_MAX_S  # the last round's fsync time: leading while short
        self.fsync_count = 0
        self.stats = FsyncStats()
        self.flushed_store_timestamp = 0
        self.failed: OSError | None = None

    @property
    def flushed_where(self) -> int:
        return self._commitlog.queue.flushed_where

    def wait_flushed(self, end: int, timeout_s: float) -> bool:
        """Block until the commitlog is flushed past `end`; False on timeout or failure."""
        q = self._commitlog.queue
        if q.flushed_where >= end:
            return True
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if end > self._requested:
                self._requested = end
            self._waiting += 1
            self._arrived.notify()
            self.wakeup()
            try:
                while q.flushed_where < end:
                    if self.failed is not None or self.stopped:
                        return q.flushed_where >= end
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
            finally:
                self._waiting -= 1
        return True

    def submit(self, end: int, callback: Callable[[bool], None]) -> None:
        """Call `callback(True)` once flushed past `end`, `callback(False)` on timeout.

        Callbacks run on the flusher (success) or the timeout reaper (timeout) thread.
        """
        reap = False
        with self._cond:
            if self._commitlog.queue.flushed_where >= end:
                ok: bool | None = True
            elif self.failed is not None:
                ok = False
            else:
                ok = None
                deadline = time.monotonic() + self._timeout_s
                # the reaper looks again at `_reap_at` anyway: woken only to look earlier
                reap = deadline < self._reap_at
                self._callbacks.append((end, deadline, callback))
                if end > self._requested:
                    self._requested = end
                self._arrived.notify()
        if ok is not None:
            callback(ok)
            return
        self.wakeup()
        if reap:
            self._reap_wakeup.set()

    def _reap_loop(self) -> None:
        """Time out async callbacks even while the flusher is stuck in a slow fsync."""
        while not self.stopped:
            expired: list[Callable[[bool], None]] = []
            with self._cond:
                now = time.monotonic()
                cbs = self._callbacks
                while cbs and cbs[0][1] <= now:  # deadlines are in submission order
                    expired.append(cbs.popleft()[2])
                wait_s = max(min(1.0, cbs[0][1] - now) if cbs else 1.0, 0.0)
                self._reap_at = now + wait_s
            for cb in expired:
                cb(False)
            self._reap_wakeup.wait(wait_s)
            self._reap_wakeup.clear()

    def start(self) -> None:
        super().start()
        if self._reaper is None:
            self._reaper = threading.Thread(
                target=self._reap_loop, name="group-commit-timeouts", daemon=True
            )
            self._reaper.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        super().shutdown(timeout)
        self._reap_wakeup.set()
        if self._reaper is not None:
            self._reaper.join(timeout)
            self._reaper = None

    def do_commit(self) -> None:
        """Flush rounds until every request so far is satisfied."""
        q = self._commitlog.queue
        while True:
            with self._cond:
                while self._flushing and not self.stopped:  # a leader's round: wait for it
                    self._flusher_waiting = True
                    try:
                        self._arrived.wait(self._timeout_s)
                    finally:
                        self._flusher_waiting = False
                if self._flushing or self._requested <= q.flushed_where:
                    break
                self._gather()
                self._flushing = True
            if not self._round():
                return
        self._finish(q.flushed_where)

    def lead(self, end: int) -> bool | None:
        """Flush past `end` on the caller's thread when no one else needs a flush: no round
        in flight, no producer waiting, the last round acknowledged at most one (producers
        that came together lately keep sharing the flusher's rounds until one comes alone),
        and the last fsync was fast (under `LEAD_MAX_S`).
        True once flushed past `end`, False when the fsync failed; None, and nothing done,
        when others are there or the disk was slow: then wait with `submit` or
        `wait_flushed`, sharing the group commit. The caller is held by this fsync however
        long it takes (no timeout): only a lone producer on a disk that was fast leads."""
        q = self._commitlog.queue
        if q.flushed_where >= end:
            return True
        with self._cond:
            if (
                self._flushing
                or self._waiting
                or self._callbacks
                or self._last_group > 1  # producers came together lately: share rounds
                or self._last_round_s >= LEAD_MAX_S
                or self.failed is not None
                or self.stopped
            ):
                return None
            self._flushing = True
            self._last_group = 1
            if end > self._requested:
                self._requested = end
        self._round()
        return q.flushed_where >= end

    def _round(self) -> bool:
        """One fsync of everything written so far (the caller set `_flushing`); False when
        it failed (then every waiter has been failed)."""
        cl = self._commitlog
        q = cl.queue
        ts = cl.last_store_timestamp  # read before the offset: the record is below it
        records = cl.records_put
        target = cl.get_max_offset()
        started = time.perf_counter()
        try:
            where = q.flush_to(target)
        except OSError as exc:
            self.failed = exc
            log.error("commitlog fsync failed; SYNC_FLUSH puts time out from now on: %s", exc)
            self._finish(q.flushed_where, fail_all=True, took=time.perf_counter() - started)
            return False
        except BaseException:
            self._finish(q.flushed_where, took=time.perf_counter() - started)
            raise
        took = time.perf_counter() - started
        self.fsync_count += 1
        self.stats.round(took, records)
        if where >= target:
            self.flushed_store_timestamp = ts
        self._finish(where, took=took)
        return True

    def _gather(self) -> None:
        """Under the lock: wait (at most `max_wait`) until as many producers wait as the
        previous round acknowledged; remember how many this round takes."""
        group = self._waiting + len(self._callbacks)
        if self._last_group > 1 and self._max_wait_s > 0:
            deadline = time.monotonic() + self._max_wait_s
            gap = self._max_wait_s / 10
            while not self.stopped:
                full = group >= self._last_group
                # once as many as last time wait, more only while they keep coming (one
                # within a tenth of the bound): the group can grow to every producer there is
                left = deadline - time.monotonic()
                if full:
                    left = min(left, gap)
                if left <= 0:
                    break
                self._arrived.wait(left)
                arrived = self._waiting + len(self._callbacks)
                if full and arrived == group:
                    break
                group = arrived
        self._last_group = group

    def _finish(self, where: int, fail_all: bool = False, took: float | None = None) -> None:
        """Wake the waiters; complete the callbacks flushed (or all, failed, on error).
        With `took`, a round (its fsync time) ends: the next one may start."""
        done: list[tuple[Callable[[bool], None], bool]] = []
        with self._cond:
            if took is not None:
                self._flushing = False
                self._last_round_s = took
                if self._flusher_waiting:  # for a leader's round to end
                    self._arrived.notify()
            if self._waiting:
                self._cond.notify_all()
            cbs = self._callbacks
            if cbs:
                keep: deque[tuple[int, float, Callable[[bool], None]]] = deque()
                for item in cbs:
                    if item[0] <= where:
                        done.append((item[2], True))
                    elif fail_all:
                        done.append((item[2], False))
                    else:
                        keep.append(item)
                self._callbacks = keep
        for cb, ok in done:
            cb(ok)

    def run(self) -> None:
        while not self.stopped:
            self.wait_for_running(1.0)
            if self.failed is None:
                self.do_commit()
            else:
                self._finish(self.flushed_where, fail_all=True)
        if self.failed is None:
            self.do_commit()
        self._finish(self.flushed_where, fail_all=True)
