"""The job: read, classify, summarise, write the report, repair. The Python API.

    result = reconcile(ReconcileOptions(db_url="postgresql+psycopg2://u@h/db"))
    result.summary.certificate.clean

The result says what the run found; what a clean or unclean window means to a process (its
exit code) is the command line's business, not this layer's.

Spark actions per run: the partition bounds of each table (one tiny query each; none for
a small input, whose rows were counted before the run), the watermarks (per queue and
group), the facts (one aggregation over the classified rows); and only when asked, the
detail rows and the repair candidates (the classified rows are then persisted once, so
the tables are still read once).

A small input (under `SMALL_INPUT_ROWS` rows) is run as one: a JVM the job starts gets
the quick JIT compiler only and a class archive (`classcache`), its tables are read
without bounds queries, and the run plans without adaptive execution or generated code
(see docs/reconcile.md, "A small database")."""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from outbox.latency import ExpectedLatency
from outbox.reconcile import live_offsets
from outbox.reconcile.bounds import BoundsSpec, check_spec, read_bounds
from outbox.reconcile.certificate import Summary, facts, summarize, unaccounted_messages
from outbox.reconcile.classcache import archive_options
from outbox.reconcile.classify import Classified, Inputs, Window, classify
from outbox.reconcile.details import detail_rows, write_parquet, write_table
from outbox.reconcile.drivers import JdbcTarget, driver_jars, installed_system_jars, jdbc_target
from outbox.reconcile.errors import InvalidOptions, JobFailed, SourceUnavailable
from outbox.reconcile.preflight import check_database, check_parquet, count_rows, find_java
from outbox.reconcile.repair import Repairer, RepairOptions, RepairReport, candidates
from outbox.reconcile.session import (
    BorrowedSettings,
    add_to_driver,
    borrowed_settings,
    require_driver,
    spark_errors,
    spark_session,
    split_jars,
    submitted_conf,
    under_spark_submit,
)
from outbox.reconcile.sources import (
    OFFSET_COLUMNS,
    JdbcSource,
    ParquetSource,
    PartitionPolicy,
    TableNames,
    TableSource,
    _first_line,
    canonical,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("outbox.reconcile")


@dataclass
class ReconcileOptions:
    """Everything a run needs. Exactly one of `db_url` / `parquet` is the source; `db_url`
    is also where the report table and repairs go."""

    db_url: str | None = None
    parquet: str | None = None
    table_prefix: str = "reliable_"
    schema: str | None = None
    master: str | None = None  # None: local[*], or spark-submit's --master
    jdbc_jars: tuple[str, ...] = ()
    partitions: PartitionPolicy = field(default_factory=PartitionPolicy)
    # committed offsets: consumerOffset.json | Parquet dir | "table:NAME" | "grpc:HOST:PORT"
    offsets: str | None = None
    # the offsets the broker still holds per queue (see `outbox.reconcile.bounds`): a JSON
    # file | Parquet dir | "table:NAME" | "grpc:HOST:PORT" | a started transport | an object
    # with max_offset(topic, queue_id) | {(topic, queue_id): max_offset}
    queue_bounds: BoundsSpec | None = None
    since: datetime | None = None
    until: datetime | None = None
    grace: timedelta = timedelta(minutes=5)  # an unsent stub younger than this is not lost
    # how long each group may take to confirm a copy whose queue is unknown (gRPC sends):
    # the resend worker's `ResendPolicy.expected_latency` (see `outbox.latency`)
    expected_latency: ExpectedLatency = field(default_factory=ExpectedLatency)
    report_table: str | None = None
    report_parquet: str | None = None
    report_all: bool = False
    repair: bool = False
    repair_options: RepairOptions = field(default_factory=RepairOptions)
    spark_conf: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        if bool(self.db_url) == bool(self.parquet):
            raise InvalidOptions("give exactly one source: a database URL or a Parquet root")
        if self.repair and not self.db_url:
            raise InvalidOptions("--repair writes to the database: it needs --db")
        if self.report_table and not self.db_url:
            raise InvalidOptions("--report-table is written to the --db database")
        if self.since and self.until and self.since >= self.until:
            raise InvalidOptions(f"empty window: since {self.since} >= until {self.until}")
        ro = self.repair_options
        if (
            ro.batch_size < 1
            or (ro.rate_limit is not None and ro.rate_limit <= 0)
            or (ro.limit is not None and ro.limit < 0)
        ):
            raise InvalidOptions("batch size, rate limit and limit must be positive")
        if self.grace < timedelta(0):
            raise InvalidOptions("the grace period cannot be negative")
        check_spec(self.queue_bounds)
        if self.offsets is not None and self.offsets.startswith(live_offsets.PREFIX):
            live_offsets.endpoint_of(self.offsets)


@dataclass
class ReconcileResult:
    """What a run found (and repaired)."""

    run_id: str
    source: str
    now: datetime
    summary: Summary
    elapsed_s: float
    repair: RepairReport | None = None
    plans: dict[str, tuple[str | None, int, int]] = field(default_factory=dict)
    master: str = ""  # the Spark master the job ran on
    tasks: int = 0  # Spark tasks the run's jobs ran (from the status tracker)
    shuffle_partitions: int = 0  # spark.sql.shuffle.partitions the run used


def _naive_utc(value: datetime) -> datetime:
    if value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


def build_source(options: ReconcileOptions) -> tuple[TableSource, JdbcTarget | None]:
    names = TableNames.for_prefix(options.table_prefix, options.schema)
    if options.db_url:
        target = jdbc_target(options.db_url)
        offsets_table = bounds_table = None
        if options.offsets and options.offsets.startswith("table:"):
            offsets_table = options.offsets.removeprefix("table:")
        qb = options.queue_bounds
        if isinstance(qb, str) and qb.startswith("table:"):
            bounds_table = qb.removeprefix("table:").strip()
        return JdbcSource(target, names, options.partitions, offsets_table, bounds_table), target
    assert options.parquet is not None
    return ParquetSource(options.parquet), None


def read_offsets(
    spark: SparkSession,
    spec: str | None,
    source: TableSource,
    stub: DataFrame | None = None,
    topic_group: DataFrame | None = None,
) -> DataFrame | None:
    """The committed offsets: the broker's consumerOffset.json
    (`{"offsetTable": {"topic@group": {"queueId": offset}}}`), a Parquet directory or a
    table (`table:NAME`) with topic, consumer_group, queue_id, committed_offset, or asked
    live of a broker (`grpc:HOST:PORT`, for the copies open stubs point at:
    `outbox.reconcile.live_offsets`); else the Parquet source's `consumer_offset/` when
    present."""
    if spec is not None and spec.startswith(live_offsets.PREFIX):
        if stub is None:
            raise InvalidOptions("--offsets grpc:HOST:PORT needs the stub table")
        return live_offsets.read_live(spark, spec, stub, topic_group)
    if spec is None or spec.startswith("table:"):
        return source.read(spark, "offsets")
    path = Path(spec)
    if spec.endswith(".json"):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise SourceUnavailable(f"offsets file {spec}", str(exc)) from None
        rows: list[tuple[str, str, int, int]] = []
        table = doc.get("offsetTable", doc) if isinstance(doc, dict) else None
        if not isinstance(table, dict):
            raise SourceUnavailable(f"offsets file {spec}", "no offsetTable object")
        for key, queues in table.items():
            topic, sep, group = str(key).rpartition("@")
            if not sep or not isinstance(queues, dict):
                raise SourceUnavailable(f"offsets file {spec}", f"bad entry {key!r}")
            for qid, offset in queues.items():
                rows.append((topic, group, int(qid), int(offset)))
        schema = ", ".join(f"{k} {v}" for k, v in OFFSET_COLUMNS.items())
        return spark.createDataFrame(rows, schema)
    try:
        df = spark.read.parquet(spec)
    except Exception as exc:
        raise SourceUnavailable(f"offsets {spec}", str(exc).splitlines()[0]) from None
    return canonical(df, "offsets", f"offsets {spec}")


def reconcile(
    options: ReconcileOptions,
    spark: SparkSession | None = None,
    now: datetime | None = None,
    run_id: str | None = None,
) -> ReconcileResult:
    """Run one reconciliation (and repair, if asked). `now` is injectable (naive UTC)."""
    options.validate()
    started = time.monotonic()
    now = _naive_utc(now or datetime.now(UTC))
    run_id = run_id or f"{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
    source, target = build_source(options)
    counts: dict[str, int] = {}
    if spark is None:
        spark = _start_session(options, target, getattr(source, "names", TableNames()), counts)
    elif target is not None:
        counts = count_rows(target, getattr(source, "names", TableNames()), SMALL_INPUT_ROWS) or {}
    if target is not None:
        require_driver(spark, target.driver)
    if isinstance(source, JdbcSource) and counts and sum(counts.values()) < SMALL_INPUT_ROWS:
        # a small input, counted already: its tables need no bounds queries
        source.known_rows = dict(counts)

    # timestamps are naive UTC throughout (a Parquet TIMESTAMP is read in the session's
    # zone): run in UTC; the run's jobs in one job group, to count their tasks. A caller's
    # session gets its settings and its job group back afterwards.
    with borrowed_settings(spark) as settings:
        settings.set("spark.sql.session.timeZone", "UTC")
        settings.job_group(run_id, "reliable reconcile")
        summary, repair, shuffle = _run(spark, settings, source, target, options, now, run_id)
    plans = dict(getattr(source, "plans", {}))
    return ReconcileResult(
        run_id=run_id,
        source=source.describe(),
        now=now,
        summary=summary,
        elapsed_s=time.monotonic() - started,
        repair=repair,
        plans=plans,
        master=spark.sparkContext.master or "",
        tasks=tasks_run(spark, run_id),
        shuffle_partitions=shuffle,
    )


def _start_session(
    options: ReconcileOptions,
    target: JdbcTarget | None,
    names: TableNames,
    counts: dict[str, int],
) -> SparkSession:
    """The run's own session: the source checked first (what Python can check in a moment
    is checked before the JVM starts; a database's rows counted into `counts`), the JDBC
    drivers on its classpath, and a JVM tuned for a small input."""
    java_path = None if under_spark_submit() else find_java()
    rows: int | None = None
    if target is not None:
        log.info("checking the database %s", target.redacted())
        rows = check_database(target, names, count_up_to=SMALL_INPUT_ROWS, counts=counts)
    elif options.parquet:
        check_parquet(options.parquet)
    # spark-submit's --jars are on the classpath already (and stay: the session
    # merges spark.jars, never replaces it)
    submitted = tuple(split_jars(submitted_conf().get("spark.jars")))
    jars = session_jars(target.dialect if target else None, options.jdbc_jars, submitted)
    log.info(
        "starting Spark (%s)",
        options.master or ("spark-submit's master" if under_spark_submit() else "local[*]"),
    )
    java = small_input_java_options(rows, options.spark_conf)
    if java:
        log.info("a small input (%s rows): %s", rows, " ".join(java))
        if java_path is not None:  # the classes it loads, archived for the next start
            java = (*java, *archive_options(java_path, jars, java))
    spark = spark_session(options.master, jars, options.spark_conf, java_options=java)
    if under_spark_submit():
        add_to_driver(spark, [j for j in jars if j not in submitted])
    return spark


def session_jars(
    dialect: str | None, jdbc_jars: tuple[str, ...] = (), provided: tuple[str, ...] = ()
) -> list[str]:
    """The JDBC jars a run's session starts with: the configured ones first, in their order
    (they may stand in for a system jar), then every installed system driver in one fixed
    order. Every installed driver, because the first session fixes the JVM's classpath for
    every later job in the process, whichever database it reads; in one order, so the
    classpath, and the class archive keyed by it, is the same whichever database a run
    reads."""
    system = installed_system_jars()
    chosen = driver_jars(dialect, jdbc_jars, provided=provided) if dialect else []
    return list(dict.fromkeys([*(j for j in chosen if j not in system), *system]))


# A small input (fewer rows than this in the stub, confirmation and log tables together)
# starts the driver's JVM with only the quick JIT compiler (C1): on such an input the job's
# CPU goes to planning and compiling, not to rows, and the optimising compiler (C2) spent
# more CPU compiling Spark's planner than the whole run took otherwise (41 stubs with a
# report, per run after the JVM started: 15-19 s JVM CPU with C2, 8 s without).
SMALL_INPUT_ROWS = 100_000
SMALL_INPUT_JAVA_OPTIONS = ("-XX:TieredStopAtLevel=1",)


def small_input_java_options(rows: int | None, conf: dict[str, str]) -> tuple[str, ...]:
    """The JVM options for an input of `rows` rows (None: not counted): C1 only when the
    input is small, unless the caller set the driver's Java options (`--conf
    spark.driver.extraJavaOptions=...`) or spark-submit started the JVM already."""
    if (
        rows is None
        or rows >= SMALL_INPUT_ROWS
        or under_spark_submit()
        or "spark.driver.extraJavaOptions" in conf
    ):
        return ()
    return SMALL_INPUT_JAVA_OPTIONS


# A small input is also planned for what it is, for the run (a caller's session gets its
# settings back): no adaptive execution (it plans again after each of the run's query
# stages, twice the jobs) and no generated code (compiling Java for a few rows costs more
# than interpreting them). 41 stubs with a report, JVM CPU per run with C1 only: 6.7-9.9 s
# with both, 5.0-6.2 s without; the first run after the JVM started 23 s -> 15 s.
# Upper-casing the status (evaluated several times per row when interpreted) with the
# JVM's case mapping rather than ICU's, which built a break iterator per call: the tasks'
# CPU in the first run after the JVM started 2.2 s -> 1.2 s (a Flight Recorder profile:
# 20% of the task threads' samples were in ICU). The statuses are ASCII words, which both
# map alike (Spark's ASCII fast path does not depend on the JVM's locale).
SMALL_INPUT_CONF: dict[str, str] = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.icu.caseMappings.enabled": "false",
}


