"""Committed offsets asked live of a broker (`--offsets grpc:HOST:PORT`).

A snapshot of committed offsets (`consumerOffset.json`, a table) is read from where the
broker writes it, so the job must run next to the broker's disk. A broker's gRPC endpoint
answers the same question anywhere: GetOffset per (group, topic, queue), which our server
and the Apache RocketMQ 5 proxy both offer. The job asks only about the copies open stubs
point at, for the groups each waits for:

- a stub's own copy (its topic and queue, when known: our server says which queue a send
  went to, see docs/server.md), for each of its expected groups (the stub's
  `expected_groups` and the topic's rows in `topic_group`);
- a group's retry-topic copy (`group_positions`: group -> [topic, queue, offset]).

One small aggregation gathers those (topic, queue, group) triples; a group the broker has
no offset for is left out (no watermark: its copies are judged as without a snapshot).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from outbox.reconcile.errors import InvalidOptions, SourceUnavailable
from outbox.reconcile.sources import OFFSET_COLUMNS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from reliable.transport.base import QueueRef

PREFIX = "grpc:"
Committed = tuple[str, str, int, int]  # topic, consumer_group, queue_id, committed_offset


def endpoint_of(spec: str) -> str:
    """HOST:PORT of a `grpc:HOST:PORT` spec (bad options otherwise)."""
    endpoint = spec.removeprefix(PREFIX).strip()
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidOptions(f"--offsets {spec!r}: expected grpc:HOST:PORT")
    return endpoint


def open_positions(stub: DataFrame, topic_group: DataFrame | None) -> DataFrame:
    """(topic, queue_id, consumer_group) of every copy an open stub points at, per group
    it waits for. Small: one row per queue and group."""
    from pyspark.sql import functions as F

    open_ = stub.where(~F.upper(F.coalesce("status", F.lit(""))).isin("CONFIRMED", "VOID"))
    declared = open_.where(F.col("queue_id") >= 0).select(
        "topic",
        "queue_id",
        F.explode(F.split(F.coalesce("expected_groups", F.lit("")), ",")).alias("g"),
    )
    own = declared.select("topic", "queue_id", F.trim("g").alias("consumer_group"))
    if topic_group is not None:
        queues = open_.where(F.col("queue_id") >= 0).select("topic", "queue_id").distinct()
        own = own.unionByName(queues.join(topic_group.select("topic", "consumer_group"), "topic"))
    pos = (
        open_.where(F.col("group_positions").isNotNull())
        .select(
            F.explode(F.from_json("group_positions", "map<string,array<string>>")).alias(
                "consumer_group", "p"
            )
        )
        .select(
            F.col("p")[0].alias("topic"),
            F.col("p")[1].cast("int").alias("queue_id"),
            "consumer_group",
        )
        .where(F.col("topic").isNotNull() & (F.col("queue_id") >= 0))
    )
    both = own.unionByName(pos)
    return both.where(F.length("consumer_group") > 0).distinct()


def ask_committed(
    transport: Any, wanted: Iterable[tuple[str, int, str]], where: str
) -> list[Committed]:
    """Each (topic, queue, group)'s committed offset from a started transport (route +
    `query_offset(group, queue)`); -1 (none) is left out. A broker that answers for none
    of them while asked about some is unavailable."""
    rows: list[Committed] = []
    failures: list[str] = []
    asked = sorted(set(wanted))
    routes: dict[str, dict[int, QueueRef]] = {}
    for topic, queue_id, group in asked:
        try:
            if topic not in routes:
                routes[topic] = {q.queue_id: q for q in transport.route(topic).read_queues}
            ref = routes[topic].get(queue_id)
            if ref is None:
                continue
            committed = int(transport.query_offset(group, ref))
        except Exception as exc:  # unknown topic or group, or the broker is unreachable
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            failures.append(f"{group}@{topic}/{queue_id}: {first[:200]}")
            continue
        if committed >= 0:
            rows.append((topic, group, queue_id, committed))
    if asked and failures and len(failures) == len(asked):
        raise SourceUnavailable(f"committed offsets from {where}", "; ".join(failures[:3]))
    return rows


def read_live(
    spark: SparkSession, spec: str, stub: DataFrame, topic_group: DataFrame | None
) -> DataFrame:
    """The committed offsets of the copies open stubs point at, asked of `grpc:HOST:PORT`."""
    from reliable.transport import connect

    endpoint = endpoint_of(spec)
    wanted = [
        (r["topic"], int(r["queue_id"]), r["consumer_group"])
        for r in open_positions(stub, topic_group).collect()
    ]
    transport = connect("grpc", endpoint=endpoint)
    try:
        transport.start()
        rows = ask_committed(transport, wanted, f"the broker at {endpoint}")
    finally:
        transport.close()
    schema = ", ".join(f"{k} {v}" for k, v in OFFSET_COLUMNS.items())
    return spark.createDataFrame(rows, schema)
