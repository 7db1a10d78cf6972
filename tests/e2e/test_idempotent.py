"""`idempotent=`: the idempotency guard (real Redis, real database) behind a decorated
handler: a message sent twice with one id runs the handler once."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import sqlalchemy as sa

from idempotency import IdempotencyGuard
from outbox.models import OutboxTables
from reliable import (
    ConfigurationError,
    Message,
    Producer,
    ReceivedMessage,
    Transport,
    Worker,
    handler,
    new_message_id,
)
from tests.e2e.helpers import FAST, stays, wait_until


def _run_twice(
    transport: Transport, guard: Any, group: str, wants_session: bool = True
) -> tuple[list[str], list[Any]]:
    ran: list[str] = []
    sessions: list[Any] = []
    lock = threading.Lock()

    if wants_session:

        @handler("payments", group=group, idempotent=guard, **FAST)
        def pay(message: ReceivedMessage, session: Any) -> None:
            with lock:
                ran.append(message.message_id)
                sessions.append(session)
    else:

        @handler("payments", group=group, idempotent=guard, **FAST)
        def pay(message: ReceivedMessage) -> None:  # declares no session: gets none
            with lock:
                ran.append(message.message_id)

    mid = new_message_id()
    with Worker(pay, transport=transport), Producer(transport) as producer:
        producer.send(Message("payments", b"pay 10", message_id=mid))
        producer.send(Message("payments", b"pay 10", message_id=mid))  # a producer retry
        wait_until(lambda: len(ran) == 1, what="the first run")
        assert stays(lambda: len(ran) == 1, 1.0)
    return ran, sessions


@pytest.mark.redis
def test_guard_object_runs_a_duplicate_once(
    transport: Transport, redis_client: Any, sqlite_url: str, table_prefix: str
) -> None:
    engine = sa.create_engine(sqlite_url)
    tables = OutboxTables(prefix=table_prefix)
    tables.create_all(engine)
    guard = IdempotencyGuard(engine, tables, redis_client, config=None)
    ran, sessions = _run_twice(transport, guard, "pay-g")
    assert len(ran) == 1 and sessions[0] is not None  # the handler got the guard's session


@pytest.mark.redis
def test_guarded_handler_without_a_session_parameter_runs_once(
    transport: Transport, redis_client: Any, sqlite_url: str, table_prefix: str
) -> None:
    engine = sa.create_engine(sqlite_url)
    tables = OutboxTables(prefix=table_prefix)
    tables.create_all(engine)
    guard = IdempotencyGuard(engine, tables, redis_client, config=None)
    ran, sessions = _run_twice(transport, guard, "pay-ns", wants_session=False)
    assert len(ran) == 1 and sessions == []


@pytest.mark.redis
def test_idempotent_true_builds_the_guard_from_configuration(
    transport: Transport, sqlite_url: str, table_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import REDIS_URL

    engine = sa.create_engine(sqlite_url)
    OutboxTables(prefix=table_prefix).create_all(engine)
    monkeypatch.setenv("RELIABLE_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("RELIABLE_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("RELIABLE_TABLE_PREFIX", table_prefix)
    ran, _ = _run_twice(transport, True, "pay-default-g")
    assert len(ran) == 1


def test_idempotent_true_without_configuration_fails_at_start(
    transport: Transport, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RELIABLE_DATABASE_URL", raising=False)

    @handler("payments", group="pay-none", idempotent=True)
    def pay(message: ReceivedMessage, session: Any) -> None: ...

    with pytest.raises(ConfigurationError, match="RELIABLE_DATABASE_URL"):
        pay.consumer(transport)
