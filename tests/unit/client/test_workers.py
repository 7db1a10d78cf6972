"""The push consumer's consume threads (`reliable.consumer.workers.Workers`)."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from reliable.consumer.workers import Workers


def _start_blocked(pool: Workers, calls: int, expect: int) -> tuple[list[str], threading.Event]:
    """Put `calls` calls that each wait on a gate and wait (5 s at most) until `expect` of
    them run at once: the names of the threads running them, and the gate to open."""
    gate = threading.Event()
    running: list[str] = []
    lock = threading.Lock()

    def call() -> None:
        with lock:
            running.append(threading.current_thread().name)
        gate.wait(10)

    for _ in range(calls):
        pool.submit(call)
    deadline = time.monotonic() + 5
    while len(running) < expect and time.monotonic() < deadline:
        time.sleep(0.005)
    return running, gate


def test_calls_run_concurrently_on_at_most_max_workers_threads() -> None:
    pool = Workers(3, thread_name_prefix="t")
    running, gate = _start_blocked(pool, 5, 3)
    time.sleep(0.05)
    assert len(running) == 3  # three threads busy, two calls wait for one
    assert sorted(running) == ["t_0", "t_1", "t_2"]
    gate.set()
    pool.shutdown(wait=True)
    assert len(running) == 5  # shutdown without cancel lets queued calls run


def test_a_failing_call_is_logged_and_the_thread_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool = Workers(1, thread_name_prefix="t")
    done = threading.Event()

    def boom() -> None:
        raise ValueError("listener bug")

    pool.submit(boom)
    pool.submit(done.set)
    assert done.wait(5)
    pool.shutdown()
    assert "listener bug" in caplog.text


def test_shutdown_with_cancel_drops_calls_not_started_and_refuses_new_ones() -> None:
    pool = Workers(1, thread_name_prefix="t")
    started, release = threading.Event(), threading.Event()
    ran: list[int] = []

    def first() -> None:
        started.set()
        release.wait(5)
        ran.append(0)

    pool.submit(first)
    assert started.wait(5)
    for i in range(1, 4):
        pool.submit(ran.append, i)
    pool.shutdown(wait=False, cancel_futures=True)
    release.set()
    pool.shutdown(wait=True)
    assert ran == [0]  # the running call finished, the queued ones were dropped
    with pytest.raises(RuntimeError):
        pool.submit(ran.append, 9)


def test_a_burst_of_calls_that_return_at_once_wakes_one_thread_at_a_time() -> None:
    """32 calls put while no thread runs Python but the submitter: the first wakes a thread,
    the rest wake none while it is on its way, and that thread runs them all (a queue that
    woke a thread per call started all 20 here, each for one call)."""
    pool = Workers(20, thread_name_prefix="burst")
    done = threading.Event()
    ran: list[int] = []

    def call(i: int) -> None:
        ran.append(i)
        if len(ran) == 32:
            done.set()

    before = sys.getswitchinterval()
    sys.setswitchinterval(1.0)  # no thread takes the interpreter from another unasked
    try:
        for i in range(32):
            pool.submit(call, i)
        assert done.wait(10)
    finally:
        sys.setswitchinterval(before)
    assert sorted(ran) == list(range(32))
    started = [t for t in threading.enumerate() if t.name.startswith("burst_")]
    assert pool.wakes <= 2 and len(started) <= 2, (pool.wakes, started)
    pool.shutdown()


def test_calls_that_wait_get_every_thread_back_after_the_limit_fell() -> None:
    """The limit learned from fast calls (1 here) rises while calls wait and the process is
    idle, with no new call put: eight calls that block all run at once."""
    pool = Workers(8, thread_name_prefix="t")
    pool.limit = 1
    running, gate = _start_blocked(pool, 8, 8)
    concurrent = len(running)
    gate.set()
    pool.shutdown()
    assert concurrent == 8 and pool.limit == 8


def test_calls_that_only_compute_lower_the_limit_and_calls_that_wait_keep_it() -> None:
    """Calls that compute (50 us each) and never wait: more threads cannot run them sooner,
    the limit falls. Calls that wait (a 2 ms sleep each) keep every thread running."""
    pool = Workers(20, thread_name_prefix="t")

    def spin() -> None:
        end = time.thread_time() + 0.00005
        while time.thread_time() < end:
            pass

    deadline = time.monotonic() + 30
    while pool.limit == 20 and time.monotonic() < deadline:
        for _ in range(500):
            pool.submit(spin)
        time.sleep(0.01)
    assert pool.limit < 20

    most = [0]
    running = [0]
    lock = threading.Lock()
    done = threading.Semaphore(0)

    def wait() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.002)
        with lock:
            running[0] -= 1
        done.release()

    for _ in range(400):
        pool.submit(wait)
    for _ in range(400):
        assert done.acquire(timeout=30)
    pool.shutdown()
    assert most[0] == 20 and pool.limit == 20, (most[0], pool.limit)


def test_many_submitters_lose_no_call_and_shutdown_waits_for_all() -> None:
    """Four threads put 20,000 calls, one in ten blocking for half a millisecond: each runs
    exactly once (a call put while a thread parks is never left behind)."""
    pool = Workers(8, thread_name_prefix="t")
    seen: list[int] = []
    lock = threading.Lock()

    def call(i: int) -> None:
        if i % 10 == 0:
            time.sleep(0.0005)
        with lock:
            seen.append(i)

    def submitter(k: int) -> None:
        for i in range(k * 5000, (k + 1) * 5000):
            pool.submit(call, i)
            if i % 97 == 0:
                time.sleep(0.001)  # let the pool drain and park now and then

    threads = [threading.Thread(target=submitter, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    deadline = time.monotonic() + 30
    while len(seen) < 20000 and time.monotonic() < deadline:
        time.sleep(0.01)
    pool.shutdown(wait=True)
    assert sorted(seen) == list(range(20000))


class _ReleaseRunsTheWoken:
    """A parked thread's lock whose release lets the woken thread run before the waker
    goes on (what a thread switch right after the release does, rarely, on its own)."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()
        time.sleep(0.05)


def test_a_thread_woken_that_runs_at_once_leaves_no_call_behind() -> None:
    pool = Workers(2, thread_name_prefix="t")
    ran: list[str] = []
    both = threading.Barrier(3)
    for _ in range(2):  # two threads started, each parks when the queue is empty
        pool.submit(both.wait, 5)
    both.wait(5)
    deadline = time.monotonic() + 5
    while len(pool._parked) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    for t in pool._parked:
        t.park = _ReleaseRunsTheWoken(t.park)  # type: ignore[assignment]
    first = threading.Event()
    pool.submit(lambda: (ran.append("first"), first.set()))
    assert first.wait(5)
    # the woken thread ran the call and parked again: the next call must wake a thread
    # (it waited forever when the waker recorded it as woken after it had arrived)
    second = threading.Event()
    pool.submit(lambda: (ran.append("second"), second.set()))
    assert second.wait(2), f"a call was left in the queue: {pool._waking=} {pool._running=}"
    assert ran == ["first", "second"]
    pool.shutdown(wait=True)
