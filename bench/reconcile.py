"""Reconciliation suite: the Spark job beside the same classification as SQL in PostgreSQL.

A generator inside PostgreSQL (generate_series, a million stubs per statement, into unlogged
tables whose secondary indexes are built after the load) writes N stubs (default 1M; 10M
with `RELIABLE_BENCH_RECONCILE_ROWS=10000000` or `python -m bench.reconcile --rows 10000000`;
100k with --quick): 4 topics x 4 queues, one consumer group per topic, and a known number
of rows in every class (0.5% lost, 0.3% exhausted, 1% in processing, 0.2% dead-lettered,
0.2% void, the top 0.5% of every queue backlogged, the rest confirmed; stale and orphan log
rows). Then, in the same run on the same machine:

- spark_job: `outbox.reconcile.reconcile` on local[*] over partitioned JDBC reads (one
  full-outer join), the first run in a fresh JVM; spark_job_warm: a second run in the same
  JVM (JIT and code generation warm); spark_job+start adds the JVM start-up;
- postgres_sql: the same stub and log-row classification as two SQL statements inside
  PostgreSQL (expected groups x confirmation/log hash joins, watermarks per queue/group).

Both verdicts are checked against the generator's counts. msgs/s = stubs classified per s.

A small database (`--small-only`, and the first figure of every run): 1,000 stubs from the
same generator, reconciled with a report table and a Parquet report in a fresh JVM started
the way `reliable reconcile` starts it for a small database (the quick JIT compiler only,
`outbox.reconcile.job.SMALL_INPUT_JAVA_OPTIONS`): the JVM's start, the first run after it,
and later runs in the same JVM, each with its wall time, the JVM's CPU time (from /proc:
on a shared machine the wall time says more about the other processes), its Spark jobs and
tasks. `--small-java-options "..."` starts that JVM with other options instead (`""`: the
JVM's defaults, both JIT compilers) to measure what the choice buys.
`--sizes 1000000,10000000` runs several sizes in one process and prints the time per stub
of each; a size that fails prints its error, and the tables are dropped after every size
(also on failure or SIGTERM).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from bench._common import Options, Row, SuiteResult, format_table, progress

NAME = "reconcile"
DESCRIPTION = "Spark reconciliation vs the same classification as SQL in PostgreSQL"

PG_URL = os.environ.get(
    "RELIABLE_BENCH_POSTGRES", "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
)
PREFIX = "bench_rc_"
TOPICS = 4
QUEUES = 4
CREATED = "2026-01-01 00:00:00"


# The generator, inside PostgreSQL: one row per stub number i in [lo, hi) of n, with the
# class it is meant to get. Stubs round-robin over 4 topics x 4 queues (queue q = i % 16,
# offset i / 16); r = i % 1000 picks the class; the top 0.5% of every queue is backlogged,
# the stub just below them in processing.
GEN_SQL = """
SELECT i, q, off, r, 'topic-' || (q / {queues}) AS topic, (q %% {queues})::int AS queue_id,
       'group-' || (q / {queues}) AS grp, lpad(to_hex(i), 32, '0') AS mid,
       CASE WHEN off >= top THEN 'BACKLOGGED'
            WHEN off = top - 1 OR r BETWEEN 8 AND 17 THEN 'IN_PROCESSING'
            WHEN r < 5 THEN 'LOST'
            WHEN r < 8 THEN 'EXHAUSTED'
            WHEN r < 20 THEN 'DEAD_LETTERED'
            WHEN r < 22 THEN 'VOID'
            ELSE 'CONFIRMED' END AS cls
FROM (SELECT i, q, off, r, per - greatest(1, per / 200) AS top
      FROM (SELECT i, i %% {nq} AS q, i / {nq} AS off, i %% 1000 AS r,
                   %(n)s::bigint / {nq} + CASE WHEN i %% {nq} < %(n)s::bigint %% {nq}
                                             THEN 1 ELSE 0 END AS per
            FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS i) a) b
""".format(queues=QUEUES, nq=TOPICS * QUEUES)

LOAD_SQL = {
    "stubs": """
