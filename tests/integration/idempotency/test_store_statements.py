"""`GuardStore` on every database: a receipt over a log row an earlier delivery left takes
the lease in the same transaction (on MariaDB without a savepoint: InnoDB rolls back the
failed INSERT alone); a batch's receipts are one read and one INSERT; a confirmation
settles the stub of a single group in one statement, a stub of two groups only once both
confirmed."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from idempotency.store import ConfirmStatus, GuardStore
from outbox import Outbox, OutboxConfig, OutboxTables, StubStatus, declare_groups
from reliable import Message, ReceivedMessage
from tests.integration.dbkit import statements

NOW = datetime(2026, 12, 1, 4, 0, 0)
UNTIL = NOW + timedelta(seconds=60)


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


def test_a_batch_receipt_reads_once_and_inserts_once(
    engine: sa.Engine, tables: OutboxTables
) -> None:
    """Four messages: one confirmed already, one whose log row an earlier delivery left
    (its lease released), two new. Elsewhere than PostgreSQL: one read, the old row's
    claim, one INSERT of the new rows, each born with its lease."""
    store = GuardStore(engine, tables)
    batch = [
        ReceivedMessage(message_id=f"b{i}", topic="T", body=b"x", queue_id=0, queue_offset=i)
        for i in range(4)
    ]
    free = lambda known: True  # noqa: E731
    store.receive(batch[0], "g", "t0", NOW, UNTIL, log_receipt=True, may_claim=free)
    with Session(engine) as session, session.begin():
        store.confirm(session, batch[0], "g", "t0", "d", "CONSUMED", NOW)
    store.receive(batch[1], "g", "old", NOW, UNTIL, log_receipt=True, may_claim=free)
    store.release("b1", "g", "old")
    sent = statements(engine)
    may = lambda known: not known.confirmed  # noqa: E731
    got = store.receive_many(batch, "g", ["t0", "t1", "t2", "t3"], NOW, UNTIL, [may] * 4)
    assert [(known.confirmed, claimed) for known, claimed in got] == [
        (True, False),
        (False, True),
        (False, True),
        (False, True),
    ]
    if engine.dialect.name != "postgresql":
        assert sent == ["SELECT", "UPDATE", "INSERT"]
    log = tables.consumption_log
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(log.c.message_id, log.c.lease_token).order_by(log.c.message_id)
        ).all()
    # the confirmed one's receipt too, as one at a time: no lease (the guard then drops it
    # as a duplicate's)
    assert rows == [("b0", None), ("b1", "t1"), ("b2", "t2"), ("b3", "t3")]


@pytest.mark.parametrize("db_url", ["mariadb"], indirect=True)
def test_a_batch_receipt_losing_a_race_for_a_log_row_writes_nothing(
    engine: sa.Engine, tables: OutboxTables
) -> None:
    """Another worker inserts one of the batch's log rows between the batch's read and its
    INSERT: the batch fails whole (its caller then takes each message on its own), and
    leaves only that worker's row."""
    store = GuardStore(engine, tables)
    batch = [
        ReceivedMessage(message_id=f"r{i}", topic="T", body=b"x", queue_id=0, queue_offset=i)
        for i in range(3)
    ]
    other = GuardStore(sa.create_engine(engine.url), tables)

    raced: list[bool] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def meanwhile(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("INSERT") and not raced:
            raced.append(True)
            other.receive(
                batch[1], "g", "theirs", NOW, UNTIL, log_receipt=True, may_claim=lambda k: True
            )

    with pytest.raises(IntegrityError):
        store.receive_many(batch, "g", ["a", "b", "c"], NOW, UNTIL, [lambda k: True] * 3)
    other.engine.dispose()
    log = tables.consumption_log
    with engine.connect() as conn:
        assert conn.execute(sa.select(log.c.message_id, log.c.lease_token)).all() == [
            ("r1", "theirs")
        ]
