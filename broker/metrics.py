"""Prometheus metrics of a broker, computed when scraped.

    from prometheus_client import CollectorRegistry
    registry = CollectorRegistry()
    registry.register(BrokerCollector(
        broker, send_seconds=server.ctx.send_seconds, busy_turns=server.ctx.busy_turns,
        overload=server.ctx.overload_counts,
    ))

Nothing here runs on a message's path. The broker keeps plain totals (`Broker.delivered`,
`Broker.acked`, the commitlog's `records_put`, the flush service's `stats`, the server's
`send_seconds`, all in `protocol.stats`); `collect()` reads them, and computes lag,
retry and dead-letter depths and disk use from the store's offsets and the file system at
that moment. Every family and its labels is listed in docs/observability.md; labels are
topic, group and queue id only (bounded by the broker's configuration), never a message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from broker.broker import Broker
from protocol.names import dlq_topic, is_dlq_topic, is_retry_topic, retry_topic
from protocol.stats import Histogram

PREFIX = "reliable_broker_"

#: every family this module exports, with its type (the dashboard test checks against it)
BROKER_METRICS: dict[str, str] = {
    "reliable_broker_up": "gauge",
    "reliable_broker_messages_put_total": "counter",
    "reliable_broker_messages_delivered_total": "counter",
    "reliable_broker_messages_acked_total": "counter",
    "reliable_broker_send_duration_seconds": "histogram",
    "reliable_broker_answers_held_total": "counter",
    "reliable_broker_grouped_sends_total": "counter",
    "reliable_broker_send_groups_total": "counter",
    "reliable_broker_refused_sends_total": "counter",
    "reliable_broker_abandoned_calls_total": "counter",
    "reliable_broker_fsync_duration_seconds": "histogram",
    "reliable_broker_fsync_messages": "histogram",
    "reliable_broker_consumer_lag_messages": "gauge",
    "reliable_broker_in_flight_messages": "gauge",
    "reliable_broker_retry_depth_messages": "gauge",
    "reliable_broker_dlq_depth_messages": "gauge",
    "reliable_broker_commitlog_bytes": "gauge",
    "reliable_broker_disk_used_ratio": "gauge",
    "reliable_broker_disk_watermark_ratio": "gauge",
    "reliable_broker_disk_full": "gauge",
}


def histogram_family(name: str, doc: str, histogram: Histogram) -> HistogramMetricFamily:
    snap = histogram.snapshot()
    return HistogramMetricFamily(name, doc, buckets=snap.cumulative(), sum_value=snap.total)


class BrokerCollector(Collector):
    """The broker's metrics; `send_seconds` and `busy_turns` are the gRPC server's (absent
    when embedded): `busy_turns()` gives (answers held, sends stored in a group, groups
    stored) while its loop was busy (`ServerContext.busy_turns`), `overload()` gives (sends
    refused for overload, calls abandoned by their clients; `ServerContext.overload_counts`).
    `broker` may be a callable
    returning the broker, or None while there is none yet (a process whose embedded broker
    starts later): then the scrape has no broker families."""

    def __init__(
        self,
        broker: Broker | Callable[[], Broker | None],
        *,
        send_seconds: Histogram | None = None,
        busy_turns: Callable[[], tuple[int, int, int]] | None = None,
        overload: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self._source = broker
        self._send_seconds = send_seconds
        self._busy_turns = busy_turns
        self._overload = overload

    def describe(self) -> list[Metric]:
        return []  # families are built at collect time; registration must not scrape

    def collect(self) -> Iterator[Metric]:
        b = self._source if isinstance(self._source, Broker) else self._source()
        if b is None:
            return
        store = b.store
        up = GaugeMetricFamily(PREFIX + "up", "1 while the broker is running")
        up.add_metric([], 1.0 if b.running else 0.0)
        yield up
        yield from self._traffic(b)
        if self._send_seconds is not None:
            yield histogram_family(
                PREFIX + "send_duration_seconds",
                "Server-side handling of one SendMessage request, from arrival to answer",
                self._send_seconds,
            )
        if self._busy_turns is not None:
            held, grouped, groups = self._busy_turns()
            for name, doc, value in (
                ("answers_held", "gRPC answers held while the server loop was busy", held),
                ("grouped_sends", "SendMessage calls stored with others as one batch", grouped),
                ("send_groups", "Groups of SendMessage calls stored as one record batch", groups),
            ):
                family = CounterMetricFamily(PREFIX + name, doc)
                family.add_metric([], float(value))
                yield family
        if self._overload is not None:
            refused, abandoned = self._overload()
            for name, doc, value in (
                ("refused_sends", "SendMessage calls refused with TOO_MANY_REQUESTS", refused),
                ("abandoned_calls", "Calls whose client left before their answer", abandoned),
            ):
                family = CounterMetricFamily(PREFIX + name, doc)
                family.add_metric([], float(value))
                yield family
        flush = store.commitlog.flush_service.stats
        yield histogram_family(
            PREFIX + "fsync_duration_seconds", "Duration of one commitlog fsync", flush.seconds
        )
        yield histogram_family(
            PREFIX + "fsync_messages",
            "Messages made durable by one commitlog fsync (group commit)",
            flush.records,
        )
        if b.running:
            yield from self._consumption(b)
        yield from self._disk(b)

    @staticmethod
    def _traffic(b: Broker) -> Iterator[Metric]:
        store = b.store
        put = CounterMetricFamily(
            PREFIX + "messages_put",
            "Messages stored per topic (the end of its queues)",
            labels=["topic"],
        )
        for topic in sorted(store.topics()):
            put.add_metric(
                [topic],
                float(sum(store.get_max_offset_in_queue(topic, q) for q in store.queue_ids(topic))),
            )
        yield put
        for name, doc, counter in (
            ("messages_delivered", "Messages handed to a group (received or pulled)", b.delivered),
            ("messages_acked", "Messages a group acknowledged", b.acked),
        ):
            family = CounterMetricFamily(PREFIX + name, doc, labels=["group", "topic"])
            for (group, topic), n in sorted(counter.snapshot().items()):
                family.add_metric([group, topic], float(n))
            yield family

    @staticmethod
    def _consumption(b: Broker) -> Iterator[Metric]:
        store = b.store
        lag = GaugeMetricFamily(
            PREFIX + "consumer_lag_messages",
            "Messages of a queue the group has not acknowledged yet (queue end - offset)",
            labels=["group", "topic", "queue"],
        )
        in_flight = GaugeMetricFamily(
            PREFIX + "in_flight_messages",
            "Messages received by a group and not yet acked",
            labels=["group", "topic"],
        )
        retry = GaugeMetricFamily(
            PREFIX + "retry_depth_messages",
            "Messages waiting in a group's retry topic",
            labels=["group"],
        )
        dlq = GaugeMetricFamily(
            PREFIX + "dlq_depth_messages",
            "Messages in a group's dead-letter topic",
            labels=["group"],
        )
        for cfg in sorted(b.groups(), key=lambda g: g.group):
            group = cfg.group
            leased: dict[str, int] = {}
            for p in b.consumer_progress(group):  # the topics the group has offsets on
                if is_dlq_topic(p.topic) or is_retry_topic(p.topic):
                    continue
                lag.add_metric([group, p.topic, str(p.queue_id)], float(p.lag))
                leased[p.topic] = leased.get(p.topic, 0) + p.in_flight
            for topic, n in sorted(leased.items()):
                in_flight.add_metric([group, topic], float(n))
            # the retry topic whether or not the group has consumed from it yet: its
            # messages wait from its start until the group has an offset there
            waiting = 0
            name = retry_topic(group)
            for q in store.queue_ids(name):
                committed = b.query_offset(group, name, q)
                start = committed if committed >= 0 else store.get_min_offset_in_queue(name, q)
                waiting += max(0, store.get_max_offset_in_queue(name, q) - start)
            retry.add_metric([group], float(waiting))
            leased_copies = len(b.in_flight(group, name))  # as `group show` counts them
            if leased_copies:
                in_flight.add_metric([group, name], float(leased_copies))
            dead = dlq_topic(group)
            dlq.add_metric(
                [group],
                float(
                    sum(
                        store.get_max_offset_in_queue(dead, q)
                        - store.get_min_offset_in_queue(dead, q)
                        for q in store.queue_ids(dead)
                    )
                ),
            )
        yield lag
        yield in_flight
        yield retry
        yield dlq

    @staticmethod
    def _disk(b: Broker) -> Iterator[Metric]:
        store = b.store
        cfg = store.config
        used = GaugeMetricFamily(
            PREFIX + "commitlog_bytes", "Bytes of commitlog the store holds (max - min offset)"
        )
        used.add_metric(
            [], float(store.get_commitlog_max_offset() - store.get_commitlog_min_offset())
        )
        yield used
        ratio = GaugeMetricFamily(
            PREFIX + "disk_used_ratio",
            "Used fraction of the fullest partition holding the store (0..1)",
        )
        ratio.add_metric([], store.cleanup.measure_disk())
        yield ratio
        marks = GaugeMetricFamily(
            PREFIX + "disk_watermark_ratio",
            "The store's disk watermarks: max_used (age-based cleanup starts), clean "
            "(files go regardless of age), refuse (puts are refused)",
            labels=["watermark"],
        )
        marks.add_metric(["max_used"], cfg.disk_max_used_space_ratio)
        marks.add_metric(["clean"], cfg.disk_clean_watermark)
        marks.add_metric(["refuse"], cfg.disk_refuse_watermark)
        yield marks
        full = GaugeMetricFamily(
            PREFIX + "disk_full", "1 while the store refuses puts (disk above the refuse mark)"
        )
        full.add_metric([], 1.0 if store.is_disk_full() else 0.0)
        yield full


__all__ = ["BROKER_METRICS", "BrokerCollector", "histogram_family"]