INSERT INTO {stub} (id, message_id, topic, body, body_digest, expected_groups, status,
                    send_count, max_sends, queue_id, queue_offset, created_at, updated_at)
SELECT i + 1, mid, topic, ''::bytea, '-', grp,
       CASE cls WHEN 'VOID' THEN 'VOID' WHEN 'CONFIRMED' THEN 'CONFIRMED'
                ELSE 'UNCONFIRMED' END,
       CASE cls WHEN 'EXHAUSTED' THEN 16 ELSE 1 END, 16, queue_id, off,
       %(created)s::timestamp, %(created)s::timestamp
FROM ({gen}) g""",
    # confirmations spread over the day (the read partitions on confirmed_at)
    "confirmations": """
INSERT INTO {conf} (message_id, consumer_group, topic, confirmed_at)
SELECT mid, grp, topic, %(created)s::timestamp + (i / 1000) * interval '1 second'
FROM ({gen}) g WHERE cls = 'CONFIRMED'""",
    # matched (in processing, dead-lettered), stale (1 in 1000 confirmed) and orphan rows
    "log rows": """
INSERT INTO {log} (message_id, consumer_group, topic, queue_id, queue_offset, created_at,
                   dead_lettered_at)
SELECT mid, grp, topic, queue_id, off, %(created)s::timestamp,
       CASE WHEN cls = 'DEAD_LETTERED' THEN %(created)s::timestamp END
FROM ({gen}) g WHERE cls IN ('IN_PROCESSING', 'DEAD_LETTERED') OR (cls = 'CONFIRMED' AND r = 22)
UNION ALL
SELECT 'orphan-' || lpad(to_hex(i), 25, '0'), grp, topic, queue_id, 0, %(created)s::timestamp,
       NULL
FROM ({gen}) g WHERE r = 999 AND i %% 2000 = 999""",
}

WANT_SQL = """
SELECT cls, count(*), count(*) FILTER (WHERE cls = 'CONFIRMED' AND r = 22),
       count(*) FILTER (WHERE r = 999 AND i %% 2000 = 999)
FROM ({gen}) g GROUP BY cls
"""

CHUNK = 1_000_000  # stubs generated per statement: progress on stderr after each


def expected(n: int) -> tuple[Counter[str], Counter[str]]:
    """The generator's stub and log-row class counts, computed from the generator alone."""
    import sqlalchemy as sa

    want: Counter[str] = Counter()
    want_log: Counter[str] = Counter()
    engine = sa.create_engine(PG_URL)
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute(WANT_SQL.format(gen=GEN_SQL), {"n": n, "lo": 0, "hi": n})
        for cls, count, stale, orphan in cur.fetchall():
            want[cls] += int(count)
            want_log["STALE"] += int(stale)
            want_log["ORPHAN"] += int(orphan)
            if cls in ("IN_PROCESSING", "DEAD_LETTERED"):
                want_log["MATCHED"] += int(count)
        raw.rollback()
    finally:
        raw.close()
        engine.dispose()
    return want, +want_log


