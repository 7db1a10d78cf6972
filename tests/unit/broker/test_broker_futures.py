"""`LightFuture` keeps every promise of `concurrent.futures.Future`: results, errors,
callbacks (once each, in order), waits from other threads (no lost wake-up), `wait`,
`as_completed`, cancellation and `asyncio.wrap_future`."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import (
    FIRST_COMPLETED,
    CancelledError,
    Future,
    InvalidStateError,
    as_completed,
    wait,
)
from concurrent.futures import TimeoutError as FutureTimeout

import pytest

from broker.futures import LightFuture


def test_is_a_future_and_returns_its_result_without_a_condition() -> None:
    f: LightFuture[int] = LightFuture()
    assert isinstance(f, Future)
    assert not f.done()
    f.set_result(7)
    assert f.done() and f.result() == 7 and f.exception() is None
    assert f._cond is None  # nobody waited: no Condition was made


def test_an_error_is_raised_by_result_and_returned_by_exception() -> None:
    f: LightFuture[int] = LightFuture()
    f.set_exception(KeyError("k"))
    with pytest.raises(KeyError):
        f.result()
    assert isinstance(f.exception(), KeyError)


def test_finishing_twice_is_refused() -> None:
    f: LightFuture[int] = LightFuture()
    f.set_result(1)
    with pytest.raises(InvalidStateError):
        f.set_result(2)
    with pytest.raises(InvalidStateError):
        f.set_exception(ValueError())
    assert f.result() == 1


def test_callbacks_run_once_each_in_order_before_and_after_the_end() -> None:
    f: LightFuture[int] = LightFuture()
    seen: list[str] = []
    f.add_done_callback(lambda x: seen.append(f"a{x.result()}"))
    f.add_done_callback(lambda x: seen.append(f"b{x.result()}"))
    f.set_result(1)
    f.add_done_callback(lambda x: seen.append(f"c{x.result()}"))
    assert seen == ["a1", "b1", "c1"]


def test_a_failing_callback_does_not_stop_the_others() -> None:
    f: LightFuture[int] = LightFuture()
    seen: list[int] = []

    def bad(_x: Future[int]) -> None:
        raise RuntimeError("callback failed")

    f.add_done_callback(bad)
    f.add_done_callback(lambda x: seen.append(x.result()))
    f.set_result(3)
    assert seen == [3]


def test_a_waiting_thread_is_woken() -> None:
    f: LightFuture[int] = LightFuture()
    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(f.result(timeout=10)))
    t.start()
    t.join(0.05)
    f.set_result(5)
    t.join(10)
    assert got == [5]


def test_result_times_out_when_pending() -> None:
    f: LightFuture[int] = LightFuture()
    with pytest.raises(FutureTimeout):
        f.result(timeout=0.01)
    with pytest.raises(FutureTimeout):
        f.exception(timeout=0.01)


def test_no_wake_up_is_lost_under_racing_finishers_and_waiters() -> None:
    """Thousands of futures finished by one thread while others wait on them, callbacks
    are added, and `wait` watches them: every waiter returns and every callback runs
    exactly once (a lost wake-up would hang a waiter into its timeout)."""
    n = 3000
    futures: list[LightFuture[int]] = [LightFuture() for _ in range(n)]
    calls = [0] * n
    lock = threading.Lock()

    def count(i: int) -> None:
        with lock:
            calls[i] += 1

    def finisher() -> None:
        for i, f in enumerate(futures):
            f.set_result(i)

    def waiter(part: int) -> None:
        for i in range(part, n, 3):
            assert futures[i].result(timeout=10) == i

    def adder() -> None:
        for i, f in enumerate(futures):
            f.add_done_callback(lambda _f, i=i: count(i))

    threads = [threading.Thread(target=waiter, args=(p,)) for p in range(3)]
    threads += [threading.Thread(target=adder), threading.Thread(target=finisher)]
    for t in threads:
        t.start()
    done, not_done = wait(futures, timeout=10)
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    assert len(done) == n and not not_done
    assert calls == [1] * n


def test_wait_and_as_completed_see_futures_finished_later() -> None:
    fs: list[LightFuture[int]] = [LightFuture() for _ in range(3)]
    timer = threading.Timer(0.05, lambda: fs[1].set_result(1))
    timer.start()
    done, _ = wait(fs, timeout=10, return_when=FIRST_COMPLETED)
    assert done == {fs[1]}
    fs[0].set_result(0)
    fs[2].set_exception(ValueError())
    assert set(as_completed(fs, timeout=10)) == set(fs)


def test_cancel_and_finish_race_has_one_winner() -> None:
    f: LightFuture[int] = LightFuture()
    assert f.cancel()
    assert f.cancelled() and f.done()
    with pytest.raises(InvalidStateError):
        f.set_result(1)
    with pytest.raises(CancelledError):
        f.result()
    g: LightFuture[int] = LightFuture()
    g.set_result(1)
    assert not g.cancel()


def test_asyncio_awaits_it() -> None:
    f: LightFuture[int] = LightFuture()

    async def main() -> int:
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, lambda: threading.Thread(target=f.set_result, args=(9,)).start())
        return await asyncio.wrap_future(f)

    assert asyncio.run(main()) == 9
