"""Latency fault tolerance: avoid brokers that answered slowly or failed.

The producer's `send_latency_fault_enable` option (docs/client.md) turns it on.

After each send the producer reports the broker's latency. A latency at or above a threshold
makes the broker unavailable for the matching duration:

    latency >=  50 100 550   1000   2000   3000   15000 ms
    avoid for    0   0  30s   60s   120s   180s    600s

A failed call counts as 30 s of latency (isolation: the longest penalty).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

LATENCY_MAX_MS: tuple[int, ...] = (50, 100, 550, 1000, 2000, 3000, 15000)
NOT_AVAILABLE_MS: tuple[int, ...] = (0, 0, 30_000, 60_000, 120_000, 180_000, 600_000)
ISOLATION_LATENCY_MS = 30_000


def not_available_duration_ms(
    latency_ms: float,
    latency_max: Sequence[int] = LATENCY_MAX_MS,
    not_available: Sequence[int] = NOT_AVAILABLE_MS,
) -> int:
    for threshold, duration in zip(reversed(latency_max), reversed(not_available), strict=True):
        if latency_ms >= threshold:
            return duration
    return 0


@dataclass(slots=True)
class FaultItem:
    broker: str
    latency_ms: float
    available_from_ms: float


class LatencyFaultTolerance:
    """Which brokers to avoid now; thread-safe; the clock (ms) is injected."""

    def __init__(
        self,
        clock_ms: Callable[[], float] | None = None,
        latency_max: Sequence[int] = LATENCY_MAX_MS,
        not_available: Sequence[int] = NOT_AVAILABLE_MS,
    ) -> None:
        if len(latency_max) != len(not_available):
            raise ValueError("latency_max and not_available must have the same length")
        self._clock = clock_ms or (lambda: time.monotonic() * 1000)
        self._latency_max = tuple(latency_max)
        self._not_available = tuple(not_available)
        self._items: dict[str, FaultItem] = {}
        self._lock = threading.Lock()

    def update(self, broker: str, latency_ms: float, *, isolation: bool = False) -> None:
        """Record one call's latency (`isolation`: the call failed)."""
        latency = ISOLATION_LATENCY_MS if isolation else latency_ms
        duration = not_available_duration_ms(latency, self._latency_max, self._not_available)
        now = self._clock()
        with self._lock:
            self._items[broker] = FaultItem(broker, latency, now + duration)

    def is_available(self, broker: str) -> bool:
        with self._lock:
            item = self._items.get(broker)
        return item is None or self._clock() >= item.available_from_ms

    def remove(self, broker: str) -> None:
        with self._lock:
            self._items.pop(broker, None)

    def pick_least_bad(self, brokers: Sequence[str]) -> str | None:
        """When every broker is being avoided: the one that becomes available first."""
        with self._lock:
            known = [self._items[b] for b in brokers if b in self._items]
        if not known:
            return brokers[0] if brokers else None
        return min(known, key=lambda i: (i.available_from_ms, i.latency_ms)).broker
