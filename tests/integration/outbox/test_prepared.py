"""`outbox.prepared`: on PostgreSQL a statement is planned once per connection and then run
by name, with the results the plain statement gives; a connection that lost it turns
preparing off instead of failing for good; elsewhere the plain statement runs."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from outbox.prepared import Prepared
from tests.integration.dbkit import statements


@pytest.fixture
def table(engine: sa.Engine) -> Iterator[sa.Table]:
    table = sa.Table(
        f"pr_{uuid.uuid4().hex[:10]}",
        sa.MetaData(),
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("at", sa.DateTime, nullable=False),
        sa.Column("n", sa.Integer, nullable=False),
    )
    table.create(engine)
    yield table
    table.drop(engine)


def upsert(table: sa.Table) -> Any:
    """A data-modifying CTE with a repeated parameter and a constant, returning rows."""
    born = (
        sa.insert(table)
        .values(id=sa.bindparam("rid"), at=sa.bindparam("at"), n=sa.bindparam("n"))
        .returning(table.c.id, table.c.n)
        .cte("born")
    )
    return sa.select(born.c.id, born.c.n, sa.literal("new").label("kind")).union_all(
        sa.select(table.c.id, table.c.n, sa.literal("old")).where(
            table.c.id == sa.bindparam("other")
        )
    )


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_planned_once_a_connection_with_the_plain_statements_results(
    engine: sa.Engine, table: sa.Table
) -> None:
    prepared = Prepared(upsert(table))
    sent = statements(engine)
    at = datetime(2026, 11, 30, 4, 0, 0)
    with engine.begin() as conn:
        first = prepared.execute(conn, {"rid": "a", "at": at, "n": 1, "other": "none"}).all()
        second = prepared.execute(conn, {"rid": "b", "at": at, "n": 2, "other": "a"}).all()
    assert first == [("a", 1, "new")]
    assert sorted(second) == [("a", 1, "old"), ("b", 2, "new")]
    assert sent == ["PREPARE", "EXECUTE", "EXECUTE"]
    with engine.begin() as conn:  # the same pooled connection: prepared already
        assert prepared.execute(conn, {"rid": "c", "at": at, "n": 3, "other": "b"}).all()
        with engine.begin() as other:  # a second connection prepares it for itself
            assert prepared.execute(other, {"rid": "d", "at": at, "n": 4, "other": "x"}).all()
    assert sent[3:] == ["EXECUTE", "PREPARE", "EXECUTE"]
    with engine.connect() as conn:  # the rows are the plain statement's rows
        assert conn.execute(sa.select(table.c.id, table.c.at, table.c.n).order_by("id")).all() == [
            (k, at, i) for i, k in enumerate("abcd", 1)
        ]


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_connection_that_lost_it_turns_preparing_off(engine: sa.Engine, table: sa.Table) -> None:
    prepared = Prepared(upsert(table))
    at = datetime(2026, 11, 30, 4, 0, 0)
    with engine.begin() as conn:
        prepared.execute(conn, {"rid": "a", "at": at, "n": 1, "other": "x"})
    with engine.connect() as conn:
        # as a pooler handing the next transaction another server connection would
        conn.exec_driver_sql("DEALLOCATE ALL")
        conn.commit()
        with pytest.raises(DBAPIError) as failed, conn.begin():
            prepared.execute(conn, {"rid": "b", "at": at, "n": 2, "other": "x"})
        assert failed.value.orig.pgcode == "26000"  # type: ignore[union-attr]
    assert prepared.enabled is False
    sent = statements(engine)
    with engine.begin() as conn:  # the plain statement from now on
        assert prepared.execute(conn, {"rid": "b", "at": at, "n": 2, "other": "a"}).all()
    assert sent == ["WITH"]
    with engine.connect() as conn:
        assert conn.execute(sa.select(table.c.id).order_by("id")).scalars().all() == ["a", "b"]


@pytest.mark.parametrize("db_url", ["sqlite", "mariadb"], indirect=True)
def test_elsewhere_the_plain_statement_runs(engine: sa.Engine, table: sa.Table) -> None:
    prepared = Prepared(sa.insert(table))
    sent = statements(engine)
    with engine.begin() as conn:
        prepared.execute(conn, {"id": "a", "at": datetime(2026, 11, 30), "n": 1})
    assert sent == ["INSERT"]


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_one_name_means_one_statement_in_every_process(engine: sa.Engine, table: sa.Table) -> None:
    at = datetime(2026, 11, 30, 4, 0, 0)
    first, again = Prepared(upsert(table)), Prepared(upsert(table))
    other = Prepared(sa.select(table.c.id).where(table.c.id == sa.bindparam("rid")))
    with engine.begin() as conn:
        first.execute(conn, {"rid": "a", "at": at, "n": 1, "other": "x"})
        again.execute(conn, {"rid": "b", "at": at, "n": 2, "other": "x"})
        other.execute(conn, {"rid": "a"})
    # a name is a digest of the text: the same statement built twice (or in another
    # process) has the same name, another statement another
    assert first.name == again.name != other.name and first.name.startswith("reliable_")


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_name_already_prepared_where_this_client_had_not_turns_preparing_off(
    engine: sa.Engine, table: sa.Table
) -> None:
    at = datetime(2026, 11, 30, 4, 0, 0)
    elsewhere = Prepared(upsert(table))
    with engine.begin() as conn:
        elsewhere.execute(conn, {"rid": "a", "at": at, "n": 1, "other": "x"})
        prepare = elsewhere._render(conn, {}).prepare
    with engine.connect() as conn:
        # as a pooler would hand this client a server connection another client prepared
        # the statement on: the client's record does not know it
        conn.connection.info.pop("reliable.prepared")
        conn.commit()
        here = Prepared(upsert(table))
        with pytest.raises(DBAPIError) as failed, conn.begin():
            here.execute(conn, {"rid": "b", "at": at, "n": 2, "other": "x"})
        assert failed.value.orig.pgcode == "42P05"  # type: ignore[union-attr]
        assert here.enabled is False and prepare.startswith(f"PREPARE {here.name}(")
        with conn.begin():  # the plain statement from now on
            assert here.execute(conn, {"rid": "b", "at": at, "n": 2, "other": "a"}).all()
    with engine.connect() as conn:
        assert conn.execute(sa.select(table.c.id).order_by("id")).scalars().all() == ["a", "b"]


@pytest.mark.parametrize("db_url", ["psycopg3"], indirect=True)
def test_on_psycopg3_the_driver_prepares_the_plain_statement(
    engine: sa.Engine, table: sa.Table
) -> None:
    """psycopg 3 binds parameters on the server, where `EXECUTE name($1, ...)` cannot run:
    the statement goes as SQLAlchemy sends it, and psycopg prepares it itself once the
    connection has run it `prepare_threshold` times."""
    prepared = Prepared(upsert(table))
    sent = statements(engine)
    at = datetime(2026, 11, 30, 4, 0, 0)
    with engine.begin() as conn:
        threshold = conn.connection.driver_connection.prepare_threshold  # type: ignore[union-attr]
        assert threshold is not None
        for i in range(threshold + 2):
            rows = prepared.execute(conn, {"rid": f"r{i}", "at": at, "n": i, "other": "r0"}).all()
            assert ("r0", 0, "old") in rows or i == 0
            assert (f"r{i}", i, "new") in rows
        ours = list(sent)
        kept = conn.exec_driver_sql(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%%born%%'"
        ).scalar_one()
    assert ours == ["WITH"] * (threshold + 2)  # no PREPARE, no EXECUTE of ours
    assert kept == 1  # psycopg's own
    assert prepared.enabled
    with engine.connect() as conn, pytest.raises(NotImplementedError, match="psycopg2 only"):
        prepared.generic_plan(conn, {"rid": "x", "at": at, "n": 0, "other": "x"})
