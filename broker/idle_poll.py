"""Polling for a while before a thread blocks, so a reply that comes soon meets a running CPU.

    idle = IdlePoll(max_us=200)
    ready = idle.wait(lambda: poller.poll(0), lambda: poller.poll(50))   # a blocking read

    loop = asyncio.SelectorEventLoop(PollingSelector(max_us=200))        # an event loop

A thread that blocks hands its CPU to the kernel, which halts it when nothing else runs. On
a virtual machine whose idle driver does not poll first (`cpuidle-haltpoll` with
`guest_halt_poll_ns` 0), each halt and the wake that ends it leave and re-enter the guest:
tens of microseconds on both sides of every wait. A one-at-a-time send has three such
waits (the server for the request, the client for the answer, and, under sync flush, the
server for its fsync), and they cost more than its work (docs/performance.md, "Idle
polling"). Busy-waiting runtimes (Erlang's schedulers, Go's) and the kernel's own
`haltpoll` governor avoid the cost by polling before they halt; this is the same for the
waits a Python thread of ours makes.

The poll window adapts per waiting thread, as the kernel's haltpoll governor sizes its own:
it starts at zero; a wait that ended within `max_us` but after the window doubles the window
(from `GROW_START_NS`), up to `max_us`; a wait longer than `max_us` halves it. So a thread
polls only while its waits keep ending within `max_us` (a steady exchange of calls and
answers), and an idle or slow peer costs it no polling at all. A poll that finds nothing
within the window blocks as before: the CPU spent is at most the window per wait. Between
two polls the thread yields its CPU (`sched_yield`): a polling thread takes only time the
CPU would otherwise spend halted, never time another runnable thread needs (on a machine
with two cores, a client and a server polling beside each other's working threads cost
each other 20-35% of their rate without it).
"""

from __future__ import annotations

import os
import selectors
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_MAX_US = 200  # the kernel haltpoll governor's default window (guest_halt_poll_ns)
GROW_START_NS = 50_000  # a window's first size once it grows (guest_halt_poll_grow_start)
MAX_US_LIMIT = 100_000  # a window over 0.1 s is no longer a poll before a sleep


def check_max_us(max_us: int) -> int:
    """`max_us` as a window bound; ValueError unless an int in 0..MAX_US_LIMIT."""
    if isinstance(max_us, bool) or not isinstance(max_us, int):
        raise ValueError(f"idle poll must be a whole number of microseconds, not {max_us!r}")
    if not 0 <= max_us <= MAX_US_LIMIT:
        raise ValueError(f"idle poll must be 0..{MAX_US_LIMIT} us, not {max_us}")
    return max_us


def _no_yield() -> None:
    pass


# Between two polls the thread offers its CPU to whatever else is runnable there: a poll
# only fills time the CPU would spend idle (halted), and never keeps another thread of this
# process or another (the client beside the server, the server's own grpc threads) waiting.
# With nothing else runnable, `sched_yield` returns at once.
_give_way: Callable[[], None] = getattr(os, "sched_yield", _no_yield)


class IdlePoll:
    """The adaptive poll window of one waiting thread (0 µs: never polls)."""

    __slots__ = ("_clock", "limit_ns", "max_ns")

    def __init__(self, max_us: int, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.max_ns = check_max_us(max_us) * 1000
        self.limit_ns = 0  # the current window
        self._clock = clock

    def adjust(self, waited_ns: int) -> None:
        """Size the next window from how long this wait lasted."""
        limit = self.limit_ns
        if waited_ns <= limit:  # ended inside the window: it was right
            return
        if waited_ns <= self.max_ns:  # a longer window would have caught it
            self.limit_ns = min(max(limit * 2, GROW_START_NS), self.max_ns)
        else:  # longer than any window: poll less
            self.limit_ns = limit // 2

    def wait(
        self, ready: Callable[[], T], block: Callable[[], T], within_ns: int | None = None
    ) -> T:
        """`ready()` (a non-blocking check) again and again for the current window (at most
        `within_ns`) until it returns something true, else `block()` (the blocking wait);
        what either returned."""
        if not self.max_ns:
            return block()
        clock = self._clock
        start = clock()
        limit = self.limit_ns if within_ns is None else min(self.limit_ns, within_ns)
        if limit:
            deadline = start + limit
            give_way = _give_way
            while True:
                got = ready()
                if got:
                    return got
                if clock() >= deadline:
                    break
                give_way()
        got = block()
        self.adjust(clock() - start)
        return got


class PollingSelector(selectors.DefaultSelector):
    """The platform's selector, whose blocking `select` first polls for an adaptive window
    (`IdlePoll`), never past its timeout: for an asyncio loop,
    `asyncio.SelectorEventLoop(PollingSelector(max_us))`."""

    def __init__(self, max_us: int = DEFAULT_MAX_US) -> None:
        super().__init__()
        self.idle = IdlePoll(max_us)

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        idle = self.idle
        select = super().select
        if not idle.max_ns or (timeout is not None and timeout <= 0):
            return select(timeout)
        if timeout is None:
            return idle.wait(lambda: select(0), select)
        clock = time.perf_counter_ns
        start = clock()

        def block() -> list[tuple[Any, int]]:  # what is left of the timeout after polling
            return select(max(0.0, timeout - (clock() - start) / 1e9))

        return idle.wait(lambda: select(0), block, int(timeout * 1e9))