def small_input_conf(rows: int | None, options: ReconcileOptions) -> dict[str, str]:
    """The session settings for a run over `rows` input rows (None: not counted, as for
    Parquet): those of `SMALL_INPUT_CONF` the caller did not set (`--conf`), when the
    input is small."""
    if rows is None or rows >= SMALL_INPUT_ROWS:
        return {}
    return {k: v for k, v in SMALL_INPUT_CONF.items() if k not in options.spark_conf}


def tasks_run(spark: SparkSession, job_group: str) -> int:
    """How many tasks the jobs of a job group ran (completed or failed; a stage skipped
    because its shuffle output was reused ran none), from Spark's status tracker."""
    tracker = spark.sparkContext.statusTracker()
    stages: set[int] = set()
    for job_id in tracker.getJobIdsForGroup(job_group):
        info = tracker.getJobInfo(job_id)
        if info is not None:
            stages.update(info.stageIds)
    total = 0
    for stage_id in stages:
        stage = tracker.getStageInfo(stage_id)
        if stage is not None:
            total += stage.numCompletedTasks + stage.numFailedTasks
    return total


# Shuffle partitions from the data: one per this many input rows (stubs, confirmations
# and log rows), at least the cluster's default parallelism, at most SHUFFLE_MAX.
ROWS_PER_SHUFFLE_PARTITION = 500_000
SHUFFLE_MAX = 2000
# Detail rows per report output partition (one file, or one JDBC writer, each).
ROWS_PER_REPORT_PARTITION = 1_000_000


