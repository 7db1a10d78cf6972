"""Polling before a thread blocks (`broker.idle_poll`): the window's rules on a virtual
clock, and the selector on real sockets (events delivered, timeouts kept, the window grown
by a peer that answers fast and shrunk by one that does not)."""

from __future__ import annotations

import asyncio
import selectors
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from broker.idle_poll import GROW_START_NS, IdlePoll, PollingSelector, check_max_us


class Clock:
    """A virtual `perf_counter_ns` that moves only when told."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now

    def tick(self, ns: int) -> bool:
        """Move on `ns`; a poll that found nothing (False)."""
        self.now += ns
        return False


def test_the_window_grows_while_waits_end_within_the_bound_and_shrinks_past_it() -> None:
    idle = IdlePoll(200)
    assert idle.limit_ns == 0
    idle.adjust(100_000)  # 100 us: a window would have caught it
    assert idle.limit_ns == GROW_START_NS
    idle.adjust(100_000)
    assert idle.limit_ns == 100_000
    idle.adjust(80_000)  # inside the window: it was right, unchanged
    assert idle.limit_ns == 100_000
    idle.adjust(190_000)
    assert idle.limit_ns == 200_000  # doubled, up to the bound
    idle.adjust(199_000)
    assert idle.limit_ns == 200_000
    idle.adjust(5_000_000)  # longer than any window: halved
    assert idle.limit_ns == 100_000
    for _ in range(20):
        idle.adjust(5_000_000)
    assert idle.limit_ns == 0  # an idle peer costs no polling at all


def test_a_wait_polls_its_window_then_blocks() -> None:
    clock = Clock()
    idle = IdlePoll(200, clock=clock)
    idle.limit_ns = 100_000
    polls: list[int] = []

    def ready() -> bool:
        polls.append(clock.now)
        clock.now += 30_000  # each poll takes 30 us of the virtual clock
        return False

    blocked: list[int] = []

    def block() -> str:
        blocked.append(clock.now)
        clock.now += 500_000  # the answer came 0.5 ms later: past the bound
        return "blocked"

    assert idle.wait(ready, block) == "blocked"
    assert polls == [0, 30_000, 60_000, 90_000]  # until the 100 us window had passed
    assert blocked == [120_000]
    assert idle.limit_ns == 50_000  # a wait past the bound halves the window


def test_what_a_poll_finds_is_returned_without_blocking() -> None:
    clock = Clock()
    idle = IdlePoll(200, clock=clock)
    idle.limit_ns = 100_000
    answers = iter([[], [], ["ready"]])

    def ready() -> list[str]:
        clock.now += 10_000
        return next(answers)

    def block() -> list[str]:
        raise AssertionError("a poll found the answer: no blocking wait")

    assert idle.wait(ready, block) == ["ready"]
    assert idle.limit_ns == 100_000


def test_a_poll_that_finds_nothing_offers_the_cpu_before_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between two polls the thread yields (`sched_yield`): a runnable thread (the client
    beside the server, grpc's own threads) gets the CPU, the poll only takes idle time."""
    from broker import idle_poll

    assert idle_poll._give_way is idle_poll.os.sched_yield  # the real one on Linux
    clock = Clock()
    events: list[str] = []
    monkeypatch.setattr(idle_poll, "_give_way", lambda: events.append("yield"))
    idle = IdlePoll(200, clock=clock)
    idle.limit_ns = 100_000
    answers = iter([[], [], ["ready"]])

    def ready() -> list[str]:
        events.append("poll")
        clock.now += 10_000
        return next(answers)

    assert idle.wait(ready, lambda: ["blocked"]) == ["ready"]
    assert events == ["poll", "yield", "poll", "yield", "poll"]  # none after the find
    events.clear()
    idle.limit_ns = 25_000
    assert idle.wait(lambda: events.append("poll") or clock.tick(10_000), lambda: "b") == "b"
    assert events == ["poll", "yield", "poll", "yield", "poll"]  # none once the window is out


def test_a_bound_of_zero_never_polls() -> None:
    idle = IdlePoll(0)

    def ready() -> bool:
        raise AssertionError("polled with polling off")

    for _ in range(5):
        assert idle.wait(ready, lambda: "blocked") == "blocked"
    assert idle.limit_ns == 0


@pytest.mark.parametrize("bad", [-1, 100_001, 1.5, "200", True, None])
def test_a_bound_that_is_not_a_whole_number_of_microseconds_in_range_is_refused(
    bad: object,
) -> None:
    with pytest.raises(ValueError, match="idle poll"):
        check_max_us(bad)  # type: ignore[arg-type]


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_the_selector_delivers_every_event_and_grows_its_window_for_a_fast_peer(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    reader, writer = pair
    selector = PollingSelector(max_us=5_000)  # a wide bound: a loaded machine's thread wakes late
    selector.register(reader, selectors.EVENT_READ)
    got: list[bytes] = []
    grown = False
    for i in range(200):
        timer = threading.Timer(0.0005, writer.send, args=(bytes([i]),))
        timer.start()
        events = selector.select(timeout=2.0)
        timer.join()
        assert [key.fileobj for key, _ in events] == [reader]
        got.append(reader.recv(16))
        grown = grown or selector.idle.limit_ns > 0
    selector.close()
    assert b"".join(got) == bytes(range(200))  # each round's byte, once, in order
    assert grown, "answers within the bound never widened the poll window"


def test_the_selector_keeps_its_timeout_and_shrinks_its_window_for_a_silent_peer(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    reader, _ = pair
    selector = PollingSelector(max_us=200)
    selector.register(reader, selectors.EVENT_READ)
    selector.idle.limit_ns = 200_000
    for _ in range(3):
        started = time.monotonic()
        assert selector.select(timeout=0.02) == []
        took = time.monotonic() - started
        assert 0.019 <= took < 1.0
    assert selector.idle.limit_ns == 25_000  # 200 -> 100 -> 50 -> 25 us
    assert selector.select(timeout=0) == []  # a non-blocking select never polls
    selector.close()


def test_an_event_loop_on_the_selector_serves_a_round_trip_exchange() -> None:
    async def main() -> list[bytes]:
        served = asyncio.Event()

        async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            while data := await r.read(64):
                w.write(data)
                await w.drain()
            w.close()
            await w.wait_closed()
            served.set()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        r, w = await asyncio.open_connection("127.0.0.1", port)
        answers = []
        for i in range(300):
            w.write(b"%d;" % i)
            answers.append(await r.readuntil(b";"))
        w.close()
        await w.wait_closed()
        await served.wait()  # the server's side ended too: no task left pending
        server.close()
        await server.wait_closed()
        return answers

    selector = PollingSelector(max_us=200)
    loop = asyncio.SelectorEventLoop(selector)
    try:
        answers = loop.run_until_complete(main())
    finally:
        loop.close()
    assert answers == [b"%d;" % i for i in range(300)]
