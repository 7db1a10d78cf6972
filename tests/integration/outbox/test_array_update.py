"""`outbox.stubs.ArrayUpdate` on PostgreSQL: one statement writes a batch of stubs, each
row its own values (NULLs and timestamps included), whatever the batch's size, and its
text is the same for every size (SQLAlchemy compiles it once)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from outbox import OutboxTables
from outbox.stubs import ArrayUpdate, stub_values
from reliable import Message
from tests.conftest import POSTGRES_URL
from tests.integration.dbkit import engine_for, outbox_tables

KEYS = ("queue_id", "queue_offset", "broker_msg_id", "last_error", "next_resend_at")
T0 = datetime(2026, 11, 29, 12, 0, 0)


@pytest.fixture
def pg(table_prefix: str) -> Iterator[tuple[sa.Engine, OutboxTables]]:
    with engine_for(POSTGRES_URL) as engine, outbox_tables(engine, table_prefix) as t:
        yield engine, t


def _stubs(engine: sa.Engine, tables: OutboxTables, n: int) -> list[str]:
    messages = [Message(topic="T", body=b"x") for _ in range(n)]
    rows = [
        stub_values(m, expected_groups=(), max_sends=16, now=T0, next_resend_at=T0)
        for m in messages
    ]
    with engine.begin() as conn:
        conn.execute(sa.insert(tables.stub), rows)
    return [m.message_id for m in messages]


def _row(mid: str, i: int) -> dict[str, object]:
    failed = i % 3 == 2  # a failure's row: no queue position, an error
    return {
        "b_message_id": mid,
        "v_queue_id": None if failed else i % 4,
        "v_queue_offset": None if failed else 1_000_000_000_000 + i,  # past 32 bits
        "v_broker_msg_id": None if failed else f"{i:032X}",
        "v_last_error": "ConnectionError: down" if failed else None,
        "v_next_resend_at": T0 + timedelta(seconds=i),
    }


def test_each_stub_of_a_batch_gets_its_own_values_at_any_batch_size(pg) -> None:
    engine, tables = pg
    stub = tables.stub
    update = ArrayUpdate(stub, "message_id", KEYS, also={"send_count": stub.c.send_count + 1})
    ids = _stubs(engine, tables, 60)
    untouched = ids[-1]
    expected: dict[str, dict[str, object]] = {}
    start = 0
    for size in (1, 2, 50):  # the same statement object for every size
        batch = [_row(mid, start + j) for j, mid in enumerate(ids[start : start + size])]
        with engine.begin() as conn:
            assert conn.execute(update.statement, update.params(batch)).rowcount == size
        expected.update({row["b_message_id"]: row for row in batch})  # type: ignore[misc]
        start += size
    with engine.connect() as conn:
        got = {r["message_id"]: r for r in conn.execute(sa.select(stub)).mappings()}
    for mid, row in expected.items():
        for key in KEYS:
            assert got[mid][key] == row[f"v_{key}"], (mid, key)
        assert got[mid]["send_count"] == 1
    assert got[untouched]["send_count"] == 0 and got[untouched]["queue_id"] is None
    assert got[untouched]["next_resend_at"] == T0


def test_the_statement_text_does_not_depend_on_the_batch() -> None:
    tables = OutboxTables(prefix="x_")
    update = ArrayUpdate(tables.stub, "id", ("claimed_by", "updated_at"))
    sql = str(update.statement.compile(dialect=postgresql.dialect()))
    assert "unnest(" in sql and "VALUES" not in sql
    small = update.params([{"b_id": 1, "v_claimed_by": None, "v_updated_at": T0}])
    assert small == {"a_b_id": [1], "a_v_claimed_by": [None], "a_v_updated_at": [T0]}
