"""The store's start-up sequence: consume queues and index brought into agreement with the
recovered commitlog, before any put can take a queue offset.

`MessageStore.start` runs these steps in this order (docs/store.md, "Recovery"):

1. load commitlog, consume queues and index; recover the commitlog (`recovery.py`);
2. `align_to_commitlog`: check the units of each queue's tail against their records (a
   queue with one that does not point at it is rebuilt), then cut queues and index back
   to the commitlog's end and move each queue's min offset to its first record still
   stored (the units further back: `UnitCheckService`, once the store is open);
3. `reput_start`: where re-dispatching begins (the queues' end, or further back after an
   abnormal stop, so a record killed between its unit and its index entries is indexed);
4. write the checkpoint and create the abort file;
5. `redispatch`: rebuild what was deleted (the index directory, a registered queue's
   directory) from the commitlog, dispatch what the queues lack, synchronously, and
   rebuild the topic-queue table from the queues.

`repair_units` re-derives one queue's units the same way when a read finds one that does
not point at its record.
"""

from __future__ import annotations

import logging
import mmap
import threading
import time
from collections.abc import Callable
from pathlib import Path

from broker.store.codec import DispatchRequest, is_queued
from broker.store.commitlog import CommitLog, topic_queue_key
from broker.store.consume_queue import ConsumeQueue
from broker.store.consume_queue_store import ConsumeQueueStore
from broker.store.dispatcher import CommitLogDispatcher, ReputService
from broker.store.errors import DispatchStuck
from broker.store.index_service import IndexService
from broker.store.queue_check import UnitChecker
from broker.store.recovery import RecoveryReport
from broker.store.service import ServiceThread

log = logging.getLogger(__name__)


class _OnlyQueues:
    """Dispatches to the given consume queues only (rebuilding deleted ones)."""

    def __init__(self, queues: ConsumeQueueStore, wanted: set[tuple[str, int]]) -> None:
        self.queues = queues
        self.wanted = wanted

    def dispatch(self, request: DispatchRequest) -> None:
        if (request.topic, request.queue_id) in self.wanted:
            self.queues.dispatch(request)


class _QueuesWithoutFiles:
    """Dispatches to the queues that had no file when the pass began (a lost registry)."""

    def __init__(self, queues: ConsumeQueueStore) -> None:
        self.queues = queues
        self.existing = {(cq.topic, cq.queue_id) for cq in queues.queues() if cq.mfq.mapped_files}

    def dispatch(self, request: DispatchRequest) -> None:
        if (request.topic, request.queue_id) not in self.existing:
            self.queues.dispatch(request)


class _RepairUnits:
    """Sets every unit of one queue to what the commitlog says it must be."""

    def __init__(self, cq: ConsumeQueue) -> None:
        self.cq = cq
        self.fixed = 0

    def dispatch(self, request: DispatchRequest) -> None:
        cq = self.cq
        if (
            request.topic == cq.topic
            and request.queue_id == cq.queue_id
            and is_queued(request.sys_flag)
            and cq.rewrite_unit(
                request.queue_offset, request.commitlog_offset, request.msg_size, request.tags_code
            )
        ):
            self.fixed += 1


def align_to_commitlog(
    commitlog: CommitLog, queues: ConsumeQueueStore, index: IndexService, report: RecoveryReport
) -> dict[tuple[str, int], int]:
    """Step 2: recover the queues, check their tails' units, cut queues and index back to
    the recovered commitlog's end, and move the queues' min offsets up to its min.
    Returns what `check_queues` left for `UnitCheckService`."""
    end = report.end
    queues.recover()
    unchecked = check_queues(commitlog, queues, end, past_end_ok=report.abnormal, tail=TAIL_UNITS)
    queues.truncate_dirty(end)
    index.truncate_dirty(end)
    cl_min = commitlog.get_min_offset()
    if cl_min >= 0:
        queues.correct_min_offset(cl_min)
        queues.forget_deleted_below(cl_min)
    return unchecked


