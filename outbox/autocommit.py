"""Statements that commit on their own, without the two round trips of a transaction block.

A transaction through SQLAlchemy on PostgreSQL costs three round trips for one statement:
psycopg2 sends `BEGIN` before it, then the statement, then `COMMIT`. Where the work is a
single statement, or a few that are each correct alone, the driver's autocommit flag makes
it one round trip. On psycopg2 and psycopg 3 the flag is the client's alone: setting it
sends nothing, and it is set back on the same checked-out connection before the pool takes
it, so the pool has nothing to reset. (SQLAlchemy's `isolation_level="AUTOCOMMIT"`
execution option does the same but resets the level at check-in with one more round trip,
which spends what it saves.)

Other drivers (PyMySQL sends `SET autocommit`, SQLite has no round trip to save) get a plain
transaction: `engine.begin()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine

# drivers whose `autocommit` attribute is a client-side flag (no statement sent)
_FLAG_DRIVERS = frozenset({"psycopg2", "psycopg"})


@contextmanager
def autocommit(engine: Engine) -> Iterator[Connection]:
    """A connection on which each statement commits as it completes (a plain transaction,
    committed at the end of the block, where the driver has no free flag). Use it only for
    statements that are each correct on their own: nothing is rolled back on an error."""
    if engine.dialect.driver not in _FLAG_DRIVERS:
        with engine.begin() as conn:
            yield conn
        return
    with engine.connect() as conn:
        raw: Any = conn.connection.dbapi_connection
        was = raw.autocommit
        raw.autocommit = True
        try:
            yield conn
            conn.commit()  # SQLAlchemy's own marker: the driver sends nothing in autocommit
        finally:
            try:
                raw.autocommit = was
            except Exception:  # closed or broken: never back into the pool as it is
                conn.invalidate()
