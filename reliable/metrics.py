"""Prometheus metrics of the client: handler durations and outcomes, idempotency guards.

An application embedding the framework exports them with one call, then serves them with
`reliable.endpoint.serve_metrics` or its own exporter:

    from reliable.metrics import register_client_metrics
    register_client_metrics(guards=[my_guard])   # prometheus_client's REGISTRY by default

Handlers declared with `@handler` / `@dlq_handler` record into the process-wide
`HANDLER_STATS` (one histogram observation and one counter add per message, under two
uncontended locks); the collector reads it when scraped. A guard's counts are its own
`stats` (`idempotency.IdempotencyGuard.stats`), read, not counted again. Labels are the
consumer group (bounded by the application's handlers), the outcome and the guard event.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from broker.store.stats import Histogram, KeyedCounter

PREFIX = "reliable_"

# seconds: 1 ms .. 60 s, the range of a message handler's work
HANDLER_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class HandlerOutcome(enum.Enum):
    """What a handler's run decided for its message."""

    SUCCESS = "success"  # returned normally (or the guard found it already done)
    RETRY = "retry"  # RetryLater, or an exception to retry
    DISCARD = "discard"  # Discard, or an exception listed in ignore_on
    DEAD_LETTER = "dead_letter"  # dead-lettered at once (dead_letter_on, dead_letter_other)


#: guard events always exported (0 until they happen), as `idempotency.EventKind` values
GUARD_EVENTS = ("processed", "duplicate", "in_progress", "fenced", "redis_unavailable",
                "db_unavailable")

#: every family this module exports, with its type (the dashboard test checks against it)
CLIENT_METRICS: dict[str, str] = {
    "reliable_handler_duration_seconds": "histogram",
    "reliable_handler_messages_total": "counter",
    "reliable_guard_events_total": "counter",
}


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


def _guard_counts(guard: object) -> dict[str, int]:
    """A guard's `stats.counts` (event -> count) by event name; {} for other guards."""
    target = getattr(guard, "built", guard)  # a DefaultGuard: the guard it built, if any
    counts = getattr(getattr(target, "stats", None), "counts", None)
    if not isinstance(counts, dict):
        return {}
    for _ in range(3):  # the handler thread may add a first key while we copy
        try:
            items = list(counts.items())
            break
        except RuntimeError:
            continue
    else:
        return {}
    return {getattr(k, "value", str(k)): int(v) for k, v in items}


class ClientCollector(Collector):
    """Handler metrics from `stats`, guard events from the guards `guards()` returns."""

    def __init__(self, *, stats: HandlerStats = HANDLER_STATS,
                 guards: Callable[[], Iterable[object]] | Iterable[object] = ()) -> None:
        self._stats = stats
        self._guards = guards

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        duration = HistogramMetricFamily(
            PREFIX + "handler_duration_seconds",
            "Time a handler took for one message (guard included)", labels=["group"])
        for group, hist in sorted(self._stats.durations().items()):
            snap = hist.snapshot()
            duration.add_metric([group], snap.cumulative(), snap.total)
        yield duration
        outcomes = CounterMetricFamily(
            PREFIX + "handler_messages", "Messages handled, by what the handler decided",
            labels=["group", "outcome"])
        for (group, outcome), n in sorted(self._stats.outcomes.snapshot().items(),
                                          key=lambda kv: (kv[0][0], kv[0][1].value)):
            outcomes.add_metric([group, outcome.value], float(n))
        yield outcomes
        events = CounterMetricFamily(
            PREFIX + "guard_events", "Idempotency guard decisions, summed over the guards",
            labels=["event"])
        totals = dict.fromkeys(GUARD_EVENTS, 0)
        guards = self._guards() if callable(self._guards) else self._guards
        seen: set[int] = set()
        for guard in guards:
            target = getattr(guard, "built", guard)
            if target is None or id(target) in seen:
                continue  # one guard shared by several handlers counts once
            seen.add(id(target))
            for event, n in _guard_counts(target).items():
                totals[event] = totals.get(event, 0) + n
        for event, n in totals.items():
            events.add_metric([event], float(n))
        yield events


def handler_guards(handlers: Iterable[Any]) -> Callable[[], list[object]]:
    """The guards of `@handler` objects (idempotent= and mark_dead_letters=), looked up at
    each scrape (a default guard is built when its consumer starts)."""
    handlers = list(handlers)

    def guards() -> list[object]:
        out: list[object] = []
        for h in handlers:
            out.extend(g for g in (getattr(h, "guard", None), getattr(h, "marker", None))
                       if g is not None)
        return out
    return guards


def register_client_metrics(registry: CollectorRegistry = REGISTRY, *,
                            guards: Callable[[], Iterable[object]] | Iterable[object] = (),
                            ) -> ClientCollector:
    """Register the client's collector (handlers, and `guards`' events) in `registry`."""
    collector = ClientCollector(guards=guards)
    registry.register(collector)
    return collector


__all__ = ["CLIENT_METRICS", "GUARD_EVENTS", "HANDLER_STATS", "ClientCollector",
           "HandlerOutcome", "HandlerStats", "handler_guards", "register_client_metrics"]
