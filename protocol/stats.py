"""Plain counters both ends keep for their metrics, with no metrics library.

The hot paths (put, receive, ack, fsync; a client's handler) only add to an int or a
bucket; nothing here formats, labels or allocates per message. `broker.metrics` and the
client's `reliable.metrics` (through `reliable.handler_stats`) read these at scrape time and
turn them into Prometheus families, so a process whose metrics are never scraped pays a few
nanoseconds per call and nothing else.

    KeyedCounter   running totals per key (a (group, topic) pair), under its own lock
    Histogram      fixed bucket bounds, counts and a sum; `observe` under its own lock
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

# seconds: 50 us .. 10 s, the range of an fsync and of a send's server-side handling
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
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
)
# messages acknowledged by one fsync
BATCH_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class KeyedCounter(Generic[K]):
    """Monotonic totals per key; `add` is one dict update under an uncontended lock."""

    __slots__ = ("_lock", "_totals")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: dict[K, int] = {}

    def add(self, key: K, n: int = 1) -> None:
        with self._lock:
            self._totals[key] = self._totals.get(key, 0) + n

    def snapshot(self) -> dict[K, int]:
        with self._lock:
            return dict(self._totals)


@dataclass(frozen=True)
class HistogramSnapshot:
    bounds: tuple[float, ...]
    counts: tuple[int, ...]  # per bucket (not cumulative); the last one is +Inf
    total: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound as Prometheus writes it, cumulative count), +Inf last."""
        out: list[tuple[str, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


class Histogram:
    """Counts of observations per bucket (`value <= bound`), and their sum."""

    __slots__ = ("_bounds", "_counts", "_lock", "_sum")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS_S) -> None:
        self._bounds = tuple(sorted(bounds))
        self._counts = [0] * (len(self._bounds) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        i = bisect_left(self._bounds, value)
        with self._lock:
            self._counts[i] += 1
            self._sum += value

    def snapshot(self) -> HistogramSnapshot:
        with self._lock:
            return HistogramSnapshot(self._bounds, tuple(self._counts), self._sum)


__all__ = ["BATCH_BUCKETS", "LATENCY_BUCKETS_S", "Histogram", "HistogramSnapshot", "KeyedCounter"]
