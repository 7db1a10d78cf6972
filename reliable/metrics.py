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

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from reliable.handler_stats import (
    HANDLER_STATS,
    HandlerOutcome,
    HandlerStats,
)

PREFIX = "reliable_"

#: guard events always exported (0 until they happen), as `idempotency.EventKind` values
GUARD_EVENTS = (
    "processed",
    "duplicate",
    "in_progress",
    "fenced",
    "redis_unavailable",
    "db_unavailable",
)

if TYPE_CHECKING:
    from reliable.decorators import Handler

#: every family this module exports, with its type (the dashboard test checks against it)
CLIENT_METRICS: dict[str, str] = {
    "reliable_handler_duration_seconds": "histogram",
    "reliable_handler_messages_total": "counter",
    "reliable_guard_events_total": "counter",
}


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

    def __init__(
        self,
        *,
        stats: HandlerStats = HANDLER_STATS,
        guards: Callable[[], Iterable[object]] | Iterable[object] = (),
    ) -> None:
        self._stats = stats
        self._guards = guards

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        duration = HistogramMetricFamily(
            PREFIX + "handler_duration_seconds",
            "Time a handler took for one message (guard included)",
            labels=["group"],
        )
        for group, hist in sorted(self._stats.durations().items()):
            snap = hist.snapshot()
            duration.add_metric([group], snap.cumulative(), snap.total)
        yield duration
        outcomes = CounterMetricFamily(
            PREFIX + "handler_messages",
            "Messages handled, by what the handler decided",
            labels=["group", "outcome"],
        )
        for (group, outcome), n in sorted(
            self._stats.outcomes.snapshot().items(), key=lambda kv: (kv[0][0], kv[0][1].value)
        ):
            outcomes.add_metric([group, outcome.value], float(n))
        yield outcomes
        events = CounterMetricFamily(
            PREFIX + "guard_events",
            "Idempotency guard decisions, summed over the guards",
            labels=["event"],
        )
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


def handler_guards(handlers: Iterable[Handler]) -> Callable[[], list[object]]:
    """The guards of `@handler` objects (idempotent= and mark_dead_letters=), looked up at
    each scrape (a default guard is built when its consumer starts)."""
    handlers = list(handlers)

    def guards() -> list[object]:
        out: list[object] = []
        for h in handlers:
            out.extend(
                g for g in (getattr(h, "guard", None), getattr(h, "marker", None)) if g is not None
            )
        return out

    return guards


def register_client_metrics(
    registry: CollectorRegistry = REGISTRY,
    *,
    guards: Callable[[], Iterable[object]] | Iterable[object] = (),
) -> ClientCollector:
    """Register the client's collector (handlers, and `guards`' events) in `registry`."""
    collector = ClientCollector(guards=guards)
    registry.register(collector)
    return collector


__all__ = [
    "CLIENT_METRICS",
    "GUARD_EVENTS",
    "HANDLER_STATS",
    "ClientCollector",
    "HandlerOutcome",
    "HandlerStats",
    "handler_guards",
    "register_client_metrics",
]
