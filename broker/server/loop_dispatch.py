"""The server's event loop dispatches the records it appended, just before it waits.

Every send the server stores is appended on its event loop (`broker.server.producing`).
Left to the store's reput thread (`broker.store.dispatcher.ReputService`), each append
wakes that thread, which then takes the GIL from the loop while the loop is still answering:
on a two-core machine the thread's wake-up, its round and the GIL hand-offs cost more than
the round's own work, and they land in the middle of the next call. So the loop dispatches
its own appends:

- an append on the loop thread only notes the time of the first undispatched one;
- before the loop waits for I/O (its selector is about to block), it runs one dispatch
  round itself (`ReputService.try_reput`): the answers are out, and the work fills time
  the loop would spend idle;
- a loop that never waits (a steady stream of calls) dispatches once the oldest noted append
  is the store's dispatch interval old (`dispatch_interval_ms`, the reput thread's linger),
  so a record is readable as soon as before;
- appends on any other thread (the schedule service, transaction checks, replication) wake
  the reput thread as before, and it stays the backstop: when it is mid-round the loop wakes
  it for one more round instead of waiting for it.

A parked receive is woken by the dispatch itself (`broker.server.polling.ArrivalHook`, which
hands the wake-up to the loop through `call_soon_threadsafe`, so a loop about to block sees
it). The dispatch chain and its order are the store's; only the thread that runs it changes.
"""

from __future__ import annotations

import logging
import selectors
import threading
import time
from typing import Any

from broker.idle_poll import PollingSelector
from broker.server.answers import HeldAnswers
from broker.server.send_groups import SendGroups
from broker.store.store import MessageStore

log = logging.getLogger(__name__)


class LoopDispatch:
    """Installed on a store by the loop's thread (`install`), removed when the loop ends."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.interval_ns = max(0, store.config.dispatch_interval_ms) * 1_000_000
        self._thread = 0  # the loop thread's ident, once installed
        self._since = 0  # perf_counter_ns of the first append not dispatched yet (0: none)
        self._reput = store.reput
        self._wake = store.reput.wakeup

    def install(self) -> None:
        """From now on, appends made on the calling thread (the loop's) are its to dispatch."""
        self._thread = threading.get_ident()
        self.store.set_append_hook(self.appended)

    def uninstall(self) -> None:
        """Appends wake the reput thread again, which takes what the loop left (on the loop
        thread, after its last call)."""
        self.store.set_append_hook(None)
        self._thread = 0
        if self._since:
            self._since = 0
            self._wake()

    def appended(self) -> None:
        """The commitlog's append hook (called on whichever thread appended)."""
        if threading.get_ident() != self._thread:
            self._wake()
        elif not self._since:
            self._since = time.perf_counter_ns()

    def before_select(self, timeout: float | None) -> None:
        """Called by the loop's selector: dispatch when the loop is about to wait, or when
        the oldest append has waited the dispatch interval."""
        since = self._since
        if not since:
            return
        polling = timeout is not None and timeout <= 0  # the loop has calls ready
        if polling and time.perf_counter_ns() - since < self.interval_ns:
            return
        self._since = 0
        try:
            self._reput.try_reput()
        except Exception:  # the reput thread retries it; the loop must keep serving
            log.exception("dispatching on the server loop failed; left to the reput thread")
            self._wake()


class LoopWake:
    """What woke the loop for its current turn. `alone`: the loop had nothing to do (its
    select was a wait, not a poll for more of a busy turn) and one file became ready. A
    call read in such a turn, alone in what its connection's bytes held, is the only
    thing the loop has to do (a client sending one call at a time): a sync-flush send may
    then be fsynced at once, without a turn given to calls that could come with it
    (`broker.server.producing`)."""

    __slots__ = ("alone",)

    def __init__(self) -> None:
        self.alone = False


class LoopSelector(PollingSelector):
    """The server loop's selector: before every select it stores the sends grouped while
    the loop was busy (`groups.before_select`, `broker.server.send_groups`), releases the
    answers held meanwhile (`answers.before_select`, `broker.server.answers`; a select that
    stored or released some does not block, so their calls finish in the same turn) and runs
    `dispatch.before_select`, then selects as `PollingSelector` does (polling first for an
    adaptive window, `max_us` 0: never).

    Except after a burst: when the loop held answers or grouped sends since it last waited,
    a client keeps many calls in flight, and its next calls come whether or not the loop
    polls for them; the loop then blocks at once. Polling there found calls a few
    microseconds sooner at the price of a spin of `sched_yield` and `select(0)` per wait:
    with the official Java client's `sendAsync` (1,000 in flight) the server spent 290 µs
    of CPU a message polling, 242 without (docs/performance.md, idle polling). A client
    sending one call at a time makes no burst, and keeps its poll."""

    def __init__(
        self,
        max_us: int,
        dispatch: LoopDispatch,
        answers: HeldAnswers | None = None,
        groups: SendGroups | None = None,
        wake: LoopWake | None = None,
    ) -> None:
        super().__init__(max_us)
        self.dispatch = dispatch
        self.answers = answers
        self.groups = groups
        self.wake = wake if wake is not None else LoopWake()
        self._batched = 0  # answers held and sends grouped when the loop last waited

    def _batched_total(self) -> int:
        answers, groups = self.answers, self.groups
        held = answers.held_total if answers is not None else 0
        return held + (groups.sends_joined if groups is not None else 0)

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        groups, answers = self.groups, self.answers
        if groups is not None and groups.before_select(timeout):
            timeout = 0  # the stored sends' calls finish first; they are ready to run
        if answers is not None and answers.before_select(timeout):
            timeout = 0  # the released answers first; the dispatch once the loop waits
        self.dispatch.before_select(timeout)
        waits = timeout is None or timeout > 0
        burst = False
        if waits:  # about to wait: after a burst, without a poll
            batched = self._batched_total()
            burst = batched != self._batched
            self._batched = batched
        if burst:
            events = selectors.DefaultSelector.select(self, timeout)
        else:
            events = super().select(timeout)
        self.wake.alone = waits and len(events) == 1
        return events