def load(n: int) -> tuple[Counter[str], Counter[str], float]:
    """Generate the rows inside PostgreSQL (generate_series, no row crosses the wire) into
    unlogged tables without their secondary indexes, then build the indexes and ANALYZE:
    the tables the job reads are the ones `OutboxTables` creates, indexes included."""
    import sqlalchemy as sa

    from outbox.models import OutboxTables

    tables = OutboxTables(prefix=PREFIX)
    names = {
        "stub": tables.stub.name,
        "conf": tables.confirmation.name,
        "log": tables.consumption_log.name,
    }
    engine = sa.create_engine(PG_URL)
    tables.drop_all(engine)
    tables.create_all(engine)
    started = time.perf_counter()
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("SET synchronous_commit = off; SET maintenance_work_mem = '512MB'")
        rebuild: list[str] = []
        for table in names.values():
            cur.execute(f"ALTER TABLE {table} SET UNLOGGED")
            # secondary indexes and unique constraints go, and come back after the load
            cur.execute(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE conrelid = %s::regclass AND contype = 'u'",
                (table,),
            )
            for con, definition in cur.fetchall():
                cur.execute(f"ALTER TABLE {table} DROP CONSTRAINT {con}")
                rebuild.append(f"ALTER TABLE {table} ADD CONSTRAINT {con} {definition}")
            cur.execute(
                "SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid) "
                "FROM pg_index i WHERE i.indrelid = %s::regclass AND NOT i.indisprimary",
                (table,),
            )
            for index, definition in cur.fetchall():
                cur.execute(f"DROP INDEX {index}")
                rebuild.append(definition)
        raw.commit()
        for lo in range(0, n, CHUNK):
            hi = min(n, lo + CHUNK)
            for sql in LOAD_SQL.values():
                cur.execute(
                    sql.format(gen=GEN_SQL, **names),
                    {"n": n, "lo": lo, "hi": hi, "created": CREATED},
                )
            raw.commit()
            progress(
                f"reconcile: generated {hi:,} of {n:,} stubs with their confirmations "
                f"and log rows ({time.perf_counter() - started:.1f} s)"
            )
        for q in range(TOPICS):
            cur.execute(
                f"INSERT INTO {tables.topic_group.name} VALUES (%s, %s)",
                (f"topic-{q}", f"group-{q}"),
            )
        raw.commit()
        for definition in rebuild:
            cur.execute(definition)
            raw.commit()
            progress(f"reconcile: {definition} ({time.perf_counter() - started:.1f} s)")
        for table in names.values():
            cur.execute(f"ANALYZE {table}")
        raw.commit()
    finally:
        raw.close()
        engine.dispose()
    load_s = time.perf_counter() - started
    want, want_log = expected(n)
    return want, want_log, load_s


STUB_SQL = """
WITH tg AS (SELECT topic, array_agg(consumer_group::text) AS groups FROM {tg} GROUP BY topic),
wm AS (SELECT topic, queue_id, consumer_group, max(queue_offset) AS w FROM {log}
       GROUP BY topic, queue_id, consumer_group),
pairs AS (
  SELECT s.id, s.message_id, s.status, s.queue_id, s.queue_offset, s.topic, s.send_count,
         s.max_sends, s.escalated_at, s.created_at, g.grp
  FROM {stub} s LEFT JOIN tg USING (topic)
  LEFT JOIN LATERAL (SELECT DISTINCT x AS grp FROM unnest(
      string_to_array(nullif(s.expected_groups, ''), ',') || coalesce(tg.groups, '{{}}'))
      AS x) g ON true),
per_pair AS (
  SELECT p.*, c.message_id IS NOT NULL AS confirmed, l.message_id IS NOT NULL AS logged,
         l.dead_lettered_at IS NOT NULL AS dead, p.queue_offset < coalesce(w.w, -1) AS passed
  FROM pairs p
  LEFT JOIN {conf} c ON c.message_id = p.message_id AND c.consumer_group = p.grp
  LEFT JOIN {log} l ON l.message_id = p.message_id AND l.consumer_group = p.grp
  LEFT JOIN wm w ON w.topic = p.topic AND w.queue_id = p.queue_id
       AND w.consumer_group = p.grp),
per_msg AS (
  SELECT id, max(status) AS status, max(queue_offset) AS queue_offset,
         max(send_count) AS send_count, max(max_sends) AS max_sends,
         max(escalated_at) AS escalated_at, max(created_at) AS created_at,
         bool_and(confirmed) AS all_confirmed,
         bool_or(NOT confirmed AND dead) AS any_dead,
         bool_or(NOT confirmed AND NOT logged AND passed) AS any_passed,
         bool_or(NOT confirmed AND logged) AS any_logged
  FROM per_pair GROUP BY id)
SELECT CASE
  WHEN status = 'VOID' THEN 'VOID'
  WHEN status = 'CONFIRMED' OR all_confirmed THEN 'CONFIRMED'
  WHEN any_dead THEN 'DEAD_LETTERED'
  WHEN (any_passed OR (queue_offset IS NULL AND created_at < %(cutoff)s))
       AND (send_count >= max_sends OR escalated_at IS NOT NULL) THEN 'EXHAUSTED'
  WHEN any_passed OR (queue_offset IS NULL AND created_at < %(cutoff)s) THEN 'LOST'
  WHEN any_logged THEN 'IN_PROCESSING'
  ELSE 'BACKLOGGED' END AS cls, count(*)
FROM per_msg GROUP BY 1
"""

