"""The metric names are one list: what the collectors export is what their modules declare
(`BROKER_METRICS`, `HA_METRICS`, `CLIENT_METRICS`, `OUTBOX_METRICS`), what docs/observability.md
documents, and what the Grafana dashboard queries."""

from __future__ import annotations

import json
import re
from pathlib import Path

import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from broker.broker import Broker
from broker.ha.metrics import HA_METRICS
from broker.metrics import BROKER_METRICS, BrokerCollector
from broker.store.config import StoreConfig
from broker.store.message import Message
from outbox.metrics import OUTBOX_METRICS, OutboxCollector
from outbox.models import OutboxTables
from outbox.worker import ResendWorker
from protocol.stats import Histogram
from reliable.metrics import CLIENT_METRICS, ClientCollector

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "reliable.json"
DOC = ROOT / "docs" / "observability.md"
EXPORTED = {**BROKER_METRICS, **HA_METRICS, **CLIENT_METRICS, **OUTBOX_METRICS}
_SUFFIXES = ("_bucket", "_sum", "_count")


def _families(registry: CollectorRegistry) -> dict[str, str]:
    out: dict[str, str] = {}
    for family in registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        out[name] = family.type
    return out


def _family_of(name: str) -> str:
    """`x_bucket` of a histogram `x` is `x`; any other name is itself."""
    for suffix in _SUFFIXES:
        base = name.removesuffix(suffix)
        if base != name and EXPORTED.get(base) == "histogram":
            return base
    return name


def test_collectors_export_exactly_the_declared_families(tmp_path: Path) -> None:
    broker = Broker(StoreConfig(store_dir=tmp_path / "store", mapped_file_size_commitlog=1 << 20))
    broker.start()
    try:
        broker.send_message(Message(topic="names", body=b"x", queue_id=0))
        registry = CollectorRegistry()
        registry.register(
            BrokerCollector(
                broker,
                send_seconds=Histogram(),
                busy_turns=lambda: (0, 0, 0),
                overload=lambda: (0, 0),
            )
        )
        assert _families(registry) == BROKER_METRICS
    finally:
        broker.shutdown()
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'outbox.db'}")
    tables = OutboxTables()
    tables.create_all(engine)

    registry = CollectorRegistry()
    worker = ResendWorker(engine, tables, sender=None)  # type: ignore[arg-type]  # never sends
    registry.register(OutboxCollector(engine, tables, worker=worker))
    assert _families(registry) == OUTBOX_METRICS
    registry = CollectorRegistry()
    registry.register(ClientCollector())
    assert _families(registry) == CLIENT_METRICS


def test_every_dashboard_expression_names_exported_metrics_and_covers_them_all() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    used: set[str] = set()
    for expr in exprs:
        names = set(re.findall(r"\b(reliable_[a-z0-9_]+)\b", expr))
        assert names, expr
        for name in names:
            family = _family_of(name)
            assert family in EXPORTED, f"{name} in {expr!r} is not an exported metric"
            if EXPORTED[family] == "histogram":
                assert name != family, f"{expr!r}: use {family}_bucket/_sum/_count"
            used.add(family)
    assert used == set(EXPORTED), f"not on the dashboard: {sorted(set(EXPORTED) - used)}"


def test_the_documentation_lists_every_metric_with_its_type() -> None:
    text = DOC.read_text()
    for name, kind in EXPORTED.items():
        assert re.search(rf"`{name}`\s*\|\s*{kind}", text), f"{name} ({kind}) undocumented"
