"""Queue bounds: which offsets the broker still holds, per topic and queue.

A stub records where its copy landed (topic, queue, offset). Committed offsets say whether
a group has *passed* that offset; they cannot say that the copy is *gone*: after a crash
under async flush the tail of the commitlog is lost, the queue's end moves back, and a stub
at or beyond the queue's current end (max offset, one past the last message held) waits for
a message that will never be delivered. The resend worker already treats such a stub as due
(`QueueBounds.max_offset <= offset`, `outbox.ports`); the bounds give the reconciliation the
same knowledge. A copy below the queue's min offset (its files were cleaned before the group
got there) is gone as well.

Where the bounds come from (`ReconcileOptions.queue_bounds`, `--queue-bounds SPEC`):

    a JSON file           {"orders": {"0": 42, "1": {"max": 17, "min": 3}}}
                          or [{"topic": "orders", "queue_id": 0, "max_offset": 42,
                               "min_offset": 0}, ...]
    a Parquet directory   columns topic, queue_id, max_offset [, min_offset]
    table:NAME            the same columns, a table of the --db database (with --parquet:
                          the directory <root>/NAME)
    grpc:HOST:PORT        asked live of a broker's gRPC server (CLI and Python API)
    a transport object    (Python API) `reliable.transport.connect(...)`, started: asked live
    a QueueBounds object  (Python API) anything with `max_offset(topic, queue_id)`, such as
                          `outbox.adapters.TransportOffsets`
    a mapping             (Python API) {(topic, queue_id): max_offset}

A live broker is asked only about the queues that open stubs (and their retry-topic copies)
name: a handful of rows, gathered by one small aggregation.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from outbox.reconcile.errors import InvalidBounds, InvalidOptions, SourceUnavailable
from outbox.reconcile.sources import BOUNDS_COLUMNS, _first_line, canonical

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from outbox.reconcile.sources import TableSource
    from reliable.transport.base import QueueRef

BOUNDS_REQUIRED = ("topic", "queue_id", "max_offset")
Bound = tuple[str, int, int, int | None]  # topic, queue_id, max_offset, min_offset


@runtime_checkable
class QueueBoundsLike(Protocol):
    """The broker's max offset of a queue (one past the last message), or None if unknown
    (the same shape as `outbox.ports.QueueBounds`)."""

    def max_offset(self, topic: str, queue_id: int) -> int | None: ...


BoundsSpec = str | QueueBoundsLike | Mapping[tuple[str, int], int] | Any


def check_spec(spec: object) -> None:
    """Reject a spec that cannot name bounds (bad options, exit 2), before any work."""
    if spec is None or not isinstance(spec, str):
        return
    if not spec.strip():
        raise InvalidOptions("--queue-bounds: empty spec")
    if spec.startswith("table:") and not spec.removeprefix("table:").strip():
        raise InvalidOptions("--queue-bounds table:NAME needs a table name")
    if spec.startswith("grpc:"):
        endpoint = spec.removeprefix("grpc:").strip()
        host, sep, port = endpoint.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise InvalidOptions(f"--queue-bounds {spec!r}: expected grpc:HOST:PORT")


def _bound_row(topic: object, qid: object, high: object, low: object, where: str) -> Bound:
    try:
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"bad topic {topic!r}")
        if isinstance(qid, bool) or isinstance(high, bool) or isinstance(low, bool):
            raise ValueError("a queue id or offset cannot be a boolean")
        queue_id = int(str(qid))
        max_offset = int(str(high))
        min_offset = None if low is None else int(str(low))
    except (TypeError, ValueError) as exc:
        raise InvalidBounds(where, f"{topic!r} queue {qid!r}: {exc}") from None
    if (
        queue_id < 0
        or max_offset < 0
        or (min_offset is not None and not 0 <= min_offset <= max_offset)
    ):
        raise InvalidBounds(
            where,
            f"{topic} queue {queue_id}: offsets must satisfy "
            f"0 <= min ({min_offset}) <= max ({max_offset})",
        )
    return topic, queue_id, max_offset, min_offset


def parse_json(text: str, where: str) -> list[Bound]:
    """Bounds from a JSON document (the two shapes of the module docstring)."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise InvalidBounds(where, f"not JSON: {exc}") from None
    rows: list[Bound] = []
    if isinstance(doc, list):
        for item in doc:
            if not isinstance(item, dict):
                raise InvalidBounds(where, f"expected an object per queue, got {item!r}")
            missing = [k for k in BOUNDS_REQUIRED if k not in item]
            if missing:
                raise InvalidBounds(where, f"{item!r} lacks {', '.join(missing)}")
            rows.append(
                _bound_row(
                    item["topic"],
                    item["queue_id"],
                    item["max_offset"],
                    item.get("min_offset"),
                    where,
                )
            )
        return rows
    if not isinstance(doc, dict):
        raise InvalidBounds(where, "expected {topic: {queue_id: max_offset}} or a list")
    for topic, queues in doc.items():
        if not isinstance(queues, dict):
            raise InvalidBounds(where, f"topic {topic!r}: expected {{queue_id: max_offset}}")
        for qid, value in queues.items():
            if isinstance(value, dict):
                if "max" not in value:
                    raise InvalidBounds(where, f'{topic} queue {qid}: no "max"')
                rows.append(_bound_row(topic, qid, value["max"], value.get("min"), where))
            else:
                rows.append(_bound_row(topic, qid, value, None, where))
    return rows


