"""Statements PostgreSQL plans once per connection: `PREPARE`, then `EXECUTE` by name.

psycopg2 sends every statement as text, and PostgreSQL plans it again each time. For the
hot statements of the outbox and the guard, the plan costs more than the work: the
guard's confirmation (three data-modifying CTEs) took 118 µs of planning against 37 µs
of execution a message, the batch receipt 131 µs a batch (`pg_stat_statements` with
`track_planning`). A `Prepared` statement is planned once on each pooled connection,
the first time that connection runs it; later runs send only its name and values.

A statement's name is a digest of its text (parameter types included), so one name
always means one statement, in every process: behind a pooler that hands out server
connections per transaction (PgBouncer in transaction mode without prepared-statement
support), a name prepared by another client on the server connection this transaction
got is the very same statement. What such a pooler does break is the connection's
record of what it prepared: a name missing there, or one already there when this
client prepares it. The first such failure turns preparing off for that statement in
this process, with a warning; the transaction it failed in is lost as any failed
statement loses it (the guard retries the message, the publisher's caller sees the
error), and later runs send the plain statement.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, CursorResult
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.types import NullType

log = logging.getLogger(__name__)

_INFO_KEY = "reliable.prepared"  # per DBAPI connection: names prepared on it
_MISSING = "26000"  # invalid_sql_statement_name: EXECUTE of a name not prepared here
_TAKEN = "42P05"  # duplicate_prepared_statement: PREPARE of a name prepared there


class Prepared:
    """One statement, prepared on each PostgreSQL connection that runs it; elsewhere (and
    once turned off) run as SQLAlchemy runs it."""

    def __init__(self, statement: Executable, column_keys: tuple[str, ...] | None = None) -> None:
        """column_keys: for an INSERT or UPDATE, the columns every run gives values for
        (the others are left out of the statement, as SQLAlchemy does per run)."""
        self.statement = statement
        self.column_keys = column_keys
        self.name = ""  # a digest of the text, once compiled
        self.enabled = True
        self._lock = threading.Lock()
        self._compiled: tuple[str, str, tuple[str, ...], SQLCompiler] | None = None

    def execute(
        self, conn: Connection, params: Mapping[str, Any]
    ) -> CursorResult[*tuple[Any, ...]]:
        if not self.enabled or conn.dialect.name != "postgresql":
            return conn.execute(self.statement, params)
        _, run, names, compiled = self._compile(conn)
        names_here = self._prepare_on(conn)
        values = compiled.construct_params(params, escape_names=False)
        try:
            return conn.exec_driver_sql(run, tuple(values[n] for n in names))
        except DBAPIError as exc:
            if getattr(exc.orig, "pgcode", None) == _MISSING:
                names_here.discard(self.name)
                self._turn_off("missing on its connection")
            raise

    def generic_plan(self, conn: Connection, params: Mapping[str, Any]) -> list[str]:
        """EXPLAIN of the plan PostgreSQL keeps for this statement once it stops planning
        each run anew: the generic plan, made without the values, possibly while a table
        was still empty, and kept for the connection's life. On a connection with no
        work of its own pending: its transaction is rolled back."""
        _, run, names, compiled = self._compile(conn)
        self._prepare_on(conn)
        values = compiled.construct_params(params, escape_names=False)
        try:
            conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_generic_plan")
            rows = conn.exec_driver_sql(f"EXPLAIN {run}", tuple(values[n] for n in names))
            return [str(r[0]) for r in rows]
        finally:
            conn.rollback()

    def _prepare_on(self, conn: Connection) -> set[str]:
        """The names prepared on `conn`'s connection, this one among them from now on."""
        names_here: set[str] = conn.connection.info.setdefault(_INFO_KEY, set())
        prepare = self._compile(conn)[0]
        if self.name not in names_here:
            try:
                conn.exec_driver_sql(prepare)  # no parameters: its text is sent as it is
            except DBAPIError as exc:
                if getattr(exc.orig, "pgcode", None) == _TAKEN:
                    self._turn_off("already prepared on a connection that had not")
                raise
            names_here.add(self.name)
        return names_here

    def _turn_off(self, why: str) -> None:
        self.enabled = False
        log.warning(
            "prepared statement %s %s (a pooler sharing server connections between "
            "transactions?): no longer preparing it",
            self.name,
            why,
        )

    def _compile(self, conn: Connection) -> tuple[str, str, tuple[str, ...], SQLCompiler]:
        if self._compiled is None:
            with self._lock:
                if self._compiled is None:
                    self._compiled = self._render(conn)
        return self._compiled

    def _render(self, conn: Connection) -> tuple[str, str, tuple[str, ...], SQLCompiler]:
        """PREPARE's text ($n placeholders, each parameter's type where SQLAlchemy knows
        it), EXECUTE's (psycopg2's %s placeholders) and the parameters' names in order."""
        numbered: Any = type(conn.dialect)  # the same dialect, with $n placeholders
        dialect = numbered(paramstyle="numeric_dollar")
        compiled = self.statement.compile(  # type: ignore[attr-defined]
            dialect=dialect,
            column_keys=None if self.column_keys is None else list(self.column_keys),
        )
        assert isinstance(compiled, SQLCompiler)
        names = tuple(compiled.positiontup or ())
        types = ", ".join(
            "unknown"
            if isinstance(compiled.binds[n].type, NullType)
            else dialect.type_compiler_instance.process(compiled.binds[n].type)
            for n in names
        )
        body = f"({types}) AS {compiled.string}" if names else f" AS {compiled.string}"
        self.name = "reliable_" + hashlib.sha256(body.encode()).hexdigest()[:32]
        args = f"({', '.join(['%s'] * len(names))})" if names else ""
        return f"PREPARE {self.name}{body}", f"EXECUTE {self.name}{args}", names, compiled
