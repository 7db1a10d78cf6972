"""Tables in a named database schema (PostgreSQL): publish, consume, resend all work."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from idempotency import GuardConfig, IdempotencyGuard
from outbox import Outbox, OutboxTables, ResendWorker, StubStatus, declare_groups
from outbox.schema import ensure_schema
from reliable import ConsumeResult, Message, ReceivedMessage


@pytest.fixture
def schema(engine: sa.Engine, table_prefix: str) -> Iterator[str]:
    name = f"{table_prefix}schema"
    with engine.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{name}"'))
    yield name
    with engine.begin() as conn:
        conn.execute(sa.text(f'DROP SCHEMA "{name}" CASCADE'))


@pytest.mark.redis
@pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_tables_in_a_named_schema(
    engine,
    schema,
    sender,
    redis_client,
    offsets,  # type: ignore[no-untyped-def]
    clock,
    table_prefix,
) -> None:
    tables = OutboxTables(prefix="app_", schema=schema)
    assert len(ensure_schema(engine, tables).created_tables) == 4
    declare_groups(engine, tables, "T", ["g"])
    with Session(engine) as session, session.begin():
        mid = Outbox(tables, sender, clock=clock).publish(session, Message(topic="T", body=b"x"))
    guard = IdempotencyGuard(
        engine, tables, redis_client, config=GuardConfig(key_prefix=f"{table_prefix}:")
    )
    message = ReceivedMessage(message_id=mid, topic="T", body=b"x", queue_id=0, queue_offset=0)
    assert guard.process(message, "g", lambda **_: None) is ConsumeResult.SUCCESS
    clock.advance(hours=1)
    assert (
        ResendWorker(engine, tables, sender, offsets=offsets, clock=clock).run_once().selected == 0
    )  # CONFIRMED by the guard, in the named schema
    with engine.connect() as conn:
        status = conn.execute(sa.text(f'SELECT status FROM "{schema}".app_message_stub')).scalar()
    assert status == StubStatus.CONFIRMED.value
