"""`guard_from_environment`: the default guard of `idempotent=True`, on the real databases."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from idempotency import IdempotencyGuard
from idempotency.environment import guard_from_environment
from outbox import OutboxTables
from reliable import ConsumeResult, ReceivedMessage
from reliable.errors import ConfigurationError
from tests.conftest import REDIS_URL


def received() -> ReceivedMessage:
    return ReceivedMessage(
        message_id=uuid.uuid4().hex.upper(),
        topic="OrderCreated",
        body=b'{"order": 1}',
        queue_id=0,
        queue_offset=3,
    )


@pytest.mark.parametrize(
    "env", [{}, {"RELIABLE_DATABASE_URL": ""}, {"RELIABLE_REDIS_URL": REDIS_URL}]
)
def test_without_a_database_url_it_names_the_variable(env: dict[str, str]) -> None:
    with pytest.raises(ConfigurationError, match="RELIABLE_DATABASE_URL") as info:
        guard_from_environment(env)
    assert "idempotent=guard" in str(info.value)


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
@pytest.mark.parametrize("with_redis", [False, True], ids=["database-only", "redis"])
def test_with_the_tables_it_builds_a_working_guard(
    db_url: str,
    engine: sa.Engine,
    tables: OutboxTables,
    business: sa.Table,
    table_prefix: str,
    with_redis: bool,
) -> None:
    env = {"RELIABLE_DATABASE_URL": db_url, "RELIABLE_TABLE_PREFIX": table_prefix}
    if with_redis:
        env["RELIABLE_REDIS_URL"] = REDIS_URL
    guard = guard_from_environment(env)
    try:
        assert isinstance(guard, IdempotencyGuard)
        assert guard.tables.stub.name == f"{table_prefix}message_stub"
        assert (guard.leases is not None) is with_redis
        runs: list[str] = []

        def handler(*, session: Session) -> None:
            run = uuid.uuid4().hex
            runs.append(run)
            session.execute(sa.insert(business).values(run=run, message_id="m"))

        message = received()
        assert guard.process(message, "inventory", handler) is ConsumeResult.SUCCESS
        assert guard.process(message, "inventory", handler) is ConsumeResult.SUCCESS
        assert len(runs) == 1
        with engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(business)).scalar() == 1
            confirmations = conn.execute(sa.select(tables.confirmation.c.message_id)).all()
        assert [c.message_id for c in confirmations] == [message.message_id]
    finally:
        guard.engine.dispose()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_without_the_tables_it_names_the_fix_on_one_line(
    db_url: str, engine: sa.Engine, table_prefix: str
) -> None:
    engine.connect().close()  # the database exists, the tables do not
    env = {"RELIABLE_DATABASE_URL": db_url, "RELIABLE_TABLE_PREFIX": f"{table_prefix}none_"}
    with pytest.raises(ConfigurationError) as info:
        guard_from_environment(env)
    text = str(info.value)
    assert text.startswith("idempotent=True: outbox tables missing") and "\n" not in text
    assert "--ensure-schema" in text


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_connections_the_server_ended_cost_no_message_a_retry(
    db_url: str,
    engine: sa.Engine,
    tables: OutboxTables,
    business: sa.Table,
    table_prefix: str,
) -> None:
    """The default guard's engine does not ping before each checkout; when the server ended
    its pooled connections (a restart), the next message still succeeds at once: the dead
    connection is found at the guard's first step and that step runs again on a new one."""
    guard = guard_from_environment(
        {"RELIABLE_DATABASE_URL": db_url, "RELIABLE_TABLE_PREFIX": table_prefix}
    )
    runs: list[str] = []

    def handler(*, session: Session) -> None:
        runs.append(uuid.uuid4().hex)
        session.execute(sa.insert(business).values(run=runs[-1], message_id="m"))

    try:
        assert guard.process(received(), "inventory", handler) is ConsumeResult.SUCCESS
        with guard.engine.connect() as conn:  # a pooled connection, to be ended
            pid = conn.execute(sa.text("select pg_backend_pid()")).scalar()
        with engine.connect() as admin:
            ended = admin.execute(sa.text("select pg_terminate_backend(:p)"), {"p": pid}).scalar()
            admin.commit()
        assert ended is True
        assert guard.process(received(), "inventory", handler) is ConsumeResult.SUCCESS
        assert len(runs) == 2
        with engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(business)).scalar() == 2
    finally:
        guard.engine.dispose()
