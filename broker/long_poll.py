"""Long polling: park a pull or receive until a message arrives or the poll times out.

The broker registers `ArrivalNotifier` as a store dispatcher (`store.add_dispatcher`): every
record the store dispatches to a consume queue bumps a per-topic version and wakes parked
requests for that topic. A waiter reads the version *before* looking for messages, so a
message dispatched between the look and the park is never missed.
"""

from __future__ import annotations

import threading
import time

from broker.store.codec import DispatchRequest
from protocol.names import SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC


class ArrivalNotifier:
    """A store dispatcher that wakes long polls waiting on a topic."""

    _IGNORED = frozenset({SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC})

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._versions: dict[str, int] = {}
        self._closed = False

    # --- CommitLogDispatcher
    def dispatch(self, request: DispatchRequest) -> None:
        if request.topic in self._IGNORED:
            return
        self.notify(request.topic)

    def dispatch_batch(self, requests: list[DispatchRequest]) -> None:
        ignored = self._IGNORED
        topics = {r.topic for r in requests if r.topic not in ignored}
        if topics:
            with self._cond:
                for topic in topics:
                    self._versions[topic] = self._versions.get(topic, 0) + 1
                self._cond.notify_all()

    def notify(self, topic: str) -> None:
        """Wake everyone waiting on `topic` (also used for lease expiries and nacks)."""
        with self._cond:
            self._versions[topic] = self._versions.get(topic, 0) + 1
            self._cond.notify_all()

    def version(self, topic: str) -> int:
        with self._cond:
            return self._versions.get(topic, 0)

    def wait(self, topics: dict[str, int], timeout_ms: int) -> bool:
        """Park until one of `topics` moves past the version given, or timeout; True if moved."""
        deadline = time.monotonic() + timeout_ms / 1000.0
        with self._cond:
            while True:
                if self._closed:
                    return False
                if any(self._versions.get(t, 0) != v for t, v in topics.items()):
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)

    def close(self) -> None:
        """Release every waiter (shutdown)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def reopen(self) -> None:
        with self._cond:
            self._closed = False
