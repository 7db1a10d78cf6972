"""The server's loop dispatches the records it appends (`broker.server.loop_dispatch`): before
it waits, or within the dispatch interval when it never waits; appends made on other threads
are still the reput thread's; nothing is dispatched twice or left behind when the loop ends.
A real store on real files; a recording dispatcher tells which thread dispatched each record."""

from __future__ import annotations

import asyncio
import selectors
import threading
import time
from typing import Any

from broker.broker import Broker
from broker.server.answers import HeldAnswers
from broker.server.loop_dispatch import LoopDispatch, LoopSelector
from broker.store.message import Message


class Seen:
    """An extra store dispatcher: (queue offset, thread ident) of every record dispatched."""

    def __init__(self) -> None:
        self.records: list[tuple[int, int]] = []
        self._lock = threading.Lock()

    def dispatch(self, request: Any) -> None:
        with self._lock:
            self.records.append((request.queue_offset, threading.get_ident()))

    def offsets(self) -> list[int]:
        with self._lock:
            return [offset for offset, _ in self.records]

    def threads(self) -> set[int]:
        with self._lock:
            return {thread for _, thread in self.records}


def _put(broker: Broker, body: bytes) -> None:
    result = broker.store.put_message(Message("loop-dispatch", body, queue_id=0))
    assert result.ok


def _serve(broker: Broker, main: Any) -> Any:
    """Run `main(dispatch)` on a loop built as the server builds its own."""
    dispatch = LoopDispatch(broker.store)
    loop = asyncio.SelectorEventLoop(LoopSelector(0, dispatch))
    dispatch.install()
    try:
        return loop.run_until_complete(main(dispatch))
    finally:
        dispatch.uninstall()
        loop.close()


def test_what_the_loop_appends_it_dispatches_itself_before_it_waits(broker: Broker) -> None:
    seen = Seen()
    broker.store.add_dispatcher(seen)
    loop_thread = threading.get_ident()

    async def main(dispatch: LoopDispatch) -> None:
        dispatch.interval_ns = 3600 * 10**9  # no dispatch for being due: only for a wait
        for i in range(5):
            _put(broker, b"%d" % i)
        assert seen.offsets() == []  # no thread was woken: the loop has not waited yet
        await asyncio.sleep(0.01)  # the loop waits: it dispatches first
        assert seen.offsets() == [0, 1, 2, 3, 4]
        assert seen.threads() == {loop_thread}

    _serve(broker, main)
    assert broker.store.wait_dispatched(5.0)
    assert seen.offsets() == [0, 1, 2, 3, 4]  # once each


def test_a_loop_that_never_waits_still_dispatches_within_the_interval(broker: Broker) -> None:
    seen = Seen()
    broker.store.add_dispatcher(seen)
    loop_thread = threading.get_ident()

    async def main(dispatch: LoopDispatch) -> int:
        put = 0
        until = time.monotonic() + 0.2
        # always a callback ready: every select polls. At least 1,000 puts besides the
        # 0.2 s: a process descheduled for the whole window (a loaded machine) would
        # otherwise put one message and find it not dispatched yet
        while time.monotonic() < until or put < 1000:
            _put(broker, b"%d" % put)
            put += 1
            await asyncio.sleep(0)
        assert dispatch.interval_ns == 1_000_000  # the store's dispatch interval
        busy = seen.offsets()
        assert len(busy) > put // 2, f"{len(busy)} of {put} dispatched while the loop was busy"
        assert busy == list(range(len(busy)))  # in queue order, none twice
        assert seen.threads() == {loop_thread}
        return put

    put = _serve(broker, main)
    assert broker.store.wait_dispatched(5.0)
    assert seen.offsets() == list(range(put))


def test_appends_on_other_threads_still_wake_the_reput_thread(broker: Broker) -> None:
    seen = Seen()
    broker.store.add_dispatcher(seen)
    loop_thread = threading.get_ident()

    async def main(dispatch: LoopDispatch) -> None:
        other = threading.Thread(target=_put, args=(broker, b"elsewhere"))
        other.start()
        other.join()
        deadline = time.monotonic() + 5
        while not seen.offsets() and time.monotonic() < deadline:
            time.sleep(0.001)  # the loop is held: only the reput thread can dispatch it
        assert seen.offsets() == [0]
        assert loop_thread not in seen.threads()

    _serve(broker, main)


def test_what_the_loop_left_when_it_ended_is_dispatched_by_the_thread(broker: Broker) -> None:
    seen = Seen()
    broker.store.add_dispatcher(seen)

    async def main(dispatch: LoopDispatch) -> None:
        _put(broker, b"last")  # and the loop ends without waiting again

    _serve(broker, main)
    assert broker.store.wait_dispatched(5.0)
    assert seen.offsets() == [0]
    # the append hook is the reput thread's again
    _put(broker, b"after")
    assert broker.store.wait_dispatched(5.0)
    assert seen.offsets() == [0, 1]


