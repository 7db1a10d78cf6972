"""Reconciliation suite: the Spark job beside the same classification as SQL in PostgreSQL.

A generator bulk-loads N stubs (default 1M; 10M with `RELIABLE_BENCH_RECONCILE_ROWS=10000000`
or `python -m bench.reconcile --rows 10000000`; 100k with --quick) with COPY into PostgreSQL:
4 topics x 4 queues, one consumer group per topic, and a known number of rows in every
class (0.5% lost, 0.3% exhausted, 1% in processing, 0.2% dead-lettered, 0.2% void, the top
0.5% of every queue backlogged, the rest confirmed; stale and orphan log rows). Then, in the
same run on the same machine:

- spark_job: `outbox.reconcile.reconcile` on local[*] over partitioned JDBC reads (one
  full-outer join), the first run in a fresh JVM; spark_job_warm: a second run in the same
  JVM (JIT and code generation warm); spark_job+start adds the JVM start-up;
- postgres_sql: the same stub and log-row classification as two SQL statements inside
  PostgreSQL (expected groups x confirmation/log hash joins, watermarks per queue/group).

Both verdicts are checked against the generator's counts. msgs/s = stubs classified per s.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
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


class _Stream:
    """A file-like object over a generator of text lines, for COPY FROM STDIN."""

    def __init__(self, lines: Iterator[str]) -> None:
        self.lines = lines
        self.buf = b""

    def read(self, size: int = 65536) -> bytes:
        while len(self.buf) < size:
            chunk = "".join(itertools.islice(self.lines, 2000))
            if not chunk:
                break
            self.buf += chunk.encode()
        out, self.buf = self.buf[:size], self.buf[size:]
        return out

    readline = read


def generate(n: int) -> tuple[dict[str, list[str]], Counter[str], Counter[str]]:
    """Rows as CSV lines per table, and the expected stub and log-row class counts."""
    stubs: list[str] = []
    confs: list[str] = []
    logs: list[str] = []
    want: Counter[str] = Counter()
    want_log: Counter[str] = Counter()
    nq = TOPICS * QUEUES
    per_queue = [n // nq + (1 if q < n % nq else 0) for q in range(nq)]
    backlog = [max(1, c // 200) for c in per_queue]
    offsets = [0] * nq
    for i in range(n):
        q = i % nq
        topic, queue = f"topic-{q // QUEUES}", q % QUEUES
        group = f"group-{q // QUEUES}"
        off = offsets[q]
        offsets[q] += 1
        mid = f"{i:032x}"
        top = per_queue[q] - backlog[q]
        r = i % 1000
        status, sends, log_row, dead, conf = "UNCONFIRMED", 1, False, False, False
        if off >= top:
            cls = "BACKLOGGED"
        elif off == top - 1 or 8 <= r < 18:
            cls, log_row = "IN_PROCESSING", True
        elif r < 5:
            cls = "LOST"
        elif r < 8:
            cls, sends = "EXHAUSTED", 16
        elif r < 20:
            cls, log_row, dead = "DEAD_LETTERED", True, True
        elif r < 22:
            cls, status = "VOID", "VOID"
        else:
            cls, status, conf = "CONFIRMED", "CONFIRMED", True
            if r == 22:
                want_log["STALE"] += 1
                logs.append(f"{mid},{group},{topic},{queue},{off},{CREATED},\n")
        want[cls] += 1
        stubs.append(
            f"{i + 1},{mid},{topic},\\x,-,{group},{status},{sends},16,{queue},{off},"
            f"{CREATED},{CREATED}\n"
        )
        if conf:  # confirmations spread over the day (the read partitions on confirmed_at)
            sec = i // 1000
            confs.append(
                f"{mid},{group},{topic},"
                f"2026-01-01 {sec // 3600:02d}:{sec // 60 % 60:02d}:{sec % 60:02d}\n"
            )
        if log_row:
            want_log["MATCHED"] += 1
            logs.append(
                f"{mid},{group},{topic},{queue},{off},{CREATED},{CREATED if dead else ''}\n"
            )
        if r == 999 and i % 2000 == 999:
            want_log["ORPHAN"] += 1
            logs.append(f"orphan-{i:025x},{group},{topic},{queue},0,{CREATED},\n")
    return {"stub": stubs, "confirmation": confs, "log": logs}, want, want_log


def load(n: int) -> tuple[Counter[str], Counter[str], float]:
    import sqlalchemy as sa

    from outbox.models import OutboxTables

    tables = OutboxTables(prefix=PREFIX)
    engine = sa.create_engine(PG_URL)
    tables.drop_all(engine)
    tables.create_all(engine)
    started = time.perf_counter()
    rows, want, want_log = generate(n)
    columns = {
        "stub": (
            tables.stub.name,
            "id, message_id, topic, body, body_digest, expected_groups, "
            "status, send_count, max_sends, queue_id, queue_offset, created_at, "
            "updated_at",
        ),
        "confirmation": (
            tables.confirmation.name,
            "message_id, consumer_group, topic, confirmed_at",
        ),
        "log": (
            tables.consumption_log.name,
            "message_id, consumer_group, topic, queue_id, "
            "queue_offset, created_at, dead_lettered_at",
        ),
    }
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        for key, (table, cols) in columns.items():
            cur.copy_expert(
                f"COPY {table} ({cols}) FROM STDIN WITH (FORMAT csv)", _Stream(iter(rows[key]))
            )
        for q in range(TOPICS):
            cur.execute(
                f"INSERT INTO {tables.topic_group.name} VALUES (%s, %s)",
                (f"topic-{q}", f"group-{q}"),
            )
        raw.commit()
        cur.execute(
            f"ANALYZE {tables.stub.name}; ANALYZE {tables.confirmation.name}; "
            f"ANALYZE {tables.consumption_log.name}"
        )
        raw.commit()
    finally:
        raw.close()
        engine.dispose()
    return want, want_log, time.perf_counter() - started


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
    n: int,
) -> tuple[dict[str, int], dict[str, int], float, float, float, dict[str, object]]:
    """The job on local[*] with its own partition sizing (no shuffle setting given):
    JVM start-up timed apart from the job, then a cold and a warm run."""
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


def _drop() -> None:
    import sqlalchemy as sa

    from outbox.models import OutboxTables

    engine = sa.create_engine(PG_URL)
    OutboxTables(prefix=PREFIX).drop_all(engine)
    engine.dispose()


def run(opts: Options, rows: int | None = None) -> SuiteResult:
    n = (
        rows
        or int(os.environ.get("RELIABLE_BENCH_RECONCILE_ROWS", "0") or 0)
        or (100_000 if opts.quick else 1_000_000)
    )
    result = SuiteResult()
    progress(f"reconcile: generating and COPYing {n:,} stubs into PostgreSQL")
    want, want_log, load_s = load(n)
    progress(f"reconcile: loaded in {load_s:.1f} s; SQL classification in PostgreSQL")
    sql_stubs, sql_logs, sql_s = postgres_sql()
    progress(f"reconcile: SQL took {sql_s:.1f} s; Spark job")
    try:
        sp_stubs, sp_logs, start_s, job_s, warm_s, plans = spark_job(n)
    finally:
        _drop()
    progress(f"reconcile: Spark took {job_s:.1f} s (+{start_s:.1f} s JVM start)")
    expected = dict(want)
    ok_sql = sql_stubs == expected and sql_logs == dict(want_log)
    ok_spark = sp_stubs == expected and sp_logs == dict(want_log)
    result.rows.append(Row("load_copy", n / load_s, 0.0, f"{load_s:.1f} s generate + COPY"))
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
            "spark_warm_s": round(warm_s, 2),
            "spark_start_s": round(start_s, 2),
            "sql_matches": str(ok_sql),
            "spark_matches": str(ok_spark),
        }
    )
    return result


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
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else [args.rows]
    per_stub: list[str] = []
    for size in sizes:
        res = run(Options(quick=args.quick, workdir=Path(".")), rows=size)
        print(format_table(f"== {NAME}: {DESCRIPTION}", res))
        n = float(str(res.metrics["stubs"]))
        job, sql = float(str(res.metrics["spark_job_s"])), float(str(res.metrics["sql_s"]))
        per_stub.append(
            f"{int(n):,} stubs: spark {job / n * 1e6:.2f} us/stub, sql {sql / n * 1e6:.2f} us/stub"
        )
    if len(sizes) > 1:
        print("scaling: " + "; ".join(per_stub))
    return 0


if __name__ == "__main__":
    sys.exit(main())
