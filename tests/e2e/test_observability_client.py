"""The client's metrics and spans in-process: guard events read from a real guard (Redis
and a database), handler outcomes, the spans of send, receive and process, the JSON log
formatter and the HTTP endpoint's answers."""

from __future__ import annotations

import io
import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from idempotency import IdempotencyGuard
from idempotency.guard import EventKind
from outbox.models import OutboxTables
from reliable import (
    Message,
    Producer,
    ReceivedMessage,
    RetryLater,
    Transport,
    Worker,
    handler,
    new_message_id,
)
from reliable.endpoint import serve_metrics
from reliable.logs import JsonFormatter
from reliable.metrics import ClientCollector, handler_guards
from tests.e2e.grpc.scrape import Samples, probe, scrape
from tests.e2e.helpers import FAST, stays, wait_until

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    """The SDK's in-memory exporter behind the global tracer provider (settable once)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(provider)
    yield _EXPORTER
    _EXPORTER.clear()


def _samples(collector: ClientCollector) -> Samples:
    registry = CollectorRegistry()
    registry.register(collector)
    endpoint = serve_metrics(0, registry=registry)
    try:
        return scrape(endpoint.url)
    finally:
        endpoint.stop()


@pytest.mark.redis
def test_guard_events_are_the_guards_own_counts(
    transport: Transport, redis_client: Any, sqlite_url: str, table_prefix: str
) -> None:
    engine = sa.create_engine(sqlite_url)
    tables = OutboxTables(prefix=table_prefix)
    tables.create_all(engine)
    guard = IdempotencyGuard(engine, tables, redis_client, config=None)
    ran: list[str] = []
    group = f"obs-guard-{table_prefix[:-1]}"

    @handler("obs-pay", group=group, idempotent=guard, **FAST)
    def pay(message: ReceivedMessage) -> None:
        ran.append(message.message_id)

    mid = new_message_id()
    with Worker(pay, transport=transport), Producer(transport) as producer:
        producer.send(Message("obs-pay", b"pay 10", message_id=mid))
        producer.send(Message("obs-pay", b"pay 10", message_id=mid))  # a producer retry
        wait_until(lambda: len(ran) == 1)
        assert stays(lambda: len(ran) == 1, 1.0)
        # the second delivery may arrive while the first runs (in_progress, retried later)
        # or after it: either way it ends as a duplicate
        wait_until(lambda: guard.stats[EventKind.DUPLICATE] == 1, what=str(guard.stats.counts))
    counts = {kind.value: n for kind, n in guard.stats.counts.items()}
    s = _samples(ClientCollector(guards=handler_guards([pay])))
    assert s.value("reliable_guard_events_total", event="processed") == 1
    assert s.value("reliable_guard_events_total", event="duplicate") == 1
    for event in ("in_progress", "fenced", "redis_unavailable", "db_unavailable"):
        assert s.value("reliable_guard_events_total", event=event) == counts.get(event, 0)
    in_progress = counts.get("in_progress", 0)
    assert s.value("reliable_handler_messages_total", group=group, outcome="success") == 2
    assert s.value("reliable_handler_messages_total", group=group, outcome="retry") == in_progress


def test_spans_of_send_receive_and_process(
    transport: Transport, spans: InMemorySpanExporter
) -> None:
    topic, group = "obs-traced", "obs-traced-g"
    tries: list[int] = []

    @handler(topic, group=group, **FAST)
    def traced(message: ReceivedMessage) -> None:
        tries.append(message.delivery_attempt)
        if len(tries) == 1:
            raise RetryLater("not yet", delay_level=1)

    mid = new_message_id()
    spans.clear()
    with Worker(traced, transport=transport), Producer(transport) as producer:
        producer.send(Message(topic, b"traced", message_id=mid))
        wait_until(lambda: len(tries) == 2, what="the retry")
    finished = spans.get_finished_spans()
    by_name: dict[str, list[Any]] = {}
    for s in finished:
        by_name.setdefault(s.name, []).append(s)
    [send] = by_name[f"{topic} send"]
    assert send.kind is trace.SpanKind.PRODUCER
    assert send.attributes["messaging.message.id"] == mid
    assert send.attributes["messaging.destination.name"] == topic
    processed = by_name[f"{topic} process"]
    assert [p.attributes["reliable.outcome"] for p in processed] == ["retry", "success"]
    for p in processed:
        assert p.attributes["messaging.message.id"] == mid
        assert p.attributes["messaging.consumer.group.name"] == group
    received = [s for name, ss in by_name.items() if name.endswith(" receive") for s in ss]
    assert received and all(
        s.attributes["messaging.consumer.group.name"] == group for s in received
    )
    assert any(s.attributes.get("messaging.message.id") == mid for s in received)
    s = _samples(ClientCollector())
    assert s.value("reliable_handler_messages_total", group=group, outcome="retry") == 1
    assert s.value("reliable_handler_messages_total", group=group, outcome="success") == 1
    assert s.value("reliable_handler_duration_seconds_count", group=group) == 2


def test_json_log_lines_carry_extra_fields_and_exceptions() -> None:
    stream = io.StringIO()
    h = logging.StreamHandler(stream)
    h.setFormatter(JsonFormatter())
    logger = logging.getLogger("obs.test")
    logger.addHandler(h)
    logger.propagate = False
    try:
        logger.warning("send of %s failed", "m-1", extra={"topic": "orders", "attempt": 2})
        try:
            raise ValueError("boom")
        except ValueError:
            logger.error("handler crashed", exc_info=True)
    finally:
        logger.removeHandler(h)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "send of m-1 failed"
    assert (first["level"], first["logger"], first["topic"], first["attempt"]) == (
        "WARNING",
        "obs.test",
        "orders",
        2,
    )
    assert first["time"].endswith("Z") and "exception" not in first
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exception"]


def test_readyz_reports_each_check_and_a_check_that_raises() -> None:
    state = {"db": True}

    def ready() -> dict[str, bool]:
        if state.get("raise"):
            raise RuntimeError("cannot even ask")
        return {"db": state["db"], "always": True}

    endpoint = serve_metrics(0, registry=CollectorRegistry(), ready=ready)
    try:
        assert probe(endpoint.url, "/readyz") == (
            200,
            {"status": "ready", "checks": {"db": {"ok": True}, "always": {"ok": True}}},
        )
        state["db"] = False
        assert probe(endpoint.url, "/readyz") == (
            503,
            {"status": "not ready", "checks": {"db": {"ok": False}, "always": {"ok": True}}},
        )
        state["raise"] = True
        code, body = probe(endpoint.url, "/readyz")
        assert code == 503 and "cannot even ask" in body["checks"]["checks"]["error"]
        assert probe(endpoint.url, "/healthz") == (200, {"status": "alive"})
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(endpoint.url + "/other", timeout=5)
        assert info.value.code == 404
    finally:
        endpoint.stop()
    assert not any(t.name == "metrics-http" for t in threading.enumerate())