def shuffle_partitions(spark: SparkSession, rows: int | None, options: ReconcileOptions) -> int:
    """The shuffle partitions for this run: what the caller set explicitly (`--conf
    spark.sql.shuffle.partitions=N`, or spark-submit's `--conf`), else sized from the
    input's row count (unknown for Parquet: the default parallelism); adaptive execution
    then coalesces small partitions further."""
    explicit = options.spark_conf.get(
        "spark.sql.shuffle.partitions"
    ) or spark.sparkContext.getConf().get("spark.sql.shuffle.partitions")
    if explicit:
        return int(explicit)
    floor = max(1, spark.sparkContext.defaultParallelism)
    if rows is None:
        return floor
    return max(floor, min(SHUFFLE_MAX, math.ceil(rows / ROWS_PER_SHUFFLE_PARTITION)))


def _run(
    spark: SparkSession,
    settings: BorrowedSettings,
    source: TableSource,
    target: JdbcTarget | None,
    options: ReconcileOptions,
    now: datetime,
    run_id: str,
) -> tuple[Summary, RepairReport | None, int]:
    log.info("reading the tables from %s", source.describe())
    stub = _required(source.read(spark, "stub"))
    topic_group = source.read(spark, "topic_group")
    inputs = Inputs(
        stub=stub,
        confirmation=_required(source.read(spark, "confirmation")),
        log=_required(source.read(spark, "log")),
        topic_group=topic_group,
        offsets=read_offsets(spark, options.offsets, source, stub, topic_group),
        bounds=read_bounds(spark, options.queue_bounds, source, stub),
        audit=source.read(spark, "audit"),
    )
    plans: dict[str, tuple[str | None, int, int]] = getattr(source, "plans", {})
    counted = [rows for _col, _parts, rows in plans.values() if rows >= 0]
    rows = sum(counted) if counted else None
    shuffle = shuffle_partitions(spark, rows, options)
    settings.set("spark.sql.shuffle.partitions", str(shuffle))
    small = small_input_conf(rows, options)
    if small:
        log.info(
            "a small input (%d rows): %s", rows, ", ".join(f"{k}={v}" for k, v in small.items())
        )
    for key, value in small.items():
        settings.set(key, value)
    window = Window(_opt(options.since), _opt(options.until))
    classified = classify(inputs, now, options.grace, window, options.expected_latency)
    # the classified rows are read again by the detail rows and the repair, and (when
    # something is unaccounted) by the certificate's list of names: persisted when they
    # will be, or when they are few (cheap to keep, dear to compute again)
    outputs = bool(options.report_table or options.report_parquet or options.repair)
    outputs = outputs or (rows is not None and rows < SMALL_INPUT_ROWS)
    if outputs:
        from pyspark import StorageLevel

        classified.messages.persist(StorageLevel.MEMORY_AND_DISK)
    log.info("classifying")
    try:
        try:
            summary = summarize(
                facts(classified).collect(), classified.watermarks.collect(), window
            )
            if summary.certificate.unaccounted:
                summary.certificate.unaccounted_messages = unaccounted_messages(classified)
        except spark_errors() as exc:
            raise JobFailed(_first_line(exc)) from None
        log.info(
            "classified %d stubs: %d unaccounted",
            summary.total_stubs,
            summary.certificate.unaccounted,
        )
        _write_outputs(classified, options, target, run_id, _detail_count(summary, options))
        repair = _repair(classified, options, run_id, now) if options.repair else None
    finally:
        if outputs:
            classified.messages.unpersist()
    return summary, repair, shuffle


