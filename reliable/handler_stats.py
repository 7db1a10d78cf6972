"""What `@handler` records per message for `reliable.metrics`: a duration histogram and
outcome totals per consumer group, in plain counters (no metrics library is imported on the
handler's path; `reliable.metrics.ClientCollector` reads them when scraped)."""

from __future__ import annotations

import enum
import threading

from protocol.stats import Histogram, KeyedCounter

# seconds: 1 ms .. 60 s, the range of a message handler's work
HANDLER_BUCKETS_S: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


class HandlerOutcome(enum.Enum):
    """What a handler's run decided for its message."""

    SUCCESS = "success"  # returned normally (or the guard found it already done)
    RETRY = "retry"  # RetryLater, or an exception to retry
    DISCARD = "discard"  # Discard, or an exception listed in ignore_on
    DEAD_LETTER = "dead_letter"  # dead-lettered at once (dead_letter_on, dead_letter_other)


class HandlerStats:
    """Per consumer group: a duration histogram and outcome totals."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._durations: dict[str, Histogram] = {}
        self.outcomes: KeyedCounter[tuple[str, HandlerOutcome]] = KeyedCounter()

    def record(self, group: str, seconds: float, outcome: HandlerOutcome) -> None:
        hist = self._durations.get(group)
        if hist is None:
            with self._lock:
                hist = self._durations.setdefault(group, Histogram(HANDLER_BUCKETS_S))
        hist.observe(seconds)
        self.outcomes.add((group, outcome))

    def durations(self) -> dict[str, Histogram]:
        with self._lock:
            return dict(self._durations)


HANDLER_STATS = HandlerStats()


__all__ = ["HANDLER_BUCKETS_S", "HANDLER_STATS", "HandlerOutcome", "HandlerStats"]
