"""The resend worker's sweep for `bench flow`: N stubs bulk-loaded inside PostgreSQL, 1%
due, then `ResendWorker.run_once()` until nothing is due; what it cost the database.

The stubs (INSERT ... SELECT generate_series, one statement; the table's indexes are those
`OutboxTables` declares, built after the load, then ANALYZE):

- i % 100 == 0 (1%): UNCONFIRMED, never sent, due an hour ago: lost, resent to the topic;
- i % 10 == 1 (9%): UNCONFIRMED, sent, next look in an hour: not due;
- the rest (90%): CONFIRMED.

Counted on the worker's engine (SQLAlchemy's cursor events): statements and rows they
returned or changed. From PostgreSQL's pg_stat_user_tables (the worker's connections
closed first, so their counters are flushed): the stub table's sequential scans and index
tuples fetched. Every distinct statement is then EXPLAINed with its first parameters; the
scan nodes are kept.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from bench._common import Row, progress

DUE_EVERY = 100
TOPIC = "bench-flow-sweep"

LOAD_SQL = """
INSERT INTO {stub} (message_id, topic, body, body_digest, expected_groups, status,
                    send_count, max_sends, queue_id, queue_offset, next_resend_at,
                    created_at, updated_at)
SELECT lpad(to_hex(i), 32, '0'), '{topic}', '\\x7b7d'::bytea, '-', '',
       CASE WHEN i % {due} = 0 OR i % 10 = 1 THEN 'UNCONFIRMED' ELSE 'CONFIRMED' END,
       CASE WHEN i % {due} = 0 THEN 0 ELSE 1 END, 16,
       CASE WHEN i % {due} = 0 THEN NULL ELSE (i % 8)::int END,
       CASE WHEN i % {due} = 0 THEN NULL ELSE i / 8 END,
       CASE WHEN i % {due} = 0 THEN t - interval '1 hour'
            WHEN i % 10 = 1 THEN t + interval '1 hour' ELSE NULL END,
       t - interval '2 hours', t - interval '2 hours'
FROM generate_series(0, {n} - 1) AS i,
     (SELECT now() AT TIME ZONE 'utc' AS t) AS clock
"""

STATS_SQL = """
SELECT seq_scan, coalesce(seq_tup_read, 0), coalesce(idx_scan, 0),
       coalesce(idx_tup_fetch, 0), n_tup_upd
