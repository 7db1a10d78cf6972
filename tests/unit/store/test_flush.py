"""Flushing: async thresholds, group commit batching, timeouts and fsync failures."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from broker.store import flush
from broker.store.commitlog import CommitLog
from broker.store.config import FlushMode
from broker.store.flush import FlushCommitLogService, GroupCommitService
from broker.store.message import PutMessageStatus

from ._helpers import ManualClock, message, small_config, wait_until


class GatedFsync:
    """An fsync that blocks while the gate is closed, and counts its calls."""

    def __init__(self, closed: bool = False) -> None:
        self.gate = threading.Event()
        if not closed:
            self.gate.set()
        self.calls = 0
        self.error: OSError | None = None

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if not self.gate.wait(10):
            raise AssertionError("gate never opened")
        if self.error is not None:
            raise self.error
        os.fdatasync(fd)


def _sync_log(tmp_path: Path, fsync: GatedFsync, **kw: object) -> CommitLog:
    cfg = small_config(
        tmp_path, flush_mode=FlushMode.SYNC_FLUSH, mapped_file_size_commitlog=256 * 1024, **kw
    )
    cl = CommitLog(cfg, ManualClock(), fsync=fsync)
    cl.load()
    cl.start()
    return cl


def test_group_commit_acknowledges_many_messages_per_fsync(tmp_path: Path) -> None:
    fsync = GatedFsync(closed=True)
    cl = _sync_log(tmp_path, fsync)
    threads_n, per_thread = 32, 20
    statuses: list[PutMessageStatus] = []
    lock = threading.Lock()
    started = threading.Barrier(threads_n + 1)

    def producer(t: int) -> None:
        started.wait()
        for i in range(per_thread):
            r = cl.put_message(message(t * 1000 + i, queue_id=t % 4))
            with lock:
                statuses.append(r.status)

    threads = [threading.Thread(target=producer, args=(t,)) for t in range(threads_n)]
    for t in threads:
        t.start()
    started.wait()
    # the first fsync is held until every producer has its first record written
    assert wait_until(lambda: sum(cl.topic_queue_table.values()) >= threads_n)
    fsync.gate.set()
    for t in threads:
        t.join()
    cl.shutdown()
    assert statuses == [PutMessageStatus.PUT_OK] * (threads_n * per_thread)
    assert cl.queue.flushed_where == cl.get_max_offset()
    assert cl.fsync_count > 0
    assert (threads_n * per_thread) / cl.fsync_count > 1
    cl.close()


def test_flush_disk_timeout_when_fsync_is_slow(tmp_path: Path) -> None:
    fsync = GatedFsync(closed=True)
    cl = _sync_log(tmp_path, fsync, sync_flush_timeout_ms=30)
    r = cl.put_message(message(1))
    assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
    assert r.status.stored and r.append is not None
    assert cl.look_message(r.append.wrote_offset) is not None  # stored, just not confirmed
    fsync.gate.set()
    assert wait_until(lambda: cl.queue.flushed_where >= r.append.wrote_offset + 1)  # type: ignore[union-attr]
    r2 = cl.put_message(message(2))
    assert r2.status is PutMessageStatus.PUT_OK
    cl.shutdown()
    cl.close()


def test_async_put_future_completes_after_fsync(tmp_path: Path) -> None:
    fsync = GatedFsync(closed=True)
    cl = _sync_log(tmp_path, fsync)
    futures = [cl.put_message_async(message(i)) for i in range(10)]
    assert not any(f.done() for f in futures)
    fsync.gate.set()
    results = [f.result(timeout=10) for f in futures]
    assert all(r.status is PutMessageStatus.PUT_OK for r in results)
    cl.shutdown()
    cl.close()


def test_async_put_future_times_out(tmp_path: Path) -> None:
    fsync = GatedFsync(closed=True)
    cl = _sync_log(tmp_path, fsync, sync_flush_timeout_ms=30)
    f = cl.put_message_async(message(1))
    assert f.result(timeout=10).status is PutMessageStatus.FLUSH_DISK_TIMEOUT
    fsync.gate.set()
    cl.shutdown()
    cl.close()


def test_failed_fsync_is_never_acknowledged(tmp_path: Path) -> None:
    fsync = GatedFsync()
    fsync.error = OSError(5, "Input/output error")
    cl = _sync_log(tmp_path, fsync)
    r = cl.put_message(message(1))
    assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
    service = cl.flush_service
    assert isinstance(service, GroupCommitService) and service.failed is not None
    # no retry that could report success for pages the kernel dropped
    assert cl.put_message(message(2)).status is PutMessageStatus.FLUSH_DISK_TIMEOUT
    cl.shutdown()
    cl.close()


def test_async_flush_waits_for_least_pages_then_thorough(tmp_path: Path) -> None:
    clock = ManualClock()
    cfg = small_config(
        tmp_path,
        mapped_file_size_commitlog=1 << 20,
        flush_least_pages_commitlog=4,
        flush_thorough_interval_commitlog_ms=10_000,
    )
    cl = CommitLog(cfg, clock)
    cl.load()
    service = cl.flush_service
    assert isinstance(service, FlushCommitLogService)
    cl.put_message(message(1, size=100))
    service.do_flush()
    assert cl.get_flushed_offset() == 0  # under 4 dirty pages
    for i in range(40):
        cl.put_message(message(i, size=500))
    service.do_flush()
    flushed = cl.get_flushed_offset()
    assert flushed == cl.get_max_offset()
    cl.put_message(message(99, size=100))
    service.do_flush()
    assert cl.get_flushed_offset() == flushed
    clock.advance(10_000)
    service.do_flush()
    assert cl.get_flushed_offset() == cl.get_max_offset()
    assert service.flushed_store_timestamp == cl.last_store_timestamp
    assert service.fsync_count == 2
    cl.close()


# --- adaptive group size --------------------------------------------------------------------
def _service(tmp_path: Path, max_wait_ms: float) -> GroupCommitService:
    """A group-commit service whose gathering is driven by hand (its thread not started)."""
    cl = CommitLog(small_config(tmp_path, flush_mode=FlushMode.SYNC_FLUSH), ManualClock())
    return GroupCommitService(cl, timeout_ms=5_000, max_wait_ms=max_wait_ms)


def _gather_in_thread(svc: GroupCommitService) -> tuple[threading.Thread, list[float]]:
    took: list[float] = []

    def run() -> None:
        start = time.monotonic()
        with svc._cond:
            svc._gather()
        took.append(time.monotonic() - start)

    t = threading.Thread(target=run)
    t.start()
    return t, took


def _arrive(svc: GroupCommitService, n: int = 1) -> None:
    with svc._cond:
        svc._waiting += n
        svc._arrived.notify()


def test_a_lone_producer_never_waits_for_company(tmp_path: Path) -> None:
    svc = _service(tmp_path, max_wait_ms=20_000)
    for last in (0, 1):
        svc._last_group, svc._waiting = last, 1
        t, took = _gather_in_thread(svc)
        t.join(10)
        assert took and took[0] < 5, took  # not the 20 s it could wait
        assert svc._last_group == 1


def test_a_round_waits_for_the_previous_rounds_group_then_goes(tmp_path: Path) -> None:
    svc = _service(tmp_path, max_wait_ms=20_000)
    svc._last_group, svc._waiting = 3, 1
    t, took = _gather_in_thread(svc)
    time.sleep(0.05)
    assert t.is_alive()  # one of three: waiting
    _arrive(svc)
    _arrive(svc)
    t.join(10)
    assert took and took[0] < 5, took  # went when the third came (or one gap after)
    assert svc._last_group == 3


def test_the_group_grows_while_producers_keep_coming(tmp_path: Path) -> None:
    svc = _service(tmp_path, max_wait_ms=20_000)  # a gap of 2 s between arrivals is enough
    svc._last_group, svc._waiting = 2, 2
    t, took = _gather_in_thread(svc)
    for _ in range(5):
        time.sleep(0.02)
        _arrive(svc)
    t.join(10)
    assert took and took[0] < 5
    assert svc._last_group == 7  # all of them, then one quiet gap


def test_fewer_producers_than_last_round_cost_one_bounded_wait(tmp_path: Path) -> None:
    svc = _service(tmp_path, max_wait_ms=2_000)
    svc._last_group, svc._waiting = 10, 2  # eight producers went away
    t, took = _gather_in_thread(svc)
    t.join(10)
    assert took and took[0] >= 1.9  # waited its bound...
    assert svc._last_group == 2  # ...and the next round sizes itself on two
    t, took = _gather_in_thread(svc)
    t.join(10)
    assert took and took[0] < 1.9  # the same two: one quiet gap (0.2 s), not the bound


def test_group_commit_wait_zero_flushes_at_once(tmp_path: Path) -> None:
    svc = _service(tmp_path, max_wait_ms=0)
    svc._last_group, svc._waiting = 50, 1
    t, took = _gather_in_thread(svc)
    t.join(10)
    assert took and took[0] < 1
    assert svc._last_group == 1


# --- a lone producer leads its own round ----------------------------------------------------
class ThreadFsync(GatedFsync):
    """A gated fsync that remembers the threads it ran on."""

    def __init__(self, closed: bool = False) -> None:
        super().__init__(closed)
        self.threads: list[int] = []

    def __call__(self, fd: int) -> None:
        self.threads.append(threading.get_ident())
        super().__call__(fd)


def _end(cl: CommitLog, i: int) -> int:
    (r,) = cl.put_messages([message(i)], wait=False)
    assert r.append is not None
    return r.append.wrote_offset + r.append.wrote_bytes


def test_a_lone_producer_fsyncs_on_its_own_thread_once_the_disk_was_fast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(flush, "LEAD_MAX_S", 60.0)  # every fsync "fast" on a loaded machine
    fsync = ThreadFsync()
    cl = _sync_log(tmp_path, fsync)
    service = cl.flush_service
    assert isinstance(service, GroupCommitService)
    # no round measured yet: the group-commit thread flushes first
    assert cl.flush_alone(_end(cl, 0)) is None
    assert cl.put_message(message(1)).status is PutMessageStatus.PUT_OK
    assert threading.get_ident() not in fsync.threads
    for i in range(2, 5):
        end = _end(cl, i)
        before = service.fsync_count
        assert cl.flush_alone(end) is True
        assert cl.queue.flushed_where >= end and service.fsync_count == before + 1
        assert fsync.threads[-1] == threading.get_ident()
    assert cl.flush_alone(end) is True  # already on disk: no fsync
    assert service.fsync_count == before + 1
    cl.shutdown()
    cl.close()


def test_a_producer_does_not_lead_while_others_wait_or_the_disk_was_slow(
    tmp_path: Path,
) -> None:
    fsync = ThreadFsync()
    cl = _sync_log(tmp_path, fsync)
    service = cl.flush_service
    assert isinstance(service, GroupCommitService)
    assert cl.put_message(message(0)).status is PutMessageStatus.PUT_OK  # a fast round
    fsync.gate.clear()
    pending = cl.put_message_async(message(1))  # a round in flight, held by the disk
    assert wait_until(lambda: len(fsync.threads) == 2)
    assert cl.flush_alone(_end(cl, 2)) is None  # shares the next round instead
    fsync.gate.set()
    assert pending.result(timeout=10).status is PutMessageStatus.PUT_OK
    with service._cond:  # a waiter is there: the group commit serves both
        service._waiting += 1
    try:
        assert cl.flush_alone(_end(cl, 3)) is None
    finally:
        with service._cond:
            service._waiting -= 1
    service._last_group = 2  # the last round was shared: producers come together
    assert cl.flush_alone(_end(cl, 4)) is None
    service._last_group = 1
    service._last_round_s = flush.LEAD_MAX_S  # the last fsync was slow: no one leads
    assert cl.flush_alone(_end(cl, 5)) is None
    cl.shutdown()
    cl.close()


def test_a_leaders_failed_fsync_is_never_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(flush, "LEAD_MAX_S", 60.0)  # every fsync "fast" on a loaded machine
    fsync = ThreadFsync()
    cl = _sync_log(tmp_path, fsync)
    assert cl.put_message(message(0)).status is PutMessageStatus.PUT_OK
    fsync.error = OSError(5, "Input/output error")
    assert cl.flush_alone(_end(cl, 1)) is False
    service = cl.flush_service
    assert isinstance(service, GroupCommitService) and service.failed is not None
    assert cl.flush_alone(_end(cl, 2)) is None  # never fsync again after a failure
    assert cl.put_message(message(3)).status is PutMessageStatus.FLUSH_DISK_TIMEOUT
    cl.shutdown()
    cl.close()
