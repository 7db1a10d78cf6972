"""The push consumer's consume threads (`reliable.consumer.workers.Workers`)."""

from __future__ import annotations

import threading
import time

import pytest

from reliable.consumer.workers import Workers


def test_calls_run_concurrently_on_at_most_max_workers_threads() -> None:
    pool = Workers(3, thread_name_prefix="t")
    gate = threading.Event()
    running: list[str] = []
    lock = threading.Lock()

    def call(i: int) -> None:
        with lock:
            running.append(threading.current_thread().name)
        gate.wait(5)

    for i in range(5):
        pool.submit(call, i)
    deadline = time.monotonic() + 5
    while len(running) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
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
