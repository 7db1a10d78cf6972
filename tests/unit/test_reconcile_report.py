"""The reconciliation summary's queue table names the broker's own topics (a group's
`%RETRY%`, `%DLQ%`, system topics) apart from the application's."""

from __future__ import annotations

from datetime import datetime

from outbox.reconcile.certificate import Certificate, QueueFigures, Summary
from outbox.reconcile.classes import StubClass
from outbox.reconcile.job import ReconcileResult
from outbox.reconcile.report import as_text


def _result(queues: list[QueueFigures]) -> ReconcileResult:
    cert = Certificate(
        since=None,
        until=None,
        produced=4,
        confirmed=4,
        confirmed_per_group={},
        duplicated=0,
        in_flight=0,
        backlogged=0,
        dead_lettered=0,
        manual=0,
        void=0,
        unaccounted=0,
        orphan_log_rows=0,
        stale_log_rows=0,
        digests={},
    )
    summary = Summary(
        stubs={},
        log_rows={},
        queues=queues,
        oldest_unaccounted=None,
        certificate=cert,
    )
    return ReconcileResult("r1", "jdbc", datetime(2026, 11, 24), summary, 1.0)


def test_the_brokers_topics_are_named_apart_after_the_applications() -> None:
    confirmed = {StubClass.CONFIRMED.value: 1}
    queues = [
        QueueFigures("%RETRY%billing", 0, confirmed, lag={"billing": _lag()}),
        QueueFigures("orders", 0, confirmed, lag={"billing": _lag()}),
        QueueFigures("%DLQ%billing", 0, confirmed),
        QueueFigures("SCHEDULE_TOPIC_XXXX", 2, confirmed),
        QueueFigures("payments", 1, confirmed),
    ]
    lines = as_text(_result(queues)).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("topic "))
    table = [line.split()[0] for line in lines[start + 1 : start + 9]]
    assert table == [
        "orders",
        "payments",
        "(retry",
        "%RETRY%billing",
        "(dead-letter",
        "%DLQ%billing",
        "(system",
        "SCHEDULE_TOPIC_XXXX",
    ]
    assert "  (retry topic: the broker's, not the application's)" in lines
    lag = [line.split()[0] for line in lines if line.startswith(("orders", "%RETRY%"))]
    assert lag[-2:] == ["orders", "%RETRY%billing"]  # the lag table in the same order


def test_a_table_of_the_applications_topics_alone_has_no_note() -> None:
    text = as_text(_result([QueueFigures("orders", 0, {StubClass.CONFIRMED.value: 2})]))
    assert "the broker's" not in text


def _lag() -> dict[str, object]:
    return {"watermark": 1, "lag": 0, "source": "broker"}
