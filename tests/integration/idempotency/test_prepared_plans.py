"""The plans PostgreSQL keeps for the prepared hot statements (the guard's receipt and
confirmation, the stub's INSERT and the send's record). A generic plan can be made
while the tables are empty and then kept for a connection's life: each must still find
its row through the message id's own index, never by reading a range of stubs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa

from idempotency.store import GuardStore
from outbox import Outbox, OutboxTables
from outbox.prepared import Prepared
from reliable import Message

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)

NOW = datetime(2026, 11, 30, 4, 0, 0)


class Refusing:
    """A sender whose every send fails: the stub stays, the send's record is written."""

    def send(self, message: Message) -> Any:
        raise ConnectionError("broker unreachable")


def scans(engine: sa.Engine, prepared: Prepared, params: dict[str, Any]) -> list[str]:
    with engine.connect() as conn:
        plan = prepared.generic_plan(conn, params)
        # rolled back, yet still prepared on the connection (PREPARE is not transactional)
        prepared.execute(conn, params)
        conn.rollback()
    assert prepared.enabled
    return [line.strip() for line in plan if "Scan" in line or "Cond" in line]


def test_every_prepared_plan_finds_its_row_by_the_message_id(
    engine: sa.Engine, tables: OutboxTables
) -> None:
    store = GuardStore(engine, tables)
    outbox = Outbox(tables, Refusing())
    stub, log, conf = tables.stub.name, tables.consumption_log.name, tables.confirmation.name
    confirm = scans(
        engine,
        store._confirm_pg_sql,
        dict(
            mid="m", grp="g", tok="t", conf_topic="T", now=NOW, digest="d", conf_outcome="SUCCESS"
        ),
    )
    assert f"Index Scan using {tables.prefix}uq_stub_message_id on {stub}" in " ".join(confirm)
    assert f"Index Scan using {tables.prefix}pk_consumption_log on {log}" in " ".join(confirm)
    receive = scans(
        engine,
        store._receive_pg_sql,
        dict(mid="m", grp="g", topic="T", qid=0, qoff=1, now=NOW, ltok="t", luntil=NOW),
    )
    assert f"Index Scan using {tables.prefix}pk_confirmation on {conf}" in " ".join(receive)
    assert f"Index Scan using {tables.prefix}uq_stub_message_id on {stub}" in " ".join(receive)
    record = scans(
        engine,
        outbox._record_failed_pg,
        dict(b_mid="m", last_error="x", next_resend_at=NOW, updated_at=NOW),
    )
    assert f"Index Scan using {tables.prefix}uq_stub_message_id on {stub}" in " ".join(record)
    for plan in (confirm, receive, record):
        assert not [line for line in plan if "Seq Scan" in line or "ix_stub_resend" in line]
