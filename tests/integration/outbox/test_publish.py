"""Publishing through the outbox: rollback sends nothing, commit sends exactly once."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from outbox import (
    DuplicateMessageId,
    InvalidStub,
    NoActiveTransaction,
    Outbox,
    OutboxMisuse,
    OutboxTables,
    ResendWorker,
    StubStatus,
    declare_groups,
)
from reliable import Message


def _orders(engine: sa.Engine, prefix: str) -> sa.Table:
    md = sa.MetaData()
    t = sa.Table(
        f"{prefix}orders",
        md,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("item", sa.String(32)),
    )
    md.create_all(engine)
    return t


def _stub(engine: sa.Engine, tables: OutboxTables, mid: str) -> sa.RowMapping | None:
    with engine.connect() as conn:
        return (
            conn.execute(sa.select(tables.stub).where(tables.stub.c.message_id == mid))
            .mappings()
            .first()
        )


def test_session_commit_sends_exactly_once_and_records_the_receipt(
    engine, tables, sender, clock, table_prefix
) -> None:
    orders = _orders(engine, table_prefix)
    declare_groups(engine, tables, "OrderCreated", ["inventory", "billing"])
    outbox = Outbox(tables, sender, clock=clock)
    with Session(engine) as session, session.begin():
        session.execute(sa.insert(orders).values(id=1, item="book"))
        mid = outbox.publish(
            session,
            Message(topic="OrderCreated", body=b'{"order": 1}', tags="new", keys=["order-1"]),
        )
        assert sender.counts() == {}  # nothing leaves before the commit
    assert sender.counts() == {mid: 1}
    stub = _stub(engine, tables, mid)
    assert stub is not None
    assert stub["status"] == StubStatus.UNCONFIRMED.value
    assert stub["send_count"] == 1 and stub["last_error"] is None
    assert stub["queue_id"] == 0 and stub["queue_offset"] == sender.sends().__len__()
    assert stub["broker_msg_id"] is not None
    assert stub["expected_groups"] == "billing,inventory"
    assert stub["keys"] == "order-1" and stub["tags"] == "new"
    # a later commit on the same session sends nothing again
    with Session(engine) as session, session.begin():
        session.execute(sa.insert(orders).values(id=2, item="pen"))
    assert sender.counts() == {mid: 1}


def test_session_rollback_sends_nothing_and_leaves_no_stub(
    engine, tables, sender, table_prefix
) -> None:
    orders = _orders(engine, table_prefix)
    outbox = Outbox(tables, sender)
    with Session(engine) as session:
        session.execute(sa.insert(orders).values(id=1, item="book"))
        mid = outbox.publish(session, Message(topic="OrderCreated", body=b"x"))
        session.rollback()
        session.commit()  # a later commit of the same session must not send it either
    with pytest.raises(RuntimeError), Session(engine) as session, session.begin():
        outbox.publish(session, Message(topic="OrderCreated", body=b"y"))
        raise RuntimeError("business rule failed")
    assert sender.counts() == {}
    assert _stub(engine, tables, mid) is None
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(orders)).scalar() == 0


def _sqlite_savepoints(engine: sa.Engine) -> None:
    """pysqlite's own transaction handling breaks SAVEPOINT; SQLAlchemy's documented fix."""
    if engine.dialect.name != "sqlite":
        return

    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
        dbapi_connection.isolation_level = None

    @sa.event.listens_for(engine, "begin")
    def _begin(conn) -> None:  # type: ignore[no-untyped-def]
        conn.exec_driver_sql("BEGIN")


def test_savepoint_rollback_drops_only_that_message(engine, tables, sender) -> None:
    engine.dispose()
    _sqlite_savepoints(engine)
    outbox = Outbox(tables, sender)
    with Session(engine) as session, session.begin():
        kept = outbox.publish(session, Message(topic="T", body=b"kept"))
        nested = session.begin_nested()
        dropped = outbox.publish(session, Message(topic="T", body=b"dropped"))
        nested.rollback()
        released = session.begin_nested()
        inner = outbox.publish(session, Message(topic="T", body=b"inner"))
        released.commit()
    assert sender.counts() == {kept: 1, inner: 1}
    assert _stub(engine, tables, dropped) is None


def test_connection_api_commits_then_sends_and_rolls_back_silently(
    engine, tables, sender, table_prefix
) -> None:
    orders = _orders(engine, table_prefix)
    outbox = Outbox(tables, sender)
    with engine.connect() as conn:
        with outbox.begin(conn) as tx:
            conn.execute(sa.insert(orders).values(id=1, item="book"))
            sent = tx.publish(Message(topic="OrderCreated", body=b"1"))
            assert sender.counts() == {}
        with pytest.raises(ValueError), outbox.begin(conn) as tx:
            conn.execute(sa.insert(orders).values(id=2, item="pen"))
            rolled = tx.publish(Message(topic="OrderCreated", body=b"2"))
            raise ValueError("no stock")
        with pytest.raises(NoActiveTransaction):
            tx.publish(Message(topic="OrderCreated", body=b"3"))
    with outbox.begin(engine) as tx:  # an Engine works too
        third = tx.publish(Message(topic="OrderCreated", body=b"4"))
    assert sender.counts() == {sent: 1, third: 1}
    assert _stub(engine, tables, rolled) is None


def test_connection_api_refuses_a_transaction_it_does_not_own(engine, tables, sender) -> None:
    outbox = Outbox(tables, sender)
    with engine.connect() as conn:
        conn.begin()
        with pytest.raises(OutboxMisuse), outbox.begin(conn):
            pass
        conn.rollback()
        with pytest.raises(OutboxMisuse), outbox.begin(conn) as tx:
            mid = tx.publish(Message(topic="T", body=b"x"))
            conn.commit()  # ends the owned transaction: the outbox cannot vouch for it
    assert sender.counts() == {}  # not sent now; the committed stub is left to the worker
    stub = _stub(engine, tables, mid)
    assert stub is not None and stub["send_count"] == 0


def test_send_failure_after_commit_is_recorded_on_the_stub(engine, tables, sender, clock) -> None:
    outbox = Outbox(tables, sender, clock=clock)
    sender.fail_all = True
    with Session(engine) as session, session.begin():
        mid = outbox.publish(session, Message(topic="T", body=b"x"))
    stub = _stub(engine, tables, mid)
    assert stub is not None
    assert stub["send_count"] == 1 and stub["queue_offset"] is None
    assert "ConnectionError" in stub["last_error"]
    assert stub["next_resend_at"] == clock.now + outbox.config.retry_after_failure


def test_bad_message_is_refused_before_anything_is_written(engine, tables, sender) -> None:
    outbox = Outbox(tables, sender)
    with Session(engine) as session, session.begin():
        with pytest.raises(InvalidStub):
            outbox.publish(session, Message(topic="", body=b"x"))
        with pytest.raises(InvalidStub):
            outbox.publish(session, Message(topic="T", body=b"x", message_id="x" * 65))
    assert sender.counts() == {}


def test_a_reused_message_id_is_a_typed_error_and_nothing_is_sent(engine, tables, sender) -> None:
    outbox = Outbox(tables, sender)
    with Session(engine) as session, session.begin():
        mid = outbox.publish(session, Message(topic="T", body=b"first"))
    with pytest.raises(DuplicateMessageId) as info, Session(engine) as session, session.begin():
        outbox.publish(session, Message(topic="T", body=b"again", message_id=mid))
    assert info.value.message_id == mid
    assert sender.counts() == {mid: 1}


def test_session_joined_to_an_outer_transaction_never_sends_early(
    engine, tables, sender, clock
) -> None:
    outbox = Outbox(tables, sender, clock=clock)
    with engine.connect() as conn:
        outer = conn.begin()
        with Session(bind=conn) as session:
            rolled = outbox.publish(session, Message(topic="T", body=b"rolled back"))
            session.commit()  # commits nothing: the outer transaction is still open
        assert sender.counts() == {}
        outer.rollback()
        outer = conn.begin()
        with Session(bind=conn) as session:
            kept = outbox.publish(session, Message(topic="T", body=b"kept"))
            session.commit()
        outer.commit()
    assert sender.counts() == {}  # never sent from the joined session's commit
    assert _stub(engine, tables, rolled) is None
    clock.advance(seconds=10)
    assert ResendWorker(engine, tables, sender, clock=clock).run_once().resent == 1
    assert sender.counts() == {kept: 1}