def unit_checker(commitlog: CommitLog, end: int | None = None) -> UnitChecker:
    """A `UnitChecker` reading records straight from the commitlog's mappings."""
    files = commitlog.queue
    last: list[tuple[mmap.mmap, int, int]] = []  # the file found last: units go forward

    def locate(phy: int) -> tuple[mmap.mmap, int] | None:
        if last and last[0][1] <= phy < last[0][2]:
            return last[0][0], last[0][1]
        mf = files.find_mapped_file_by_offset(phy)
        if mf is None:
            return None
        last[:] = [(mf.mapping, mf.file_from_offset, mf.file_from_offset + mf.file_size)]
        return mf.mapping, mf.file_from_offset

    return UnitChecker(
        locate,
        max(commitlog.get_min_offset(), 0),
        commitlog.get_max_offset() if end is None else end,
    )


# units of each queue checked before the store opens (its tail: what dispatch and the
# topic-queue table start from); the rest are checked by `UnitCheckService` once serving
TAIL_UNITS = 64


def check_queues(
    commitlog: CommitLog,
    queues: ConsumeQueueStore,
    end: int,
    *,
    past_end_ok: bool,
    tail: int | None,
) -> dict[tuple[str, int], int]:
    """At start, before the queues are cut back to the commitlog's end: the units of each
    queue's tail must point at their records (queue_check.py); a queue with one that does
    not is rebuilt from the commitlog (`redispatch`). Returns, per queue kept, the queue
    offset below which its units were not checked: `UnitCheckService` checks those once
    the store is open (`tail=None`: every unit now, nothing left).

    The tail is what the start reads: re-dispatching begins at the queues' last units,
    `truncate_dirty` cuts units past the end, and the topic-queue table is their count.
    A unit further back decides none of these: it is checked after the store opens, and
    a wrong one is repaired (`MessageStore.repair_queue`), as a read that meets it does.

    Units past the end are the records a crash cut off only after an abnormal stop,
    and only as the queue's tail (`past_end_ok`); after a clean stop, or followed by a
    unit inside the log, such a unit is damage: cutting the queue there would lose the
    records after it. Header reads only: 1.4-1.9 us a unit (measured), ~2 s per
    million messages."""
    checker = unit_checker(commitlog, end)
    unchecked: dict[tuple[str, int], int] = {}
    for cq in queues.queues():
        topic = cq.topic.encode()
        low, high = cq.get_min_offset_in_queue(), cq.get_max_offset_in_queue()
        first = low if tail is None else max(low, high - tail)
        if tail is not None and past_end_ok:
            # units past the end (a crash's tail) are not counted in the tail checked
            while first > low:
                unit = cq.get_unit(first)
                if unit is None or unit[0] + unit[1] <= end:
                    break
                first = max(low, first - tail)
        problem = _first_problem(checker, cq, topic, first, high, past_end_ok)
        if problem is not None:
            queues.rebuild(cq, problem)
        elif first > low:
            unchecked[(cq.topic, cq.queue_id)] = first
    return unchecked


def _first_problem(
    checker: UnitChecker, cq: ConsumeQueue, topic: bytes, low: int, high: int, past_end_ok: bool
) -> str | None:
    """The first problem of units [low, high) of `cq` (see `check_queues`), or None."""
    end = checker.commitlog_end
    beyond = -1  # first unit past the end
    for index, phy, size, _tag in cq.iter_units(low, high - low):
        if past_end_ok and phy + size > end:
            beyond = index if beyond < 0 else beyond
            continue
        problem = checker.problem(topic, cq.queue_id, index, phy, size)
        if problem is None and beyond >= 0 and phy >= checker.commitlog_min:
            problem = f"follows unit {beyond}, which points past the log's end"
        if problem is not None:
            return f"unit {index} {problem}"
    return None


