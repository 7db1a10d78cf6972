"""The stub table's indexes: as few entries per stub as the queries allow.

Each stub row is written three times (its INSERT, the send's record, the CONFIRMED
update), and PostgreSQL adds an entry to every index each time. Where partial indexes
exist (PostgreSQL, SQLite), the resend index holds only UNCONFIRMED stubs and the claim
index only claimed ones; the resend sweep's claim must still read the resend index, never
the whole table. MariaDB has no partial indexes: there both hold every row."""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlalchemy as sa

from outbox import OutboxTables
from outbox.claim import claim_batch, due_clause

NOW = datetime(2026, 12, 1, 1, 0, 0)


def stub_rows(n: int) -> list[dict[str, object]]:
    """`n` stubs: one in ten UNCONFIRMED and due, the rest CONFIRMED."""
    rows = []
    for i in range(n):
        due = i % 10 == 0
        rows.append(
            {
                "message_id": f"m{i}",
                "topic": "T",
                "body": b"x",
                "body_digest": "d",
                "expected_groups": "g",
                "status": "UNCONFIRMED" if due else "CONFIRMED",
                "send_count": 1,
                "max_sends": 16,
                "next_resend_at": NOW - timedelta(seconds=i),
                "created_at": NOW,
                "updated_at": NOW,
            }
        )
    return rows


def test_partial_where_the_database_has_them(engine: sa.Engine, tables: OutboxTables) -> None:
    indexes = {
        ix["name"].removeprefix(tables.prefix): ix
        for ix in sa.inspect(engine).get_indexes(tables.stub.name)
    }
    # (MariaDB and SQLite list the unique message id among them)
    assert set(indexes) - {"uq_stub_message_id"} == {
        "ix_stub_resend",
        "ix_stub_created",
        "ix_stub_claimed",
    }
    assert indexes["ix_stub_resend"]["column_names"] == ["status", "next_resend_at"]
    name = engine.dialect.name
    if name in ("postgresql", "sqlite"):
        with engine.connect() as conn:
            if name == "postgresql":
                defs = dict(
                    conn.execute(
                        sa.text("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = :t"),
                        {"t": tables.stub.name},
                    ).all()
                )
            else:
                defs = dict(
                    conn.execute(
                        sa.text("SELECT name, sql FROM sqlite_master WHERE tbl_name = :t"),
                        {"t": tables.stub.name},
                    ).all()
                )
        assert "WHERE" in defs[f"{tables.prefix}ix_stub_resend"]
        assert "'UNCONFIRMED'" in defs[f"{tables.prefix}ix_stub_resend"]
        assert "IS NOT NULL" in defs[f"{tables.prefix}ix_stub_claimed"]
        assert "WHERE" not in (defs[f"{tables.prefix}ix_stub_created"] or "")


def test_the_claim_reads_the_resend_index(engine: sa.Engine, tables: OutboxTables) -> None:
    with engine.begin() as conn:
        conn.execute(sa.insert(tables.stub), stub_rows(2000))
    name = engine.dialect.name
    picked = (
        sa.select(tables.stub.c.id)
        .where(due_clause(tables, NOW))
        .order_by(tables.stub.c.next_resend_at)
        .limit(50)
    )
    sql = str(picked.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
    with engine.connect() as conn:
        if name == "postgresql":
            conn.exec_driver_sql(f"ANALYZE {tables.stub.name}")
            conn.exec_driver_sql("SET enable_seqscan = off")  # an index the planner can use?
            plan = " ".join(r[0] for r in conn.exec_driver_sql(f"EXPLAIN {sql}"))
        elif name == "sqlite":
            plan = " ".join(str(r[-1]) for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}"))
        else:
            plan = " ".join(str(r) for r in conn.exec_driver_sql(f"EXPLAIN {sql}"))
    assert f"{tables.prefix}ix_stub_resend" in plan, plan
    # and the claim takes exactly the due ones, oldest first
    with engine.begin() as conn:
        claimed = claim_batch(
            conn, tables, token="w1", now=NOW, until=NOW + timedelta(minutes=1), limit=500
        )
    assert sorted(r["message_id"] for r in claimed) == sorted(f"m{i}" for i in range(0, 2000, 10))
    with engine.connect() as conn:
        left = conn.execute(
            sa.select(sa.func.count()).where(due_clause(tables, NOW + timedelta(minutes=2)))
        ).scalar_one()
    assert left == 200  # claimed stubs stay UNCONFIRMED, due again once the claim lapses
