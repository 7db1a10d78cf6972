"""Prometheus metrics of the outbox: backlog, the oldest unconfirmed stub, the resend worker.

    registry.register(OutboxCollector(engine, tables, worker=worker))

At scrape time one query per family reads the stub table (`count(*)` by status, `min
(created_at)` of the UNCONFIRMED ones); the worker's counters are its own `metrics`
(`outbox.worker.Metrics`), read, not counted again. A database that does not answer makes
the scrape report `reliable_outbox_up 0` and no backlog, instead of failing the scrape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import datetime

import sqlalchemy as sa
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.engine import Engine

from outbox.models import OutboxTables, StubStatus
from outbox.ports import utcnow
from outbox.worker import ResendWorker

log = logging.getLogger(__name__)

PREFIX = "reliable_outbox_"

#: every family this module exports, with its type (the dashboard test checks against it)
OUTBOX_METRICS: dict[str, str] = {
    "reliable_outbox_up": "gauge",
    "reliable_outbox_stubs": "gauge",
    "reliable_outbox_oldest_unconfirmed_age_seconds": "gauge",
    "reliable_outbox_resend_passes_total": "counter",
    "reliable_outbox_resend_stubs_selected_total": "counter",
    "reliable_outbox_resends_total": "counter",
    "reliable_outbox_escalations_total": "counter",
    "reliable_outbox_resend_refused_total": "counter",
    "reliable_outbox_resend_confirmed_total": "counter",
    "reliable_outbox_resend_backlogged_total": "counter",
    "reliable_outbox_resend_errors_total": "counter",
    "reliable_outbox_group_resends_total": "counter",
    "reliable_outbox_resend_topic_fallbacks_total": "counter",
}

# outbox.worker.Metrics field -> (family name without prefix and _total, help)
_WORKER_COUNTERS = {
    "passes": ("resend_passes", "Passes the resend worker ran"),
    "selected": ("resend_stubs_selected", "Stubs the resend worker claimed and examined"),
    "resent": ("resends", "Messages the resend worker sent again"),
    "escalated": ("escalations", "Stubs escalated (max sends reached, or refused)"),
    "refused": ("resend_refused", "Resends the broker refused (escalated at once)"),
    "confirmed": ("resend_confirmed", "Stubs the worker found confirmed by every group"),
    "backlogged": (
        "resend_backlogged",
        "Stubs not yet due (their group is behind them): left for later",
    ),
    "errors": ("resend_errors", "Stubs or passes that failed with an error"),
    "group_resends": ("group_resends", "Copies resent to one consumer group alone"),
    "topic_fallbacks": (
        "resend_topic_fallbacks",
        "Stubs resent to the whole topic: the broker does not accept per-group resends",
    ),
}


class OutboxCollector(Collector):
    """The outbox's backlog from its tables, and a resend worker's counters if given."""

    def __init__(
        self,
        engine: Engine,
        tables: OutboxTables,
        *,
        worker: ResendWorker | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._engine = engine
        self._tables = tables
        self._worker = worker
        self._clock = clock

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(PREFIX + "up", "1 when the outbox database answered this scrape")
        try:
            counts, oldest = self._read()
        except sa.exc.SQLAlchemyError as exc:
            log.debug("outbox metrics: database unavailable: %s", exc)
            up.add_metric([], 0.0)
            yield up
        else:
            up.add_metric([], 1.0)
            yield up
            stubs = GaugeMetricFamily(PREFIX + "stubs", "Outbox stubs by status", labels=["status"])
            for status in StubStatus:
                stubs.add_metric([status.value.lower()], float(counts.get(status.value, 0)))
            yield stubs
            age = GaugeMetricFamily(
                PREFIX + "oldest_unconfirmed_age_seconds",
                "Age of the oldest UNCONFIRMED stub (0 when there is none)",
            )
            age.add_metric(
                [],
                max(0.0, (self._clock() - oldest).total_seconds()) if oldest is not None else 0.0,
            )
            yield age
        if self._worker is not None:
            values = self._worker.metrics.as_dict()
            for field, (name, doc) in _WORKER_COUNTERS.items():
                family = CounterMetricFamily(PREFIX + name, doc)
                family.add_metric([], float(values.get(field, 0)))
                yield family

    def _read(self) -> tuple[dict[str, int], datetime | None]:
        stub = self._tables.stub
        with self._engine.connect() as conn:
            counts = {
                row[0]: int(row[1])
                for row in conn.execute(
                    sa.select(stub.c.status, sa.func.count()).group_by(stub.c.status)
                )
            }
            oldest = conn.execute(
                sa.select(sa.func.min(stub.c.created_at)).where(
                    stub.c.status == StubStatus.UNCONFIRMED.value
                )
            ).scalar()
        return counts, oldest


__all__ = ["OUTBOX_METRICS", "OutboxCollector"]
