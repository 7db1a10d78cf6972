"""Schema management: tables from an older version gain the new columns and indexes."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from outbox import Outbox, OutboxTables
from outbox.schema import ensure_schema
from reliable import Message

ADDED = {
    "message_stub": {"claimed_by", "group_positions"},
    "confirmation": {"body_digest", "outcome"},
    "consumption_log": {"lease_token", "lease_until"},
}


def test_older_tables_are_completed_and_a_second_run_changes_nothing(
    engine: sa.Engine, table_prefix: str, sender
) -> None:  # type: ignore[no-untyped-def]
    table_prefix = f"{table_prefix}o_"
    current = OutboxTables(prefix=table_prefix)
    old_md = sa.MetaData()
    for table in current.metadata.sorted_tables:  # the first released shape of the tables
        short = table.name[len(table_prefix) :]
        cols = [
            sa.Column(c.name, c.type, nullable=c.nullable, primary_key=c.primary_key)
            for c in table.columns
            if c.name not in ADDED.get(short, set())
        ]
        sa.Table(table.name, old_md, *cols)
    old_md.create_all(engine)
    try:
        report = ensure_schema(engine, current)
        assert report.created_tables == []
        assert sorted(report.added_columns) == sorted(
            f"{table_prefix}{t}.{c}" for t, cols in ADDED.items() for c in cols
        )
        assert f"{table_prefix}ix_stub_claimed" in report.created_indexes
        assert not ensure_schema(engine, current).changed
        inspector = sa.inspect(engine)
        for short, cols in ADDED.items():
            names = {c["name"] for c in inspector.get_columns(f"{table_prefix}{short}")}
            assert cols <= names
        outbox = Outbox(current, sender)  # the completed tables work
        with Session(engine) as session, session.begin():
            mid = outbox.publish(session, Message(topic="T", body=b"x"))
        assert sender.counts() == {mid: 1}
    finally:
        old_md.drop_all(engine)


def test_missing_tables_are_created(engine: sa.Engine, table_prefix: str) -> None:
    tables = OutboxTables(prefix=f"{table_prefix}n_")
    try:
        report = ensure_schema(engine, tables)
        assert len(report.created_tables) == 4 and not ensure_schema(engine, tables).changed
    finally:
        tables.drop_all(engine)
