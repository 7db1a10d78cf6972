"""Answers to gRPC calls, held while the event loop is busy and sent out together.

grpc.aio sends a unary call's answer as soon as its handler returns. A client that keeps
many calls in flight (the official client's `send_async`, a consumer acking from many
threads) then gets its answers one at a time, each a wake-up of its I/O thread, its
callback thread and whoever waits on the future. When the server keeps up, that costs the
client little: its threads stay busy and the answers find them awake. When the server is
the slower side, every answer finds them asleep, and on a machine where client and server
share the cores, the client's extra wake-ups take CPU the server needed (measured: 340
against 200 µs of client CPU a send, docs/performance.md "Answers held while the loop is
busy"). Network cards coalesce interrupts and RabbitMQ confirms with `multiple` for the
same reason.

So, while the loop is busy, answers are held and released together:

- an answer made after the loop last waited for I/O (it was idle: a lone call, or the first
  of a burst) leaves at once; nothing is held for a client that sends one call at a time;
- an answer made while the loop has not waited since the last one is held (its handler
  awaits a future), until `batch` answers are held, the loop is about to wait (the calls
  ready are served: nothing more is coming soon), or the oldest has been held `linger_ms`;
- the selector's `before_select` (`broker.server.loop_dispatch.LoopSelector`) releases
  them, and makes that select not block, so the released calls run in the same turn.

Only the loop's own selector releases answers on wait and linger, so holding starts only once
`install` is called by the thread that runs the loop with that selector; until then, and
with `batch` 0, nothing is held. The native wire's answers are never held: the framework's
client puts many messages and acks in each request, so its answers are few (docs/wire.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

DEFAULT_BATCH = 64  # answers held at most: a burst, not a window's worth
DEFAULT_LINGER_MS = 5.0  # the longest an answer waits for the loop to be done
MAX_BATCH = 4096
MAX_LINGER_MS = 1000.0


def check_batch(batch: int) -> int:
    """`batch` as a bound of held answers; ValueError unless an int in 0..MAX_BATCH."""
    if isinstance(batch, bool) or not isinstance(batch, int) or not 0 <= batch <= MAX_BATCH:
        raise ValueError(f"the answer batch must be a whole number 0..{MAX_BATCH}, not {batch!r}")
    return batch


def check_linger_ms(linger_ms: float) -> float:
    """`linger_ms` as a bound of one answer's hold; ValueError unless 0..MAX_LINGER_MS."""
    if (
        isinstance(linger_ms, bool)
        or not isinstance(linger_ms, int | float)
        or not 0 <= linger_ms <= MAX_LINGER_MS
    ):
        raise ValueError(f"the answer linger must be 0..{MAX_LINGER_MS:g} ms, not {linger_ms!r}")
    return float(linger_ms)


class HeldAnswers:
    """The answers one event loop holds (`hold`) and releases (`before_select`)."""

    __slots__ = (
        "_clock",
        "_held",
        "_idle",
        "_installed",
        "_pass",
        "_since",
        "batch",
        "held_total",
        "linger_ns",
        "rounds",
    )

    def __init__(
        self,
        batch: int = DEFAULT_BATCH,
        linger_ms: float = DEFAULT_LINGER_MS,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.batch = check_batch(batch)
        self.linger_ns = int(check_linger_ms(linger_ms) * 1_000_000)
        self._clock = clock
        self._held: list[asyncio.Future[None]] = []
        self._since = 0  # clock() when the oldest held answer was held
        self._idle = True  # the loop has waited for I/O since the last answer left
        self._installed = False
        self._pass = False  # the next `hold` answers at once (`answer_now`)
        self.held_total = 0  # answers ever held
        self.rounds = 0  # releases of held answers

    def install(self) -> None:
        """The loop's selector calls `before_select` from now on: answers may be held."""
        self._installed = True

    def uninstall(self) -> None:
        """No selector releases them any more: release what is held, hold nothing more."""
        self._installed = False
        self._release()

    @property
    def held(self) -> int:
        """Answers held now."""
        return len(self._held)

    @property
    def busy(self) -> bool:
        """Whether an answer made now would be held: the loop has not waited for I/O since
        the last answer left."""
        return not self._idle and self._installed and self.batch > 0

    def answer_now(self) -> None:
        """The next `hold` answers at once: the answer was made with the others of its turn
        already (a send stored with its group, `broker.server.send_groups`)."""
        self._pass = True

    def hold(self) -> asyncio.Future[None] | None:
        """Called by a handler whose answer is ready: None to answer now, else a future to
        await first (on the loop's thread)."""
        if self._pass:
            self._pass = False
            return None
        if self._idle or not self._installed or not self.batch:
            self._idle = False
            return None
        held = self._held
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not held:
            self._since = self._clock()
        held.append(future)
        self.held_total += 1
        if len(held) >= self.batch:
            self._release()
        return future

    def before_select(self, timeout: float | None) -> bool:
        """Called by the loop's selector before each select with its timeout (0: calls are
        ready). True when answers were released: that select must not block."""
        waiting = timeout is None or timeout > 0
        if waiting:
            self._idle = True
        if not self._held:
            return False
        if waiting or self._clock() - self._since >= self.linger_ns:
            self._release()
            return True
        return False

    def _release(self) -> None:
        held = self._held
        if not held:
            return
        self._held = []
        self.rounds += 1
        for future in held:
            if not future.done():  # a cancelled call's future
                future.set_result(None)
