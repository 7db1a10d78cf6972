"""Where the tables come from: JDBC (partitioned reads) or Parquet exports.

Every source yields the same canonical DataFrames (the columns below, with these types),
so classification never knows where its rows came from. Only the columns the job needs
are read (message bodies never leave the database).

Partitioned JDBC reads: each table is split on one column into ranges read in parallel,
`numPartitions = clamp(ceil(rows / rows_per_partition), 1, max_partitions)`, with bounds
from `SELECT MIN(col), MAX(col), COUNT(*)` on the table:

    stub             id (integer primary key)
    consumption log  queue_offset
    confirmation     confirmed_at (timestamp); on SQLite its rowid
    topic_group      one partition (a handful of rows)

Rows counted already (`JdbcSource.known_rows`: a small input, counted before the run) need
no bounds query when they make one partition: the table is read whole.

Parquet layout (one directory per table, the column names of `outbox.models`):
`<root>/message_stub/`, `<root>/confirmation/`, `<root>/consumption_log/`, and optionally
`<root>/topic_group/` and `<root>/consumer_offset/`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from outbox.reconcile.drivers import JdbcTarget
from outbox.reconcile.errors import SourceUnavailable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# canonical columns: name -> Spark SQL type; the first ones of each table are required
STUB_COLUMNS: dict[str, str] = {
    "id": "bigint",
    "message_id": "string",
    "topic": "string",
    "status": "string",
    "created_at": "timestamp_ntz",
    "expected_groups": "string",
    "send_count": "int",
    "max_sends": "int",
    "queue_id": "int",
    "queue_offset": "bigint",
    "next_resend_at": "timestamp_ntz",
    "escalated_at": "timestamp_ntz",
    "group_positions": "string",
    "last_error": "string",
}
STUB_REQUIRED = ("message_id", "topic", "status", "created_at")
CONFIRMATION_COLUMNS: dict[str, str] = {
    "message_id": "string",
    "consumer_group": "string",
    "confirmed_at": "timestamp_ntz",
}
CONFIRMATION_REQUIRED = ("message_id", "consumer_group")
LOG_COLUMNS: dict[str, str] = {
    "message_id": "string",
    "consumer_group": "string",
    "topic": "string",
    "queue_id": "int",
    "queue_offset": "bigint",
    "created_at": "timestamp_ntz",
    "dead_lettered_at": "timestamp_ntz",
}
LOG_REQUIRED = ("message_id", "consumer_group", "topic", "queue_id", "queue_offset")
TOPIC_GROUP_COLUMNS: dict[str, str] = {"topic": "string", "consumer_group": "string"}
OFFSET_COLUMNS: dict[str, str] = {
    "topic": "string",
    "consumer_group": "string",
    "queue_id": "int",
    "committed_offset": "bigint",
}
BOUNDS_COLUMNS: dict[str, str] = {
    "topic": "string",
    "queue_id": "int",
    "max_offset": "bigint",
    "min_offset": "bigint",
}
# the repair audit (`repair.audit_table`): what earlier repairs changed, read back as
# evidence (a deleted log row's offset still counts for the watermark; a stub marked due
# stays unaccounted until it is confirmed)
AUDIT_COLUMNS: dict[str, str] = {
    "action": "string",
    "message_id": "string",
    "consumer_group": "string",
    "before": "string",
}

TABLES: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    "stub": (STUB_COLUMNS, STUB_REQUIRED),
    "confirmation": (CONFIRMATION_COLUMNS, CONFIRMATION_REQUIRED),
    "log": (LOG_COLUMNS, LOG_REQUIRED),
    "topic_group": (TOPIC_GROUP_COLUMNS, ("topic", "consumer_group")),
    "offsets": (OFFSET_COLUMNS, tuple(OFFSET_COLUMNS)),
    "bounds": (BOUNDS_COLUMNS, ("topic", "queue_id", "max_offset")),
    "audit": (AUDIT_COLUMNS, ("action", "message_id")),
}
_TIMESTAMP = "timestamp_ntz"


@dataclass(frozen=True)
class TableNames:
    """Physical table names (from `OutboxTables(prefix, schema)`)."""

    stub: str = "reliable_message_stub"
    confirmation: str = "reliable_confirmation"
    log: str = "reliable_consumption_log"
    topic_group: str = "reliable_topic_group"
    schema: str | None = None
    audit: str = "reliable_reconcile_audit"

    @classmethod
    def for_prefix(cls, prefix: str = "reliable_", schema: str | None = None) -> TableNames:
        return cls(
            f"{prefix}message_stub",
            f"{prefix}confirmation",
            f"{prefix}consumption_log",
            f"{prefix}topic_group",
            schema,
            f"{prefix}reconcile_audit",
        )

    def physical(self, logical: str) -> str:
        return str(getattr(self, logical))


@dataclass(frozen=True)
class PartitionPolicy:
    """How JDBC reads are split; `None` fields are computed from the table."""

    rows_per_partition: int = 250_000
    max_partitions: int = 64
    num_partitions: int | None = None  # force this many for every partitioned table
    columns: dict[str, str] = field(default_factory=dict)  # logical table -> column
    fetch_size: int = 10_000

    def count_for(self, rows: int) -> int:
        if self.num_partitions is not None:
            return max(1, self.num_partitions)
        return max(1, min(self.max_partitions, math.ceil(rows / self.rows_per_partition)))


class TableSource(Protocol):
    """Yields the canonical DataFrame of a logical table."""

    def read(self, spark: SparkSession, logical: str) -> DataFrame | None:
        """The table, or None when an optional table (topic_group, offsets) is absent."""

    def describe(self) -> str: ...


def canonical(df: DataFrame, logical: str, what: str) -> DataFrame:
    """Select the canonical columns with their types; optional ones missing become NULL."""
    from pyspark.sql import functions as F

    columns, required = TABLES[logical]
    present = {c.lower(): c for c in df.columns}
    missing = [c for c in required if c not in present]
    if missing:
        raise SourceUnavailable(what, f"required column(s) missing: {', '.join(missing)}")
    out = []
    for name, sql_type in columns.items():
        if name in present:
            out.append(F.col(present[name]).cast(sql_type).alias(name))
        else:
            out.append(F.lit(None).cast(sql_type).alias(name))
    return df.select(*out)


@dataclass
class JdbcSource:
    """Partitioned reads of the outbox tables over JDBC."""

    target: JdbcTarget
    names: TableNames = field(default_factory=TableNames)
    policy: PartitionPolicy = field(default_factory=PartitionPolicy)
    offsets_table: str | None = None  # optional committed-offset snapshot table
    bounds_table: str | None = None  # optional queue-bounds table (see `bounds`)
    plans: dict[str, tuple[str | None, int, int]] = field(default_factory=dict)
    # rows already counted (a small input, counted before the run): a table that is read
    # in one partition anyway needs no bounds query (one Spark job less per table)
    known_rows: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        return self.target.redacted()

    def _qualified(self, table: str) -> str:
        quote = "`" if self.target.dialect == "mysql" else '"'
        name = f"{quote}{table}{quote}"
        if self.names.schema:
            name = f"{quote}{self.names.schema}{quote}.{name}"
        return name

    def _reader(self, spark: SparkSession, custom_schema: str | None = None):  # type: ignore[no-untyped-def]
        reader = spark.read.format("jdbc").option("url", self.target.url)
        for key, value in self.target.properties.items():
            reader = reader.option(key, value)
        reader = reader.option("fetchsize", str(self.policy.fetch_size))
        if self.target.dialect == "sqlite":
            if custom_schema:
                reader = reader.option("customSchema", custom_schema)
        else:
            reader = reader.option("preferTimestampNTZ", "true")
        return reader

    def _probe(self, spark: SparkSession, dbtable: str, what: str) -> DataFrame:
        try:
            df: DataFrame = self._reader(spark).option("dbtable", dbtable).load()
        except Exception as exc:
            raise SourceUnavailable(what, _first_line(exc)) from None
        return df

    def _sqlite_schema(self, columns: list[str], logical: str) -> str:
        """SQLite's driver reports declared types loosely: read numbers as numbers and
        timestamps as text (parsed by Spark), by name."""
        types, _ = TABLES[logical]
        wanted = {**types, "_rowid": "bigint", "lo": "bigint", "hi": "bigint", "n": "bigint"}
        parts = []
        for col in columns:
            spark_type = wanted.get(col.lower())
            if spark_type is None:
                continue
            parts.append(f"{col} {'string' if spark_type == _TIMESTAMP else spark_type}")
        return ", ".join(parts)

    def read(self, spark: SparkSession, logical: str) -> DataFrame | None:
        if logical == "offsets":
            if self.offsets_table is None:
                return None
            table = self.offsets_table
        elif logical == "bounds":
            if self.bounds_table is None:
                return None
            table = self.bounds_table
        else:
            table = self.names.physical(logical)
        what = f"table {table} ({self.describe()})"
        dbtable = self._qualified(table)
        try:
            probe = self._probe(spark, dbtable, what)
        except SourceUnavailable:
            if logical in ("topic_group", "audit"):  # never created: no rows
                return None
            raise
        columns = list(probe.columns)
        part_col = self.policy.columns.get(logical) or self._default_partition(logical)
        if part_col == "_rowid":
            cols = ", ".join(f'"{c}"' for c in columns)
            dbtable = f"(SELECT rowid AS _rowid, {cols} FROM {dbtable}) AS src"
            columns = ["_rowid", *columns]
        custom = self._sqlite_schema(columns, logical) if self.target.dialect == "sqlite" else None
        reader = self._reader(spark, custom).option("dbtable", dbtable)
        partitioned = False
        if part_col is None or not (part_col in columns or part_col == "_rowid"):
            self.plans[logical] = (None, 1, -1)
        elif (known := self.known_rows.get(logical)) is not None and (
            self.policy.count_for(known) == 1
        ):
            self.plans[logical] = (part_col, 1, known)
        else:
            partitioned = True
            lo, hi, rows = self._bounds(spark, dbtable, part_col, logical, what)
            parts = self.policy.count_for(rows)
            self.plans[logical] = (part_col, parts, rows)
            if lo is not None and hi is not None and parts > 1:
                reader = (
                    reader.option("partitionColumn", part_col)
                    .option("lowerBound", str(lo))
                    .option("upperBound", str(hi))
                    .option("numPartitions", str(parts))
                )
        if custom is None and not partitioned and dbtable == self._qualified(table):
            df = probe  # the same read as the probe's: no second schema query
        else:
            try:
                df = reader.load()
            except Exception as exc:
                raise SourceUnavailable(what, _first_line(exc)) from None
        if self.target.dialect == "sqlite":
            df = _parse_sqlite_timestamps(df, logical)
        return canonical(df, logical, what)

    def _default_partition(self, logical: str) -> str | None:
        if logical == "stub":
            return "id"
        if logical == "log":
            return "queue_offset"
        if logical == "confirmation":
            return "_rowid" if self.target.dialect == "sqlite" else "confirmed_at"
        return None

    def _bounds(
        self, spark: SparkSession, dbtable: str, column: str, logical: str, what: str
    ) -> tuple[object, object, int]:
        query = f"SELECT MIN({column}) AS lo, MAX({column}) AS hi, COUNT(*) AS n FROM {dbtable}"
        custom = "lo BIGINT, hi BIGINT, n BIGINT"
        if self.target.dialect == "sqlite" and column not in ("id", "_rowid", "queue_offset"):
            custom = "lo STRING, hi STRING, n BIGINT"
        try:
            row = self._reader(spark, custom).option("query", query).load().collect()[0]
        except Exception as exc:
            raise SourceUnavailable(what, _first_line(exc)) from None
        return row["lo"], row["hi"], int(row["n"] or 0)


def _parse_sqlite_timestamps(df: DataFrame, logical: str) -> DataFrame:
    from pyspark.sql import functions as F

    types, _ = TABLES[logical]
    for name, sql_type in types.items():
        if sql_type == _TIMESTAMP and name in df.columns:
            df = df.withColumn(name, F.col(name).cast("timestamp_ntz"))
    return df


@dataclass
class ParquetSource:
    """Tables exported to Parquet, one directory per table under `root`."""

    root: str
    directories: dict[str, str] = field(
        default_factory=lambda: {
            "stub": "message_stub",
            "confirmation": "confirmation",
            "log": "consumption_log",
            "topic_group": "topic_group",
            "offsets": "consumer_offset",
            "bounds": "queue_bounds",
            "audit": "reconcile_audit",
        }
    )

    def describe(self) -> str:
        return f"parquet:{self.root}"

    def read(self, spark: SparkSession, logical: str) -> DataFrame | None:
        path = f"{self.root.rstrip('/')}/{self.directories[logical]}"
        local = "://" not in path
        if local and not Path(path).exists():
            if logical in ("topic_group", "offsets", "audit"):
                return None
            raise SourceUnavailable(f"parquet table {path}", "no such directory")
        try:
            df = spark.read.parquet(path)
        except Exception as exc:
            if logical in ("topic_group", "offsets", "audit") and not local:
                return None
            raise SourceUnavailable(f"parquet table {path}", _first_line(exc)) from None
        return canonical(df, logical, f"parquet table {path}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    for line in text:
        if "Exception" in line or "Error" in line:
            return line.strip()[:500]
    return (text[0] if text else type(exc).__name__)[:500]
