"""A repair never removes the evidence that made a stub lost, and a log row left behind by
a group that confirmed makes nothing "in processing".

The seed is the smallest that showed both: without a committed-offset snapshot a group's
watermark is the greatest offset in its consumption log, stale rows included, and a repair
deletes stale rows.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from outbox.models import OutboxTables
from outbox.reconcile import RepairAction, audit_table
from reliable_cli import main
from reliable_cli.exit_codes import ExitCode

from .conftest import ALL_BACKENDS

pytestmark = pytest.mark.spark

CREATED = datetime(2026, 1, 1, 8, 0, 0)


def _stub(mid: str, offset: int, groups: str, status: str = "UNCONFIRMED") -> dict[str, object]:
    return {
        "message_id": mid,
        "topic": "orders",
        "body": b"x",
        "body_digest": "d",
        "expected_groups": groups,
        "status": status,
        "send_count": 1,
        "max_sends": 16,
        "queue_id": 0,
        "queue_offset": offset,
        "created_at": CREATED,
        "updated_at": CREATED,
    }


def _log(mid: str, group: str, offset: int) -> dict[str, object]:
    return {
        "message_id": mid,
        "consumer_group": group,
        "topic": "orders",
        "queue_id": 0,
        "queue_offset": offset,
        "created_at": CREATED + timedelta(minutes=1),
    }


def _run(
    capsys: pytest.CaptureFixture[str], db_url: str, prefix: str, *extra: str
) -> tuple[int, dict[str, object]]:
    rc = main(["reconcile", "--db", db_url, "--prefix", prefix, "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("db_url", ALL_BACKENDS, indirect=True)
def test_repair_keeps_the_evidence_of_a_loss(spark, db_url, engine, table_prefix, capsys):
    tables = OutboxTables(prefix=table_prefix)
    tables.create_all(engine)
    with engine.begin() as conn:
        # P (offset 20): confirmed by ledger, its log row left behind
        conn.execute(
            sa.insert(tables.stub),
            [_stub("P", 20, "ledger", "CONFIRMED"), _stub("Q", 10, "ledger")],
        )
        conn.execute(
            sa.insert(tables.confirmation),
            [
                {
                    "message_id": "P",
                    "consumer_group": "ledger",
                    "topic": "orders",
                    "confirmed_at": CREATED + timedelta(minutes=2),
                }
            ],
        )
        # Q (offset 10): no log row, no confirmation: ledger passed it (it received 20)
        conn.execute(sa.insert(tables.consumption_log), [_log("P", "ledger", 20)])

    rc, first = _run(capsys, db_url, table_prefix)
    assert rc == ExitCode.UNACCOUNTED
    assert first["stubs"]["lost"] == 1  # type: ignore[index]
    assert first["log_rows"]["stale"] == 1  # type: ignore[index]

    rc, repaired = _run(capsys, db_url, table_prefix, "--repair")
    assert rc == ExitCode.UNACCOUNTED
    rep = repaired["repair"]
    assert (rep["marked_due"], rep["closed_stale"], rep["skipped"]) == (1, 1, 0)  # type: ignore[index]
    with engine.connect() as conn:  # the stale row is gone from the log ...
        assert (
            conn.execute(
                sa.select(sa.func.count()).select_from(tables.consumption_log)
            ).scalar_one()
            == 0
        )
        audit = audit_table(sa.MetaData(), table_prefix)
        kept = conn.execute(
            sa.select(audit.c.action, audit.c.message_id, audit.c.before).order_by(audit.c.id)
        ).all()
    # ... and kept whole in the audit table, with the stub marked due
    assert {(r.action, r.message_id) for r in kept} == {
        (RepairAction.MARK_RESEND_DUE.value, "Q"),
        (RepairAction.CLOSE_STALE_LOG.value, "P"),
    }
    deleted = next(json.loads(r.before) for r in kept if r.message_id == "P")
    assert (deleted["topic"], deleted["queue_id"], deleted["queue_offset"]) == ("orders", 0, 20)

    # nothing resent, Q still unconfirmed: still lost, the watermark from the audit
    rc, after = _run(capsys, db_url, table_prefix)
    assert rc == ExitCode.UNACCOUNTED
    assert after["stubs"]["lost"] == 1 and after["certificate"]["clean"] is False  # type: ignore[index]
    named = after["certificate"]["unaccounted_messages"]  # type: ignore[index]
    assert [u["message_id"] for u in named] == ["Q"]
    (lag,) = [q for q in after["queues"] if q["queue_id"] == 0]  # type: ignore[attr-defined]
    assert lag["lag"]["ledger"]["watermark"] == 20
    assert lag["lag"]["ledger"]["source"] == "audit"

    # resent to a later offset the group has not reached: still unaccounted (marked due,
    # not confirmed) -- and a second repair has nothing to mark again
    with engine.begin() as conn:
        conn.execute(
            sa.update(tables.stub)
            .where(tables.stub.c.message_id == "Q")
            .values(queue_offset=30, send_count=2, next_resend_at=CREATED + timedelta(days=400))
        )
    rc, resent = _run(capsys, db_url, table_prefix, "--repair")
    assert rc == ExitCode.UNACCOUNTED
    named = resent["certificate"]["unaccounted_messages"]  # type: ignore[index]
    assert [(u["message_id"], u["reason"]) for u in named] == [
        ("Q", "marked due by a repair; not confirmed since")
    ]
    rep = resent["repair"]
    assert (rep["marked_due"], rep["already_due"], rep["skipped"]) == (0, 0, 0)  # type: ignore[index]

    # confirmed at last: clean
    with engine.begin() as conn:
        conn.execute(
            sa.insert(tables.confirmation),
            [
                {
                    "message_id": "Q",
                    "consumer_group": "ledger",
                    "topic": "orders",
                    "confirmed_at": CREATED + timedelta(minutes=9),
                }
            ],
        )
    rc, clean = _run(capsys, db_url, table_prefix)
    assert rc == ExitCode.OK and clean["certificate"]["clean"] is True  # type: ignore[index]


@pytest.mark.parametrize("db_url", ALL_BACKENDS, indirect=True)
def test_a_stale_row_makes_nothing_in_processing(spark, db_url, engine, table_prefix, capsys):
    tables = OutboxTables(prefix=table_prefix)
    tables.create_all(engine)
    groups = "ledger,audit"
    with engine.begin() as conn:
        # queue 0: audit holds a row for U (offset 3); S (5) only has the row ledger left
        # behind after confirming: audit has not reached S, so S is backlogged
        # queue 1: the same for T (6), but audit holds a row for V (9): it passed T
        conn.execute(
            sa.insert(tables.stub),
            [
                _stub("U", 3, groups),
                _stub("S", 5, groups),
                {**_stub("T", 6, groups), "queue_id": 1},
                {**_stub("V", 9, groups), "queue_id": 1},
            ],
        )
        conn.execute(
            sa.insert(tables.confirmation),
            [
                {
                    "message_id": m,
                    "consumer_group": "ledger",
                    "topic": "orders",
                    "confirmed_at": CREATED + timedelta(minutes=2),
                }
                for m in ("U", "S", "T", "V")
            ],
        )
        conn.execute(
            sa.insert(tables.consumption_log),
            [
                _log("U", "audit", 3),
                _log("S", "ledger", 5),
                {**_log("T", "ledger", 6), "queue_id": 1},
                {**_log("V", "audit", 9), "queue_id": 1},
            ],
        )
    report = f"{table_prefix}report"
    rc, doc = _run(capsys, db_url, table_prefix, "--report-table", report)
    assert rc == ExitCode.UNACCOUNTED
    stubs = doc["stubs"]
    assert (stubs["in_processing"], stubs["backlogged"], stubs["lost"]) == (2, 1, 1)  # type: ignore[index]
    with engine.connect() as conn:
        t = sa.Table(report, sa.MetaData(), autoload_with=conn)
        rows = conn.execute(
            sa.select(t.c.message_id, t.c["class"], t.c.reason).where(t.c.kind == "stub")
        ).all()
    verdicts = {r.message_id: (r[1], r.reason) for r in rows}
    assert verdicts["U"][0] == verdicts["V"][0] == "IN_PROCESSING"
    assert verdicts["S"] == ("BACKLOGGED", "offset not reached yet")
    assert verdicts["T"] == ("LOST", "passed by audit without a log row")


@pytest.mark.parametrize("db_url", ALL_BACKENDS, indirect=True)
def test_report_table_reads_back_through_sqlalchemy(spark, db_url, engine, table_prefix):
    """The detail rows Spark appends have the report table's declared types on every
    database: SQLAlchemy reads them back as datetimes, booleans and integers."""
    from outbox.reconcile import ReconcileOptions, reconcile
    from outbox.reconcile.details import report_table

    from .dataset import NOW, build

    seeded = build(table_prefix)
    seeded.insert(engine)
    name = f"{table_prefix}report"
    result = reconcile(
        ReconcileOptions(
            db_url=db_url, table_prefix=table_prefix, report_table=name, report_all=True
        ),
        spark=spark,
        now=NOW,
    )
    table = report_table(sa.MetaData(), name)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(table)).mappings().all()
    assert len(rows) == result.summary.total_stubs + sum(result.summary.log_rows.values())
    stubs = {r["message_id"]: r for r in rows if r["kind"] == "stub"}
    assert set(stubs) == set(seeded.created)
    for mid, at in seeded.created.items():  # the very instant, as a datetime
        assert stubs[mid]["created_at"] == at, mid
    for r in rows:
        assert isinstance(r["in_window"], bool)
        assert r["queue_offset"] is None or isinstance(r["queue_offset"], int)
        assert r["send_count"] is None or isinstance(r["send_count"], int)
        assert r["run_id"] == result.run_id
    log_rows = [r for r in rows if r["kind"] == "log"]
    assert all(r["created_at"] == NOW - timedelta(minutes=20) for r in log_rows)
