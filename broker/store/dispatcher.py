"""The reput service: turns new commitlog records into consume-queue units and index entries.

    commitlog  ... | rec | rec | rec | rec |            <- producers append here
                         ^ reput_from_offset    ^ commitlog max offset

One background thread reads every record between `reput_from_offset` and the commitlog's
end, validates its layout (`codec.check_message_and_return_size`), and hands the decoded
`DispatchRequest` to each dispatcher of the chain, in order:

1. the core chain given at construction (consume queues, then the index): a failure stops
   the round at that record, which is retried next round, so no record is ever skipped;
2. extra dispatchers added later (`add_dispatcher`, e.g. long-poll wake-ups): a failure is
   logged and does not hold back dispatching.

A message is readable by consumers once its unit is in its consume queue, that is once
`reput_from_offset` has passed it (`wait_dispatched`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Protocol

from broker.store.codec import DispatchRequest, check_message_and_return_size
from broker.store.mapped_file_queue import MappedFileQueue
from broker.store.service import ServiceThread

log = logging.getLogger(__name__)

_IDLE_PARK_S = 1.0  # the longest an idle dispatcher sleeps without being woken
_BATCH = 256  # records read before they are handed to the dispatchers together


class CommitLogDispatcher(Protocol):
    """Something that reacts to each record the reput service reads."""

    def dispatch(self, request: DispatchRequest) -> None: ...


class CommitLogSource(Protocol):
    """What the reput service reads from (the commitlog)."""

    queue: MappedFileQueue

    def get_min_offset(self) -> int: ...

    def get_max_offset(self) -> int: ...

    def roll_next_file(self, offset: int) -> int: ...


class ReputService(ServiceThread):
    """Dispatches commitlog records from `reput_from_offset` on, in a background thread."""

    name = "reput"

    def __init__(
        self,
        commitlog: CommitLogSource,
        dispatchers: Sequence[CommitLogDispatcher],
        *,
        reput_from_offset: int = 0,
        interval_ms: int = 1,
        check_crc: bool = False,
    ) -> None:
        super().__init__()
        self.commitlog = commitlog
        self.reput_from_offset = reput_from_offset
        self.interval_s = interval_ms / 1000
        self.idle_park_s = _IDLE_PARK_S  # idle, woken by puts; this is only a backstop
        self.check_crc = check_crc  # recovery validated the CRCs; appends compute them
        # commitlog offset -> TOTALSIZE of records recovery quarantined: stepped over
        self.skip: dict[int, int] = {}
        self.dispatched_count = 0
        self._core: tuple[CommitLogDispatcher, ...] = tuple(dispatchers)
        self._extra: tuple[CommitLogDispatcher, ...] = ()
        self._cond = threading.Condition()
        self._round_lock = threading.Lock()
        self._blocked_at = -1  # offset of an invalid record the log was told about
        # why the last round stopped short of the commitlog's end (None: it did not)
        self.stuck_at = -1
        self.stuck_reason: str | None = None
        self.last_error: Exception | None = None

    # --- chain
    def add_dispatcher(self, dispatcher: CommitLogDispatcher) -> None:
        """Add a hook run after the core chain for every record (errors are only logged)."""
        self._extra = (*self._extra, dispatcher)

    # --- progress
    def behind(self) -> int:
        """Bytes of commitlog not dispatched yet."""
        return max(0, self.commitlog.get_max_offset() - self.reput_from_offset)

    def wait_dispatched(self, offset: int, timeout_s: float) -> bool:
        """Wait until every record before commitlog `offset` is dispatched."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.reput_from_offset < offset:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.wakeup()
                self._cond.wait(min(left, 0.05))
            return True

    # --- work
    def do_reput(self) -> int:
        """Dispatch everything written so far; returns the number of records dispatched."""
        with self._round_lock:
            return self._reput_round()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No round runs inside (one under way ends first): `reput_from_offset` may be
        moved (a running store cut back, `MessageStore.cut_back`)."""
        with self._round_lock:
            yield
        self.wakeup()

    def try_reput(self) -> int:
        """`do_reput` on the caller's thread unless a round is running elsewhere; then the
        service thread is woken to run one more after it (so nothing appended before this
        call waits for the idle backstop) and -1 is returned."""
        if not self._round_lock.acquire(blocking=False):
            self.wakeup()
            return -1
        try:
            return self._reput_round()
        finally:
            self._round_lock.release()

    def _stuck(self, offset: int, reason: str, error: Exception | None) -> None:
        self.stuck_at = offset
        self.stuck_reason = reason
        self.last_error = error

    def _reput_round(self) -> int:
        done = 0
        self.stuck_at = -1
        self.stuck_reason = None
        self.last_error = None
        commitlog = self.commitlog
        min_offset = commitlog.get_min_offset()
        if min_offset >= 0 and self.reput_from_offset < min_offset:
            log.warning(
                "reput offset %d is below the commitlog min %d (files deleted before "
                "dispatch); continuing from the min",
                self.reput_from_offset,
                min_offset,
            )
            self.reput_from_offset = min_offset
        check = check_message_and_return_size
        check_crc = self.check_crc
        skip = self.skip
        stop = False
        try:
            while not stop and self.reput_from_offset < commitlog.get_max_offset():
                offset = self.reput_from_offset
                mf = commitlog.queue.find_mapped_file_by_offset(offset)
                if mf is None or not mf.hold():
                    break
                base = mf.file_from_offset
                pos = start = offset - base
                try:
                    limit = mf.wrote_position
                    with mf.buffer() as whole, whole[:limit] as view:
                        while pos < limit and not stop:
                            # read a run of records, then hand them over as one batch
                            batch: list[DispatchRequest] = []
                            ends: list[int] = []
                            first = pos
                            ended = False  # a blank record, an invalid one or a skip
                            while pos < limit and len(batch) < _BATCH:
                                if skip and base + pos in skip:
                                    ended = True
                                    break
                                size, request = check(view, pos, check_crc)
                                if size > 0 and request is not None:
                                    batch.append(request)
                                    pos += size
                                    ends.append(pos)
                                else:
                                    ended = True
                                    break
                            if batch:
                                ok = self._dispatch_batch(batch)
                                self.reput_from_offset = base + (ends[ok - 1] if ok else first)
                                done += ok
                                if ok < len(batch):
                                    pos = self.reput_from_offset - base
                                    stop = True
                                    break
                            if not ended:
                                continue
                            if skip and base + pos in skip:  # quarantined by recovery
                                pos += skip[base + pos]
                                self.reput_from_offset = base + pos
                                continue
                            if pos >= limit:
                                break
                            size, request = check(view, pos, check_crc)
                            if size == 0:
                                pos = mf.file_size  # blank record: the rest is empty
                                break
                            if size < 0 or request is None:
                                self._invalid(base + pos)
                                self._stuck(base + pos, "not a valid record", None)
                                stop = True
                                break
                finally:
                    mf.release()
                if pos >= mf.file_size:
                    self.reput_from_offset = commitlog.roll_next_file(base)
                elif pos == start:
                    break  # nothing readable in this file right now
                with self._cond:
                    self._cond.notify_all()
        finally:
            self.dispatched_count += done
            with self._cond:
                self._cond.notify_all()
        return done

    def _dispatch_batch(self, batch: list[DispatchRequest]) -> int:
        """Hand records to the core chain, then to the extras; returns how many were
        dispatched. A dispatcher with `dispatch_batch` takes them at once; one that fails
        there gets them again one at a time (a core dispatcher skips what it already has),
        so a failure stops the round exactly at its record, as record by record would."""
        limit = len(batch)
        for dispatcher in self._core:
            many = getattr(dispatcher, "dispatch_batch", None)
            if many is not None:
                try:
                    many(batch[:limit] if limit < len(batch) else batch)
                    continue
                except Exception:
                    log.debug("%r failed on a batch; record by record", dispatcher, exc_info=True)
            for i in range(limit):
                try:
                    dispatcher.dispatch(batch[i])
                except Exception as exc:
                    at = batch[i].commitlog_offset
                    log.exception(
                        "dispatching the record at %d to %r failed; retrying next round",
                        at,
                        dispatcher,
                    )
                    self._stuck(at, f"{dispatcher!r} failed: {exc!r}", exc)
                    limit = i
                    break
        self._extras(batch[:limit] if limit < len(batch) else batch)
        return limit

    def _extras(self, batch: list[DispatchRequest]) -> None:
        if not batch:
            return
        for dispatcher in self._extra:
            many = getattr(dispatcher, "dispatch_batch", None)
            try:
                if many is not None:
                    many(batch)
                    continue
            except Exception:
                log.exception("extra dispatcher %r failed on a batch", dispatcher)
                continue
            for request in batch:
                try:
                    dispatcher.dispatch(request)
                except Exception:
                    log.exception(
                        "extra dispatcher %r failed on the record at %d",
                        dispatcher,
                        request.commitlog_offset,
                    )

    def _invalid(self, offset: int) -> None:
        if self._blocked_at != offset:
            self._blocked_at = offset
            log.error(
                "invalid commitlog record at %d: dispatching stops here until the "
                "store is recovered",
                offset,
            )

    # --- thread
    def run(self) -> None:
        # Idle, the thread parks until a put wakes it (`wakeup`, called after every
        # commitlog append), so the first record after a pause is dispatched at once.
        # Busy, it lingers `interval_s` after each round that dispatched something: records
        # put meanwhile are dispatched together by the next round, instead of one round
        # (and one thread switch) per put.
        while not self.stopped:
            done = 0
            try:
                done = self.do_reput()
            except Exception:
                log.exception("reput round failed")
            if done and self.interval_s > 0:
                self._stopped.wait(self.interval_s)
            else:
                self.wait_for_running(self.idle_park_s)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the thread, then dispatch whatever is left so nothing written is unindexed."""
        super().shutdown(timeout)
        try:
            self.do_reput()
        except Exception:
            log.exception("final reput round failed")