class UnitCheckService(ServiceThread):
    """Once the store is open: the units `check_queues` left (below each queue's tail)
    checked against the commitlog, a queue with a wrong one repaired from it.

    One pass, then the thread ends. It reads what the start found; units dispatched since
    are the dispatcher's own. It gives the interpreter up every `YIELD_EVERY` units, so
    the calls served meanwhile are not held behind it."""

    name = "unit-check"
    YIELD_EVERY = 2_000

    def __init__(
        self,
        commitlog: CommitLog,
        queues: ConsumeQueueStore,
        unchecked: dict[tuple[str, int], int],
        end: int,
        repair: Callable[[str, int], int],
    ) -> None:
        super().__init__()
        self._commitlog = commitlog
        self._queues = queues
        self._unchecked = unchecked
        self._end = end
        self._repair = repair
        self.done = threading.Event()
        self.units_checked = 0
        self.repaired: list[tuple[str, int]] = []

    def run(self) -> None:
        try:
            if self._unchecked:
                self._check_all()
        finally:
            self.done.set()

    def _check_all(self) -> None:
        began = time.monotonic()
        checker = unit_checker(self._commitlog, self._end)
        for (topic, queue_id), below in sorted(self._unchecked.items()):
            if self.stopped:
                return
            cq = self._queues.get(topic, queue_id)
            if cq is None:
                continue  # deleted since
            problem = self._first_problem(checker, cq, below)
            if problem is not None:
                log.warning(
                    "consume queue %s-%d: unit %s: repairing the queue from the commitlog",
                    topic,
                    queue_id,
                    problem,
                )
                self._repair(topic, queue_id)
                self.repaired.append((topic, queue_id))
        log.info(
            "consume queues checked against the commitlog: %d units in %.1f s, %d queue(s) "
            "repaired",
            self.units_checked,
            time.monotonic() - began,
            len(self.repaired),
        )

    def _first_problem(self, checker: UnitChecker, cq: ConsumeQueue, below: int) -> str | None:
        topic = cq.topic.encode()
        low = cq.get_min_offset_in_queue()
        for index, phy, size, _tag in cq.iter_units(low, below - low):
            self.units_checked += 1
            if self.units_checked % self.YIELD_EVERY == 0:
                if self.stopped:
                    return None
                time.sleep(0)
            try:
                problem = checker.problem(topic, cq.queue_id, index, phy, size)
            except (ValueError, BufferError):  # its commitlog file was closed meanwhile
                problem = None
            if problem is not None and phy >= self._commitlog.get_min_offset():
                return f"{index} {problem}"  # not a record expired meanwhile
        return None


def reput_start(
    commitlog: CommitLog, queues: ConsumeQueueStore, index: IndexService, report: RecoveryReport
) -> int:
    """Step 3: the commitlog offset re-dispatching starts from."""
    cl_min = max(commitlog.get_min_offset(), 0)
    cq_end = queues.get_max_physic_offset()
    start = cq_end if cq_end >= 0 else cl_min
    if report.abnormal:
        # re-dispatch the last queued record too: a kill between its consume-queue unit
        # and its index entries must not leave it unindexed
        last = last_queued_record_start(queues)
        if last >= 0:
            start = min(start, last)
        # the record being dispatched at the kill is the last queued one (queues come
        # first in the chain), which covers a kill between its index header and slots
        # (index_file.py). An index further behind (its files lost by a power cut) is
        # caught up from where recovery's scan started, not from its own tail: that could
        # be the whole log. (No index file at all: rebuilt by `redispatch`.)
        # A newest file deleted at load (its header torn by the kill) is re-indexed
        # from the end of the file before it, wherever recovery's scan started.
        indexed = index.indexed_to()
        if indexed >= 0:
            start = min(
                start, indexed if index.newest_rebuilt else max(indexed, report.scanned_from)
            )
    return min(max(start, cl_min), report.end)


def last_queued_record_start(queues: ConsumeQueueStore) -> int:
    """Commitlog offset of the newest record any queue holds a unit for; -1 if none."""
    best = -1
    for cq in queues.queues():
        n = cq.get_max_offset_in_queue()
        if n > cq.get_min_offset_in_queue():
            unit = cq.get_unit(n - 1)
            if unit is not None and unit[0] > best:
                best = unit[0]
    return best