def _detail_count(summary: Summary, options: ReconcileOptions) -> int:
    """How many detail rows the report receives (known from the summary's counts)."""
    skipped = () if options.report_all else ("CONFIRMED", "VOID")
    stubs = sum(n for cls, n in summary.stubs.items() if cls not in skipped)
    return stubs + sum(summary.log_rows.values())


def _opt(value: datetime | None) -> datetime | None:
    return None if value is None else _naive_utc(value)


def _required(df: DataFrame | None) -> DataFrame:
    assert df is not None
    return df


def _write_outputs(
    c: Classified, options: ReconcileOptions, target: JdbcTarget | None, run_id: str, count: int
) -> None:
    if not (options.report_table or options.report_parquet):
        return
    # few files (and few JDBC writers): one output partition per million detail rows
    parts = max(1, math.ceil(count / ROWS_PER_REPORT_PARTITION))
    rows = detail_rows(c, run_id, options.report_all).coalesce(parts)
    if options.report_parquet:
        write_parquet(rows, options.report_parquet)
    if options.report_table:
        assert target is not None
        write_table(rows, target, options.report_table, options.schema)


def _repair(c: Classified, options: ReconcileOptions, run_id: str, now: datetime) -> RepairReport:
    from outbox.database import DatabaseUrlError, create_engine
    from outbox.models import OutboxTables

    assert options.db_url is not None
    try:
        engine = create_engine(options.db_url)
    except DatabaseUrlError as exc:
        raise JobFailed(f"repair needs a Python driver: {exc}") from None
    try:
        tables = OutboxTables(prefix=options.table_prefix, schema=options.schema)
        repairer = Repairer(engine, tables, run_id, options.repair_options, now=lambda: now)
        rows = candidates(c.messages, options.repair_options.window_only)
        stream: Any = (tuple(r) for r in rows.toLocalIterator())
        return repairer.run(stream)
    finally:
        engine.dispose()