LOG_SQL = """
SELECT CASE WHEN s.id IS NULL THEN 'ORPHAN'
            WHEN s.status = 'CONFIRMED' OR c.message_id IS NOT NULL THEN 'STALE'
            ELSE 'MATCHED' END, count(*)
FROM {log} l LEFT JOIN {stub} s ON s.message_id = l.message_id
LEFT JOIN {conf} c ON c.message_id = l.message_id AND c.consumer_group = l.consumer_group
GROUP BY 1
"""


def postgres_sql() -> tuple[dict[str, int], dict[str, int], float]:
    import sqlalchemy as sa

    names = {
        "stub": f"{PREFIX}message_stub",
        "conf": f"{PREFIX}confirmation",
        "log": f"{PREFIX}consumption_log",
        "tg": f"{PREFIX}topic_group",
    }
    stub_sql = STUB_SQL
    engine = sa.create_engine(PG_URL)
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        started = time.perf_counter()
        cur.execute(stub_sql.format(**names), {"cutoff": "2100-01-01"})
        stubs = {k: int(v) for k, v in cur.fetchall()}
        cur.execute(LOG_SQL.format(**names))
        logs = {k: int(v) for k, v in cur.fetchall()}
        elapsed = time.perf_counter() - started
        raw.rollback()
    finally:
        raw.close()
        engine.dispose()
    return stubs, logs, elapsed


def spark_job(
    n: int, warm: bool = True
) -> tuple[dict[str, int], dict[str, int], float, float, float | None, dict[str, object]]:
    """The job on local[*] with its own partition sizing (no shuffle setting given):
    JVM start-up timed apart from the job, then a cold and (`warm`) a warm run."""
    from outbox.reconcile import ReconcileOptions, driver_jars, reconcile, spark_session

    conf = {
        "spark.ui.enabled": "false",
        "spark.driver.memory": "4g",
        "spark.ui.showConsoleProgress": "false",
    }
    started = time.perf_counter()
    spark = spark_session(None, driver_jars("postgresql"), conf, app_name="bench-reconcile")
    spark.sparkContext.setLogLevel("ERROR")
    spark.range(1).count()
    start_s = time.perf_counter() - started
    began = time.perf_counter()
    result = reconcile(ReconcileOptions(db_url=PG_URL, table_prefix=PREFIX), spark=spark)
    job_s = time.perf_counter() - began
    warm_s = None
    if warm:
        progress(f"reconcile: Spark cold run {job_s:.1f} s; once more in the warm JVM")
        began = time.perf_counter()
        reconcile(ReconcileOptions(db_url=PG_URL, table_prefix=PREFIX), spark=spark)
        warm_s = time.perf_counter() - began
    plans: dict[str, object] = dict(result.plans)
    plans["tasks"] = result.tasks
    plans["shuffle_partitions"] = result.shuffle_partitions
    spark.stop()
    s = result.summary
    return (
        {k: v for k, v in s.stubs.items() if v},
        {k: v for k, v in s.log_rows.items() if v},
        start_s,
        job_s,
        warm_s,
        plans,
    )


SMALL_ROWS = 1_000
SMALL_RUNS = 3  # the first run after the JVM started, then later runs in the same JVM
AUTO = "auto"  # the JVM options the job itself chooses for the database


