"""`outbox.autocommit`: on PostgreSQL each statement commits alone, with no BEGIN or COMMIT
round trip, and the pooled connection goes back transactional; elsewhere a plain
transaction. Real servers: the property that matters is the pool's next user, whose
rollback must still undo its work."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError, IntegrityError

from outbox.autocommit import autocommit


@pytest.fixture
def table(engine: sa.Engine) -> Iterator[sa.Table]:
    table = sa.Table(
        f"ac_{uuid.uuid4().hex[:10]}",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    )
    table.create(engine)
    yield table
    table.drop(engine)


def _ids(engine: sa.Engine, table: sa.Table) -> list[int]:
    with engine.connect() as conn:
        return sorted(conn.execute(sa.select(table.c.id)).scalars())


def test_the_pooled_connection_is_transactional_again(engine: sa.Engine, table: sa.Table) -> None:
    for i in range(3):
        with autocommit(engine) as conn:
            conn.execute(table.insert().values(id=i))
    # the next user of the pool (one connection, so the same one) can still roll back
    with engine.connect() as conn:
        conn.execute(table.insert().values(id=99))
        conn.rollback()
    assert _ids(engine, table) == [0, 1, 2]


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_on_postgresql_each_statement_commits_alone(engine: sa.Engine, table: sa.Table) -> None:
    with pytest.raises(IntegrityError), autocommit(engine) as conn:
        conn.execute(table.insert().values(id=1))
        assert _ids(engine, table) == [1]  # visible to another connection at once
        conn.execute(table.insert().values(id=1))  # fails alone
    assert _ids(engine, table) == [1]


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_on_postgresql_no_begin_precedes_a_statement(engine: sa.Engine) -> None:
    # a statement that is its own transaction started it: now() (the transaction's start)
    # is its own start; after a BEGIN, the transaction started earlier
    probe = sa.text("SELECT now() = statement_timestamp()")
    with autocommit(engine) as conn:
        assert [conn.execute(probe).scalar() for _ in range(3)] == [True] * 3
    with engine.begin() as conn:
        assert conn.execute(probe).scalar() is False


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_connection_killed_inside_never_returns_to_the_pool(
    engine: sa.Engine, table: sa.Table
) -> None:
    with pytest.raises(DBAPIError), autocommit(engine) as conn:
        pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar()
        with engine.connect() as other:  # a second pooled connection
            other.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        conn.execute(table.insert().values(id=1))
    with engine.connect() as conn:  # a live connection, transactional
        conn.execute(table.insert().values(id=2))
        conn.rollback()
    assert _ids(engine, table) == []


@pytest.mark.parametrize("db_url", ["sqlite", "mariadb"], indirect=True)
def test_elsewhere_the_block_is_one_transaction(engine: sa.Engine, table: sa.Table) -> None:
    with pytest.raises(IntegrityError), autocommit(engine) as conn:
        conn.execute(table.insert().values(id=1))
        conn.execute(table.insert().values(id=1))
    assert _ids(engine, table) == []
