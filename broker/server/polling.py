"""Long polling on the event loop: a parked receive holds no thread.

A parked ReceiveMessage waits for one of three things, then asks the broker again:
- a new message dispatched to its topic (a store dispatcher reports arrivals);
- an ack, nack or dead-lettering on its (group, topic) through this server (a FIFO group's
  next message may now be free);
- a re-poll tick (`REPOLL_S`), which catches invisible times running out.
It answers as soon as anything is found, or empty when its polling time is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from broker.server.errors import TooManyRequests

REPOLL_S = 0.5


class ArrivalHook:
    """A store dispatcher forwarding topics to the loop, at most one pending wake-up per
    topic, and none for a topic nobody waits on (`wanted`). It runs where the dispatch runs:
    on the reput thread, or on the loop itself before it waits (`broker.server.loop_dispatch`);
    either way the wake-up goes through `call_soon_threadsafe`, whose wake of the selector
    keeps a loop about to block from sleeping past it.

    Skipping is safe: the hook runs after the consume queue has the record, and a receive
    parks before it looks at the queue, so a receive that parks after the check sees the
    message itself."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        wake: Callable[[str], None],
        wanted: Callable[[str], bool] | None = None,
    ) -> None:
        self._loop = loop
        self._wake = wake
        self._wanted = wanted
        self._lock = threading.Lock()
        self._pending: set[str] = set()

    def dispatch(self, request: Any) -> None:
        self.dispatch_topic(request.topic)

    def dispatch_batch(self, requests: list[Any]) -> None:
        for topic in {r.topic for r in requests}:
            self.dispatch_topic(topic)

    def dispatch_topic(self, topic: str) -> None:
        """Wake the loop for `topic`; nothing when nobody waits (no hand-off per record)."""
        if self._wanted is not None and not self._wanted(topic):
            return
        with self._lock:
            if topic in self._pending:
                return
            self._pending.add(topic)
        with contextlib.suppress(RuntimeError):  # a closed loop: the server is gone
            self._loop.call_soon_threadsafe(self._fire, topic)

    def _fire(self, topic: str) -> None:
        with self._lock:
            self._pending.discard(topic)
        self._wake(topic)


class Waiters:
    """Parked receives by topic; touched only on the event loop."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._by_topic: dict[str, set[asyncio.Event]] = {}
        self._count = 0

    def park(self, topic: str) -> asyncio.Event:
        if self._count >= self._limit:
            raise TooManyRequests("too many long-polling receives in flight; retry later")
        event = asyncio.Event()
        self._by_topic.setdefault(topic, set()).add(event)
        self._count += 1
        return event

    def unpark(self, topic: str, event: asyncio.Event) -> None:
        events = self._by_topic.get(topic)
        if events is not None and event in events:
            events.discard(event)
            self._count -= 1
            if not events:
                del self._by_topic[topic]

    def parked(self, topic: str) -> bool:
        """Whether a receive waits on `topic` (safe to ask from another thread)."""
        return topic in self._by_topic

    def wake(self, topic: str) -> None:
        for event in self._by_topic.get(topic, ()):
            event.set()

    def wake_all(self) -> None:
        for events in self._by_topic.values():
            for event in events:
                event.set()

    def __len__(self) -> int:
        return self._count