def _jvm_cpu_s() -> float:
    """CPU seconds (user + system) of this process's children: the JVM PySpark started."""
    me, total = str(os.getpid()), 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def small_child(runs: int, java_options: str) -> dict[str, object]:
    """In a fresh process: start the JVM as the job does for the bench's tables, then
    reconcile them `runs` times with a report table and a Parquet report."""
    import tempfile
    import uuid

    from outbox.reconcile import ReconcileOptions, driver_jars, jdbc_target, reconcile
    from outbox.reconcile.classcache import archive_options
    from outbox.reconcile.job import SMALL_INPUT_ROWS, small_input_java_options
    from outbox.reconcile.preflight import check_database, find_java
    from outbox.reconcile.session import spark_session
    from outbox.reconcile.sources import TableNames

    rows = check_database(
        jdbc_target(PG_URL), TableNames.for_prefix(PREFIX), count_up_to=SMALL_INPUT_ROWS
    )
    java = small_input_java_options(rows, {}) if java_options == AUTO else java_options.split()
    archive = ""
    if java_options == AUTO and java:  # the job's class archive too (written at the exit)
        java = (*java, *archive_options(find_java(), driver_jars("postgresql"), java))
        archive = "mapped" if any("SharedArchiveFile" in o for o in java) else "written at exit"
    started = time.perf_counter()
    spark = spark_session(None, driver_jars("postgresql"), {}, java_options=java)
    spark.range(1).count()
    out: dict[str, object] = {
        "rows": rows,
        "java_options": " ".join(
            o for o in java if not o.startswith(("-XX:Shared", "-XX:Arch", "-Xlog"))
        ),
        "archive": archive,
        "start_s": time.perf_counter() - started,
        "start_cpu_s": _jvm_cpu_s(),
        "runs": [],
    }
    tracker = spark.sparkContext.statusTracker()
    with tempfile.TemporaryDirectory(prefix="bench-rc-small-") as tmp:
        for i in range(runs):
            run_id = f"small-{i}-{uuid.uuid4().hex[:8]}"
            cpu, began = _jvm_cpu_s(), time.perf_counter()
            result = reconcile(
                ReconcileOptions(
                    db_url=PG_URL,
                    table_prefix=PREFIX,
                    report_table=f"{PREFIX}report",
                    report_parquet=f"{tmp}/report",
                ),
                spark=spark,
                run_id=run_id,
            )
            out["runs"].append(  # type: ignore[attr-defined]
                {
                    "wall_s": time.perf_counter() - began,
                    "jvm_cpu_s": _jvm_cpu_s() - cpu,
                    "jobs": len(tracker.getJobIdsForGroup(run_id)),
                    "tasks": result.tasks,
                    "stubs": {k: v for k, v in result.summary.stubs.items() if v},
                }
            )
    spark.stop()
    return out