FROM pg_stat_user_tables WHERE relname = :name
"""


PGSS_SQL = """
SELECT queryid, calls, rows, query FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query LIKE :like
"""


def _pgss(engine: Any, prefix: str) -> dict[int, tuple[int, int, str]] | None:
    """pg_stat_statements' (calls, rows, query) of the statements naming the run's tables,
    by query id; None when the server does not load it (scripts/ensure-system.sh does)."""
    import sqlalchemy as sa

    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(PGSS_SQL), {"like": f"%{prefix}%"}).all()
    except sa.exc.DBAPIError:
        return None
    return {int(r[0]): (int(r[1]), int(r[2]), str(r[3])) for r in rows}


def _stats(engine: Any, name: str) -> tuple[int, ...]:
    import sqlalchemy as sa

    with engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
        row = conn.execute(sa.text(STATS_SQL), {"name": name}).one()
    return tuple(int(x) for x in row)


def sweep(
    url: str, prefix: str, n: int, sender: Any
) -> tuple[list[Row], list[str], dict[str, Any]]:
    import sqlalchemy as sa

    from outbox import OutboxTables, ResendWorker

    admin = sa.create_engine(url)
    tables = OutboxTables(prefix=prefix)
    stub = tables.stub
    metrics: dict[str, Any] = {
        "resend_sweep_stubs": n,
        "resend_sweep_s": None,
        "resend_sweep_1m_s": None,
        "resend_sweep_only_due": None,
    }
    rows: list[Row] = []
    notes: list[str] = []
    try:
        tables.metadata.create_all(admin)
        indexes = list(stub.indexes)
        with admin.begin() as conn:  # the secondary indexes after the load: faster
            for ix in indexes:
                ix.drop(conn)
        start = time.perf_counter()
        with admin.begin() as conn:
            conn.execute(sa.text(LOAD_SQL.format(stub=stub.name, topic=TOPIC, due=DUE_EVERY, n=n)))
        with admin.begin() as conn:
            for ix in indexes:
                ix.create(conn)
        with admin.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                f"ANALYZE {stub.name}"
            )
        load_s = time.perf_counter() - start
        due = (n + DUE_EVERY - 1) // DUE_EVERY
        progress(f"resend sweep: {n:,} stubs loaded in {load_s:.1f} s, {due:,} due")

        engine = sa.create_engine(url, pool_size=2, max_overflow=0)
        statements: Counter[str] = Counter()
        touched: Counter[str] = Counter()
        first: dict[str, tuple[str, Any]] = {}

        db_time = {"s": 0.0, "t": 0.0}

        @sa.event.listens_for(engine, "before_cursor_execute")
        def started(*_: Any) -> None:
            db_time["t"] = time.perf_counter()

        @sa.event.listens_for(engine, "after_cursor_execute")
        def count(
            conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool
        ) -> None:
            db_time["s"] += time.perf_counter() - db_time["t"]
            kind = " ".join(statement.split())[:90]
            statements[kind] += len(params) if many else 1  # executemany: each execution
            touched[kind] += max(cursor.rowcount, 0)
            first.setdefault(kind, (statement, params))

        sends = {"n": 0}

        class Counted:
            """The producer, its sends counted (the worker pipelines a batch's resends
            through `send_async`; their time is the sweep's time outside the database)."""

            def send(self, message: Any) -> Any:
                sends["n"] += 1
                return sender.send(message)

            def send_async(self, message: Any) -> Any:
                sends["n"] += 1
                return sender.send_async(message)

        worker = ResendWorker(engine, tables, Counted())
        with engine.connect():
            pass  # the pool's first connection outside the clock
        before = _stats(admin, stub.name)
        pgss_before = _pgss(admin, prefix)
        statements.clear()
        touched.clear()
        db_time["s"] = 0.0
        start = time.perf_counter()
        passes = resent = 0
        while True:
            got = worker.run_once()
            passes += 1
            resent += got.resent
            if got.selected == 0:
                break
        sweep_s = time.perf_counter() - start
        db_s = db_time["s"]
        engine.dispose()  # the backends exit: their table counters are flushed
        time.sleep(0.6)
        after = _stats(admin, stub.name)
        pgss_after = _pgss(admin, prefix)
        server: list[tuple[int, int, str]] = []  # (calls, rows, query) during the sweep
        if pgss_before is not None and pgss_after is not None:
            for qid, (calls, nrows, query) in pgss_after.items():
                c0, r0, _ = pgss_before.get(qid, (0, 0, ""))
                if calls > c0 and not query.lstrip().upper().startswith(("EXPLAIN", "ANALYZE")):
                    server.append((calls - c0, nrows - r0, query))
            server.sort(key=lambda x: -x[0])
        seq, seq_read, idx, idx_fetch, upd = (a - b for a, b in zip(after, before, strict=True))
        if server:  # the database's own count (pg_stat_statements)
            n_statements = sum(c for c, _, _ in server)
            n_rows = sum(r for _, r, _ in server)
        else:  # counted on the worker's engine
            n_statements = sum(statements.values())
            n_rows = sum(touched.values())
        # only due rows: no sequential scan of the stub table, and no row written but the
        # due ones, each twice (the claim's stamp, the finalise); the index tuples fetched
        # are reported beside (dead index entries of earlier passes' rows included)
        only_due = seq == 0 and upd <= 2 * due
        metrics.update(
            resend_sweep_s=round(sweep_s, 3),
            resend_sweep_load_s=round(load_s, 2),
            resend_sweep_due=due,
            resend_sweep_resent=resent,
            resend_sweep_passes=passes,
            resend_sweep_sends=sends["n"],
            resend_sweep_db_s=round(db_s, 3),
            resend_sweep_other_s=round(sweep_s - db_s, 3),
            resend_statements_per_msg=round(n_statements / max(resent, 1), 3),
            resend_rows_per_msg=round(n_rows / max(resent, 1), 3),
            resend_stub_seq_scans=seq,
            resend_stub_seq_tup_read=seq_read,
            resend_stub_idx_scans=idx,
            resend_stub_idx_tup_fetch=idx_fetch,
            resend_stub_rows_updated=upd,
            resend_sweep_only_due=only_due,
        )
        if n == 1_000_000:
            metrics["resend_sweep_1m_s"] = round(sweep_s, 3)
        rows.append(
            Row(
                f"resend_sweep {n // 1000}k stubs",
                resent / sweep_s if sweep_s else 0.0,
                0.0,
                f"{sweep_s:.2f} s for {due:,} due ({resent:,} resent, {passes} passes); "
                f"database {db_s:.2f} s, sends and the rest {sweep_s - db_s:.2f} s",
            )
        )
        rows.append(
            Row(
                "resend_db_cost_per_msg",
                0.0,
                0.0,
                f"{n_statements / max(resent, 1):.3f} statements, "
                f"{n_rows / max(resent, 1):.2f} rows each; stub table: {seq} seq scans "
                f"({seq_read:,} tuples), {idx} index scans, {idx_fetch:,} index tuples, "
                f"{upd:,} updates",
                missing=True,
            )
        )
        metrics["resend_stats_source"] = "pg_stat_statements" if server else "engine events"
        notes.append(
            f"resend sweep statements ({n_statements} in {passes} passes, "
            + (
                "pg_stat_statements: calls, rows"
                if server
                else "pg_stat_statements not loaded: counted on the worker's engine"
            )
            + "; plans from EXPLAIN):"
        )
        for calls, nrows, query in server:
            notes.append(f"  {calls:>6} x {' '.join(query.split())[:90]} ...  rows {nrows:,}")
        for kind, c in statements.most_common():
            plan = _explain(admin, *first[kind])
            notes.append(f"  {c:>6} x {kind} ...  rows {touched[kind]:,}; plan: {plan}")
    finally:
        tables.metadata.drop_all(admin)
        admin.dispose()
    return rows, notes, metrics


def _explain(engine: Any, statement: str, params: Any) -> str:
    """The scan nodes of EXPLAIN (not ANALYZE: an UPDATE is planned, not run)."""
    if not statement.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE")):
        return "-"
    if isinstance(params, list | tuple) and params and not isinstance(params[0], str | int):
        params = params[0]  # executemany: the first row's
    if not isinstance(params, list | tuple):
        params = dict(params or {})
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("EXPLAIN " + statement, params)
        lines = [r[0].strip().lstrip("-> ").strip() for r in cur.fetchall()]
        raw.rollback()
    except Exception as exc:
        raw.rollback()
        return f"({type(exc).__name__})"
    finally:
        raw.close()
    scans = [ln.split("  (")[0] for ln in lines if "Scan" in ln]
    return "; ".join(scans) or lines[0].split("  (")[0]