def test_the_loops_selector_releases_held_answers_in_the_same_turn(broker: Broker) -> None:
    """On a loop built as the server builds its own (`broker.server.answers`): calls made in
    one burst are answered together, and the loop does not block with answers released."""
    answers = HeldAnswers(batch=64, linger_ms=1000)
    dispatch = LoopDispatch(broker.store)
    loop = asyncio.SelectorEventLoop(LoopSelector(0, dispatch, answers))
    dispatch.install()
    answers.install()
    order: list[str] = []

    async def call(name: str) -> None:
        held = answers.hold()
        if held is not None:
            await held
        order.append(name)

    async def main() -> None:
        await asyncio.sleep(0.01)  # the loop waits once: idle
        started = loop.time()
        # five calls ready in one turn: the first leaves at once, four are held until
        # the loop is about to wait, with no sleep for the linger (1 s)
        await asyncio.gather(*(call(f"c{i}") for i in range(5)))
        assert loop.time() - started < 0.5
        assert order == ["c0", "c1", "c2", "c3", "c4"]
        assert answers.held_total == 4 and answers.rounds == 1

    try:
        loop.run_until_complete(main())
    finally:
        answers.uninstall()
        dispatch.uninstall()
        loop.close()


class CountingSelector(selectors.DefaultSelector):
    """The platform's selector, counting the polls (selects that do not block) made on it."""

    polls = 0

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        if timeout is not None and timeout <= 0:
            self.polls += 1
        return super().select(timeout)


class ProbedLoopSelector(LoopSelector, CountingSelector):
    """The server loop's selector over `CountingSelector`: its idle polls are counted."""


def test_after_a_burst_the_loop_waits_without_polling(broker: Broker) -> None:
    """A loop that held answers since it last waited (a client with many calls in flight)
    blocks at once when it waits next, though its poll window is open; a loop whose turns
    answered one call at a time polls that window, as before."""
    answers = HeldAnswers(batch=64, linger_ms=1000)
    dispatch = LoopDispatch(broker.store)
    selector = ProbedLoopSelector(100_000, dispatch, answers)
    loop = asyncio.SelectorEventLoop(selector)
    dispatch.install()
    answers.install()

    async def polls_of_a_wait() -> int:
        selector.idle.limit_ns = selector.idle.max_ns  # a window of 100 ms
        await asyncio.sleep(0)  # the turns that finish the calls are not counted
        before = selector.polls
        await asyncio.sleep(0.15)
        return selector.polls - before

    async def call() -> None:
        held = answers.hold()
        if held is not None:
            await held

    async def main() -> tuple[int, int]:
        await asyncio.sleep(0.01)  # the loop waits once: idle
        await asyncio.gather(*(call() for _ in range(5)))  # a burst: four answers held
        assert answers.held_total == 4
        after_burst = await polls_of_a_wait()
        await call()  # one call: answered at once, nothing held
        assert answers.held_total == 4
        one_at_a_time = await polls_of_a_wait()
        return after_burst, one_at_a_time

    try:
        after_burst, one_at_a_time = loop.run_until_complete(main())
    finally:
        answers.uninstall()
        dispatch.uninstall()
        loop.close()
    # after the burst's wait, the loop's timer rounding may make one more short wait: polled
    assert after_burst <= 2 < one_at_a_time, (after_burst, one_at_a_time)


def test_the_selector_tells_a_turn_woken_by_one_file_alone(broker: Broker) -> None:
    """`LoopWake.alone` (what lets a lone sync-flush send fsync at once): true for a turn
    the loop waited for and one file woke; false when two files woke it together, and for
    a turn the loop polled for (callbacks were ready)."""
    import socket

    dispatch = LoopDispatch(broker.store)
    selector = LoopSelector(0, dispatch)
    loop = asyncio.SelectorEventLoop(selector)
    a, a_peer = socket.socketpair()
    b, b_peer = socket.socketpair()
    seen: list[tuple[str, bool]] = []

    def reader(sock: socket.socket, name: str) -> None:
        sock.recv(16)
        seen.append((name, selector.wake.alone))

    async def main() -> None:
        loop.add_reader(a.fileno(), reader, a, "a")
        loop.add_reader(b.fileno(), reader, b, "b")
        loop.call_later(0.01, a_peer.send, b"1")
        await asyncio.sleep(0.05)  # the loop waits; one file wakes it
        assert seen == [("a", True)]
        seen.clear()
        a_peer.send(b"2")
        b_peer.send(b"2")
        await asyncio.sleep(0.05)  # both ready when the loop waits next
        assert sorted(seen) == [("a", False), ("b", False)]
        seen.clear()
        a_peer.send(b"3")
        await asyncio.sleep(0)  # a poll: this coroutine was ready to go on
        await asyncio.sleep(0.05)
        assert seen == [("a", False)]

    dispatch.install()
    try:
        loop.run_until_complete(main())
    finally:
        dispatch.uninstall()
        loop.close()
        for s in (a, a_peer, b, b_peer):
            s.close()
