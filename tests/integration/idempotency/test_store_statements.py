"""`GuardStore` on every database: a receipt over a log row an earlier delivery left takes
the lease in the same transaction (on MariaDB without a savepoint: InnoDB rolls back the
failed INSERT alone), and a confirmation settles the stub of a single group in one
statement, a stub of two groups only once both confirmed."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from idempotency.store import ConfirmStatus, GuardStore
from outbox import Outbox, OutboxConfig, OutboxTables, StubStatus, declare_groups
from reliable import Message, ReceivedMessage

NOW = datetime(2026, 12, 1, 4, 0, 0)
UNTIL = NOW + timedelta(seconds=60)


def statements(engine: sa.Engine) -> list[str]:
    sent: list[str] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement.split(None, 1)[0].upper())

    return sent


def stubbed(engine: sa.Engine, tables: OutboxTables, mid: str, groups: list[str]) -> None:
    topic = f"T{mid}"
    declare_groups(engine, tables, topic, groups)
    outbox = Outbox(tables, None, config=OutboxConfig(send_after_commit=False))  # type: ignore[arg-type]
    with Session(engine) as session, session.begin():
        outbox.publish(session, Message(topic=topic, body=b"x", message_id=mid))


def status(engine: sa.Engine, tables: OutboxTables, mid: str) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                sa.select(tables.stub.c.status).where(tables.stub.c.message_id == mid)
            ).scalar_one()
        )


def test_a_receipt_over_an_earlier_log_row_takes_its_lease(
    engine: sa.Engine, tables: OutboxTables
) -> None:
    store = GuardStore(engine, tables)
    message = ReceivedMessage(message_id="m1", topic="T", body=b"x", queue_id=0, queue_offset=7)
    free = lambda known: True  # noqa: E731
    assert store.receive(message, "g", "first", NOW, UNTIL, log_receipt=True, may_claim=free)[1]
    store.release("m1", "g", "first")  # the worker gave up: the row stays, its lease gone
    sent = statements(engine)
    known, claimed = store.receive(
        message, "g", "second", NOW, UNTIL, log_receipt=True, may_claim=free
    )
    assert claimed and not known.confirmed
    assert "SAVEPOINT" not in sent  # PostgreSQL, SQLite: ON CONFLICT; MariaDB: none needed
    log = tables.consumption_log
    with engine.connect() as conn:
        assert conn.execute(sa.select(log.c.lease_token, log.c.queue_offset)).all() == [
            ("second", 7)
        ]
    # the lease is held: a third worker is refused, and the second confirms
    assert not store.receive(message, "g", "third", NOW, UNTIL, log_receipt=True, may_claim=free)[1]
    with Session(engine) as session, session.begin():
        assert store.confirm(session, message, "g", "second", "d", "CONSUMED", NOW) is (
            ConfirmStatus.CONFIRMED
        )


def test_a_single_groups_stub_is_settled_in_one_statement_two_groups_by_the_second(
    engine: sa.Engine, tables: OutboxTables
) -> None:
    store = GuardStore(engine, tables)
    stubbed(engine, tables, "one", ["g"])
    stubbed(engine, tables, "two", ["a", "b"])

    def confirm(mid: str, group: str) -> list[str]:
        message = ReceivedMessage(
            message_id=mid, topic=f"T{mid}", body=b"x", queue_id=0, queue_offset=0
        )
        store.receive(message, group, "tok", NOW, UNTIL, log_receipt=True, may_claim=lambda k: True)
        sent = statements(engine)
        with Session(engine) as session, session.begin():
            assert store.confirm(session, message, group, "tok", "d", "CONSUMED", NOW) is (
                ConfirmStatus.CONFIRMED
            )
        return list(sent)  # what the confirmation sent, not the reads after it

    sent = confirm("one", "g")
    assert status(engine, tables, "one") == StubStatus.CONFIRMED.value
    if engine.dialect.name != "postgresql":  # there: one statement for all of step 5
        assert sent == ["DELETE", "UPDATE", "INSERT"]  # no SELECT ... FOR UPDATE first
    confirm("two", "a")
    assert status(engine, tables, "two") == StubStatus.UNCONFIRMED.value
    confirm("two", "b")
    assert status(engine, tables, "two") == StubStatus.CONFIRMED.value