def small_database(
    n: int = SMALL_ROWS, runs: int = SMALL_RUNS, java_options: str = AUTO
) -> tuple[list[Row], list[str], dict[str, float | int | str | None]]:
    """The small-database figure: load n stubs, reconcile them in a fresh JVM (a child
    process, so no JVM of this process is reused), drop the tables."""
    import json
    import subprocess

    try:
        want, _want_log, _load_s = load(n)
        proc = subprocess.run(
            [sys.executable, "-m", "bench.reconcile", "--small-child", str(runs), java_options],
            capture_output=True,
            text=True,
            timeout=1800,
        )
    finally:
        _drop(report=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the small-database run failed: {proc.stderr[-2000:]}")
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    rows: list[Row] = []
    jvm = doc["java_options"] or "the JVM's defaults"
    if doc.get("archive"):
        jvm += f"; class archive {doc['archive']}"
    rows.append(
        Row(
            "small_jvm_start",
            0.0,
            0.0,
            f"{doc['start_s']:.1f} s wall, {doc['start_cpu_s']:.1f} s JVM CPU ({jvm})",
        )
    )
    ok = True
    for i, r in enumerate(doc["runs"]):
        ok = ok and r["stubs"] == dict(want)
        rows.append(
            Row(
                "small_first_run" if i == 0 else f"small_run_{i + 1}",
                n / r["wall_s"],
                0.0,
                f"{r['wall_s']:.1f} s wall, {r['jvm_cpu_s']:.1f} s JVM CPU; "
                f"{r['jobs']} jobs, {r['tasks']} tasks",
            )
        )
    notes = [
        f"small database: {n:,} stubs ({doc['rows']} rows counted before the JVM started), "
        f"a report table and a Parquet report; JVM options: {jvm}; "
        f"verdict {'matches' if ok else 'DIFFERS'}"
    ]
    later = doc["runs"][1:] or doc["runs"]
    metrics: dict[str, float | int | str | None] = {
        "small_stubs": n,
        "small_start_s": round(doc["start_s"], 2),
        "small_start_cpu_s": round(doc["start_cpu_s"], 2),
        "small_first_s": round(doc["runs"][0]["wall_s"], 2),
        "small_first_cpu_s": round(doc["runs"][0]["jvm_cpu_s"], 2),
        "small_later_s": round(min(r["wall_s"] for r in later), 2),
        "small_later_cpu_s": round(min(r["jvm_cpu_s"] for r in later), 2),
        "small_jobs": doc["runs"][0]["jobs"],
        "small_tasks": doc["runs"][0]["tasks"],
        "small_matches": str(ok),
    }
    return rows, notes, metrics


def _drop(report: bool = False) -> None:
    """The bench's tables (and, with `report`, the small database's report table)."""
    import sqlalchemy as sa

    from outbox.models import OutboxTables

    engine = sa.create_engine(PG_URL)
    OutboxTables(prefix=PREFIX).drop_all(engine)
    if report:
        with engine.begin() as conn:
            conn.execute(sa.text(f'DROP TABLE IF EXISTS "{PREFIX}report"'))
    engine.dispose()


def run(opts: Options, rows: int | None = None, warm: bool = True) -> SuiteResult:
    n = (
        rows
        or int(os.environ.get("RELIABLE_BENCH_RECONCILE_ROWS", "0") or 0)
        or (100_000 if opts.quick else 1_000_000)
    )
    result = SuiteResult()
    progress(f"reconcile: a small database ({SMALL_ROWS:,} stubs) in a fresh JVM")
    small_rows, small_notes, small_metrics = small_database()
    result.rows.extend(small_rows)
    result.notes.extend(small_notes)
    result.metrics.update(small_metrics)
    progress(f"reconcile: generating {n:,} stubs inside PostgreSQL")
    try:  # the tables go whatever happens: a 10M load takes gigabytes
        want, want_log, load_s = load(n)
        progress(f"reconcile: loaded in {load_s:.1f} s; SQL classification in PostgreSQL")
        sql_stubs, sql_logs, sql_s = postgres_sql()
        progress(f"reconcile: SQL took {sql_s:.1f} s; Spark job")
        sp_stubs, sp_logs, start_s, job_s, warm_s, plans = spark_job(n, warm)
    finally:
        _drop()
    progress(f"reconcile: Spark took {job_s:.1f} s (+{start_s:.1f} s JVM start)")
    expected = dict(want)
    ok_sql = sql_stubs == expected and sql_logs == dict(want_log)
    ok_spark = sp_stubs == expected and sp_logs == dict(want_log)
    result.rows.append(
        Row("load_copy", n / load_s, 0.0, f"{load_s:.1f} s generate + load + indexes")
    )
    result.rows.append(
        Row(
            "postgres_sql",
            n / sql_s,
            0.0,
            f"{sql_s:.1f} s; verdict {'matches' if ok_sql else 'DIFFERS'}",
        )
    )
    result.rows.append(
        Row(
            "spark_job",
            n / job_s,
            0.0,
            f"{job_s:.1f} s without JVM start; {plans.get('tasks')} tasks; "
            f"verdict {'matches' if ok_spark else 'DIFFERS'}",
        )
    )
    if warm_s is not None:
        result.rows.append(
            Row("spark_job_warm", n / warm_s, 0.0, f"{warm_s:.1f} s; second run in the same JVM")
        )
    # a later size of the same --sizes run finds the JVM running: its start is not a cold one
    result.rows.append(Row("jvm_start", 0.0, 0.0, f"{start_s:.1f} s (not in spark_job)"))
    result.rows.append(
        Row(
            "spark_job+start",
            n / (job_s + start_s),
            0.0,
            f"{job_s + start_s:.1f} s incl. JVM start",
        )
    )
    result.notes.append(f"stubs {n:,}; classes {dict(sorted(expected.items()))}")
    result.notes.append(f"log rows {dict(sorted(want_log.items()))}")
    result.notes.append(
        "spark partitions (column, partitions, rows): "
        + ", ".join(f"{k}={v}" for k, v in plans.items())
    )
    if not ok_sql:
        result.notes.append(f"SQL verdict: {sql_stubs} {sql_logs}")
    if not ok_spark:
        result.notes.append(f"Spark verdict: {sp_stubs} {sp_logs}")
    result.metrics.update(
        {
            "stubs": n,
            "load_s": round(load_s, 2),
            "sql_s": round(sql_s, 2),
            "spark_job_s": round(job_s, 2),
            "spark_warm_s": None if warm_s is None else round(warm_s, 2),
            "spark_start_s": round(start_s, 2),
            "sql_matches": str(ok_sql),
            "spark_matches": str(ok_spark),
        }
    )
    return result


def _load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reconcile", description=DESCRIPTION)
    parser.add_argument("--rows", type=int, default=None, help="stubs (default 1,000,000)")
    parser.add_argument(
        "--sizes",
        default=None,
        metavar="N,N,...",
        help="several sizes one after the other (e.g. 1000000,10000000); "
        "per-stub times side by side show whether the job scales "
        "linearly",
    )
    parser.add_argument("--quick", action="store_true", help="100,000 stubs")
    parser.add_argument(
        "--no-warm", action="store_true", help="skip the second run of the job in the same JVM"
    )
    parser.add_argument(
        "--small-only",
        action="store_true",
        help=f"only the small database ({SMALL_ROWS:,} stubs, a fresh JVM)",
    )
    parser.add_argument(
        "--small-java-options",
        default=AUTO,
        metavar="OPTS",
        help="the small database's JVM options (default: what the job chooses; "
        "'' for the JVM's defaults)",
    )
    parser.add_argument("--small-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.small_child:
        import json

        doc = small_child(int(args.small_child[0]), args.small_child[1])
        print(json.dumps(doc, default=str), flush=True)
        return 0
    if args.small_only:
        res = SuiteResult()
        res.rows, res.notes, res.metrics = small_database(java_options=args.small_java_options)
        res.notes.append(f"machine: {os.cpu_count()} cores; {_load_average()}")
        print(format_table(f"== {NAME}: a small database", res), flush=True)
        return 0
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else [args.rows]
    per_stub: list[str] = []
    failed = 0
    # a terminated run still drops its tables (run's finally): SIGTERM unwinds like Ctrl-C
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(128 + signal.SIGTERM))
    for size in sizes:
        load_avg = _load_average()
        try:
            res = run(
                Options(quick=args.quick, workdir=Path(".")), rows=size, warm=not args.no_warm
            )
        except Exception as exc:  # a failure at one size still leaves the others' figures
            failed += 1
            print(f"== {NAME}: {size:,} stubs FAILED: {type(exc).__name__}: {exc}", flush=True)
            continue
        res.notes.append(
            f"machine: {os.cpu_count()} cores; before the run {load_avg}; after " + _load_average()
        )
        print(format_table(f"== {NAME}: {DESCRIPTION}", res), flush=True)
        n = float(str(res.metrics["stubs"]))
        job, sql = float(str(res.metrics["spark_job_s"])), float(str(res.metrics["sql_s"]))
        per_stub.append(
            f"{int(n):,} stubs: spark {job / n * 1e6:.2f} us/stub, sql {sql / n * 1e6:.2f} us/stub"
        )
    if len(per_stub) > 1:
        print("scaling: " + "; ".join(per_stub))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
