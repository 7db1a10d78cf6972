"""Database pieces shared by the outbox and idempotency suites: markers by database, an
engine, and the outbox tables with the suite's own tables dropped after them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from outbox import OutboxTables


def mark_databases(items: list[pytest.Item], folder: str, *always: pytest.MarkDecorator) -> None:
    """Mark the tests under `folder` with `always` and with the database their `db_url`
    parameter names (postgres, psycopg3 or mariadb), so `-m` selects them by service."""
    for item in items:
        if folder not in str(item.path):
            continue
        for mark in always:
            item.add_marker(mark)
        param = getattr(getattr(item, "callspec", None), "params", {}).get("db_url")
        if param in ("postgres", "psycopg3"):
            item.add_marker(pytest.mark.postgres)
        elif param == "mariadb":
            item.add_marker(pytest.mark.mariadb)


@contextlib.contextmanager
def engine_for(db_url: str) -> Iterator[sa.Engine]:
    eng = sa.create_engine(db_url, pool_pre_ping=True)
    yield eng
    eng.dispose()


@contextlib.contextmanager
def outbox_tables(engine: sa.Engine, prefix: str, *own: str) -> Iterator[OutboxTables]:
    """The outbox tables under `prefix`; on exit they and the suite's `own` tables (named
    without the prefix) are dropped."""
    t = OutboxTables(prefix=prefix)
    t.create_all(engine)
    yield t
    t.drop_all(engine)
    for name in own:
        sa.Table(f"{prefix}{name}", sa.MetaData()).drop(engine, checkfirst=True)


def statements(engine: sa.Engine) -> list[str]:
    """Every statement `engine` sends from now on, its first word each (upper case)."""
    sent: list[str] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement.split(None, 1)[0].upper())

    return sent