def frame(spark: SparkSession, rows: list[Bound]) -> DataFrame:
    schema = ", ".join(f"{k} {v}" for k, v in BOUNDS_COLUMNS.items())
    return spark.createDataFrame(rows, schema)


def open_queues(stub: DataFrame) -> DataFrame:
    """(topic, queue_id) of every copy an open stub points at: its own position and the
    retry-topic copies of `group_positions`. Small: one row per queue."""
    from pyspark.sql import functions as F

    open_ = stub.where(~F.upper(F.coalesce("status", F.lit(""))).isin("CONFIRMED", "VOID"))
    own = open_.where(F.col("queue_id") >= 0).select("topic", "queue_id")
    pos = (
        open_.where(F.col("group_positions").isNotNull())
        .select(
            F.explode(
                F.map_values(F.from_json("group_positions", "map<string,array<string>>"))
            ).alias("p")
        )
        .select(F.col("p")[0].alias("topic"), F.col("p")[1].cast("int").alias("queue_id"))
        .where(F.col("topic").isNotNull() & (F.col("queue_id") >= 0))
    )
    return own.unionByName(pos).distinct()


def ask_live(live: Any, queues: Iterable[tuple[str, int]], where: str) -> list[Bound]:
    """Ask a transport (route + max_offset/min_offset per QueueRef) or a QueueBounds object
    (max_offset(topic, queue_id)) for each queue. A queue it cannot answer for has no bound;
    if it answers for none of them, the broker is unavailable."""
    rows: list[Bound] = []
    wanted = sorted(set(queues))
    failures: list[str] = []
    is_transport = callable(getattr(live, "route", None))
    routes: dict[str, dict[int, QueueRef]] = {}
    for topic, queue_id in wanted:
        try:
            if is_transport:
                if topic not in routes:
                    routes[topic] = {q.queue_id: q for q in live.route(topic).read_queues}
                ref = routes[topic].get(queue_id)
                if ref is None:
                    continue
                high: int | None = int(live.max_offset(ref))
                low = (
                    int(live.min_offset(ref))
                    if callable(getattr(live, "min_offset", None))
                    else None
                )
            else:
                high = live.max_offset(topic, queue_id)
                low = None
        except Exception as exc:  # unknown topic, or the broker is unreachable
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            failures.append(f"{topic}/{queue_id}: {first[:200]}")
            continue
        if high is None or high < 0:
            continue
        if low is not None and not 0 <= low <= high:
            low = None
        rows.append((topic, queue_id, high, low))
    if wanted and failures and not rows:
        raise SourceUnavailable(f"queue bounds from {where}", "; ".join(failures[:3]))
    return rows


def read_bounds(
    spark: SparkSession, spec: BoundsSpec | None, source: TableSource, stub: DataFrame
) -> DataFrame | None:
    """The bounds as a DataFrame (topic, queue_id, max_offset, min_offset), or None."""
    if spec is None:
        return None
    if isinstance(spec, Mapping):
        rows = [
            _bound_row(t, q, high, None, "queue bounds mapping") for (t, q), high in spec.items()
        ]
        return frame(spark, rows)
    if not isinstance(spec, str):
        if not (callable(getattr(spec, "max_offset", None))):
            raise InvalidOptions(
                "queue_bounds: expected a spec string, a mapping, a "
                "transport or an object with max_offset(topic, queue_id)"
            )
        queues = [(r["topic"], int(r["queue_id"])) for r in open_queues(stub).collect()]
        return frame(spark, ask_live(spec, queues, type(spec).__name__))
    check_spec(spec)
    if spec.startswith("grpc:"):
        return _from_grpc(spark, spec, stub)
    if spec.startswith("table:"):
        root = getattr(source, "root", None)
        if root is None:  # a database source: read the table through it
            return source.read(spark, "bounds")
        spec = f"{str(root).rstrip('/')}/{spec.removeprefix('table:')}"
    where = f"queue bounds {spec}"
    if spec.endswith(".json"):
        try:
            text = Path(spec).read_text(encoding="utf-8")
        except OSError as exc:
            raise SourceUnavailable(where, str(exc)) from None
        return frame(spark, parse_json(text, where))
    if "://" not in spec and not Path(spec).exists():
        raise SourceUnavailable(where, "no such file or directory")
    try:
        df = spark.read.parquet(spec)
    except Exception as exc:
        raise SourceUnavailable(where, _first_line(exc)) from None
    return canonical(df, "bounds", where)


def _from_grpc(spark: SparkSession, spec: str, stub: DataFrame) -> DataFrame:
    from reliable.transport import connect

    endpoint = spec.removeprefix("grpc:").strip()
    queues = [(r["topic"], int(r["queue_id"])) for r in open_queues(stub).collect()]
    transport = connect("grpc", endpoint=endpoint)
    try:
        transport.start()
        rows = ask_live(transport, queues, f"the broker at {endpoint}")
    finally:
        transport.close()
    return frame(spark, rows)
