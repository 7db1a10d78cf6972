"""Prometheus metrics of replication, computed when scraped (docs/observability.md).

    registry.register(ReplicationCollector(node))

Every family is exported whatever the role (empty where it does not apply), so a scrape
has the same names before and after a promotion. `slave` labels are the slaves' broker
ids (bounded by the group's configuration).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from broker.ha.config import HaRole
from broker.ha.master import AckOutcome, HaMaster
from broker.ha.node import HaNode
from protocol.stats import Histogram

PREFIX = "reliable_broker_ha_"

#: every family this module exports, with its type
HA_METRICS: dict[str, str] = {
    "reliable_broker_ha_role": "gauge",
    "reliable_broker_ha_connected": "gauge",
    "reliable_broker_ha_lag_bytes": "gauge",
    "reliable_broker_ha_lag_messages": "gauge",
    "reliable_broker_ha_acked_offset": "gauge",
    "reliable_broker_ha_sync_wait_seconds": "histogram",
    "reliable_broker_ha_sync_waits_total": "counter",
}

_ROLES = tuple(r.value for r in HaRole if r is not HaRole.NONE)


class ReplicationCollector(Collector):
    """The replication families of one broker's `HaNode`."""

    def __init__(self, node: HaNode) -> None:
        self._node = node

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        node = self._node
        rep = node.replication
        status = node.status()
        role = GaugeMetricFamily(
            PREFIX + "role", "1 for the broker's replication role", labels=["role"]
        )
        for name in _ROLES:
            role.add_metric([name], 1.0 if name == status["role"] else 0.0)
        yield role
        connected = GaugeMetricFamily(
            PREFIX + "connected",
            "a master: its connected slaves; a slave: 1 while connected to its master",
        )
        lag_bytes = GaugeMetricFamily(
            PREFIX + "lag_bytes", "bytes of the master's log a slave lacks", labels=["slave"]
        )
        lag_messages = GaugeMetricFamily(
            PREFIX + "lag_messages", "messages of the master's log a slave lacks", labels=["slave"]
        )
        acked = GaugeMetricFamily(
            PREFIX + "acked_offset",
            "a master: the commitlog offset each slave acknowledged",
            labels=["slave"],
        )
        sync_seconds = Histogram()
        outcomes = {o.value: 0 for o in AckOutcome}
        if isinstance(rep, HaMaster):
            slaves = status["slaves"]
            connected.add_metric([], float(len(slaves)))
            for s in slaves:
                label = [str(s["broker_id"])]
                lag_bytes.add_metric(label, float(s["lag_bytes"]))
                lag_messages.add_metric(label, float(s["lag_messages"]))
                acked.add_metric(label, float(s["acked_offset"]))
            sync_seconds = rep.sync_seconds
            outcomes = dict(rep.sync_outcomes)
        else:
            connected.add_metric([], 1.0 if status["connected"] else 0.0)
            label = [str(status["broker_id"])]
            if status["lag_bytes"] is not None:
                lag_bytes.add_metric(label, float(status["lag_bytes"]))
            if status["lag_messages"] is not None:
                lag_messages.add_metric(label, float(status["lag_messages"]))
        yield connected
        yield lag_bytes
        yield lag_messages
        yield acked
        snap = sync_seconds.snapshot()
        yield HistogramMetricFamily(
            PREFIX + "sync_wait_seconds",
            "sync-master: a send's wait for a slave's acknowledgement, by any outcome",
            buckets=snap.cumulative(),
            sum_value=snap.total,
        )
        waits = CounterMetricFamily(
            PREFIX + "sync_waits",
            "sync-master waits for a slave, by outcome (acked, slave-not-available, "
            "flush-slave-timeout)",
            labels=["outcome"],
        )
        for outcome, n in sorted(outcomes.items()):
            waits.add_metric([outcome], float(n))
        yield waits


__all__ = ["HA_METRICS", "ReplicationCollector"]