def dispatch_all(commitlog: CommitLog, reput: ReputService) -> None:
    """Dispatch synchronously up to the commitlog's end; DispatchStuck otherwise.

    Rebuilding the topic-queue table from queues that miss records would hand their
    queue offsets out a second time: the store refuses to start instead.
    """
    while reput.reput_from_offset < commitlog.get_max_offset():
        before = reput.reput_from_offset
        reput.do_reput()
        if reput.reput_from_offset == before:
            at = reput.stuck_at if reput.stuck_at >= 0 else before
            raise DispatchStuck(at, reput.stuck_reason or "no progress") from reput.last_error


def rebuild_missing(
    store_dir: Path,
    commitlog: CommitLog,
    queues: ConsumeQueueStore,
    index: IndexService,
    skip: dict[int, int],
) -> None:
    """Re-derive a deleted index and deleted consume queues from the commitlog.

    Both are derived data: the index directory with no file left, or a queue registered
    (`consumequeue.json`) with no file left, is rebuilt by a dispatch pass over the
    whole commitlog that feeds only the missing parts (queues of deleted topics are
    not registered and stay deleted). `skip`: the records recovery quarantined.
    """
    cl_min = commitlog.get_min_offset()
    if cl_min < 0 or cl_min >= commitlog.get_max_offset():
        return
    chain: list[CommitLogDispatcher] = []
    if index.indexed_to() < 0:
        log.warning("store %s: no index file: rebuilding the index from the commitlog", store_dir)
        chain.append(index)
    missing = queues.missing_queues()
    if queues.registry_lost:
        # which queues existed is unknown: every queue the log names that has no file
        log.warning(
            "store %s: no consume queue registry: rebuilding every queue of the "
            "commitlog that has no file",
            store_dir,
        )
        chain.append(_QueuesWithoutFiles(queues))
    elif missing:
        log.warning(
            "store %s: consume queues %s have no file: rebuilding them from the commitlog",
            store_dir,
            ", ".join(f"{t}-{q}" for t, q in missing),
        )
        chain.append(_OnlyQueues(queues, set(missing)))
    if chain:
        rebuild = ReputService(commitlog, chain, reput_from_offset=cl_min)
        rebuild.skip = skip
        dispatch_all(commitlog, rebuild)


def redispatch(
    store_dir: Path,
    commitlog: CommitLog,
    queues: ConsumeQueueStore,
    index: IndexService,
    reput: ReputService,
) -> None:
    """Step 5: rebuild what was deleted, dispatch what the queues lack (DispatchStuck when
    a record cannot be), then rebuild the commitlog's topic-queue table from the queues."""
    rebuild_missing(store_dir, commitlog, queues, index, reput.skip)
    dispatch_all(commitlog, reput)
    if commitlog.get_max_offset() > max(commitlog.get_min_offset(), 0):
        # records without keys write no entry: remember that the index is complete
        index.mark_indexed_to(commitlog.get_max_offset(), commitlog.last_store_timestamp)
    commitlog.reset_table(
        {
            topic_queue_key(cq.topic, cq.queue_id): cq.get_max_offset_in_queue()
            for cq in queues.queues()
        }
    )


def repair_units(commitlog: CommitLog, cq: ConsumeQueue, skip: dict[int, int], until: int) -> int:
    """Rewrite every unit of `cq` below commitlog offset `until` that disagrees with the
    commitlog; returns how many were wrong. Reads the whole log: meant for the rare case."""
    repair = _RepairUnits(cq)
    reput = ReputService(commitlog, [repair], reput_from_offset=max(commitlog.get_min_offset(), 0))
    reput.skip = skip
    while reput.reput_from_offset < until:
        before = reput.reput_from_offset
        reput.do_reput()
        if reput.reput_from_offset == before:
            break
    return repair.fixed
