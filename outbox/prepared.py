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

Only psycopg2 needs this. psycopg 3 (`postgresql+psycopg://`) binds parameters on the
server and prepares a statement itself once a connection has run it a few times
(`prepare_threshold`, 5 by default); an `EXECUTE name($1, ...)` of its own would fail
there (a utility statement takes no bound parameter). On psycopg 3, pg8000 and every
other database, `Prepared` runs the statement as SQLAlchemy runs it. Behind a pooler that
shares server connections between transactions, psycopg 3's own preparing is turned off
with `connect_args={"prepare_threshold": None}`.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class _Rendered:
    prepare: str  # PREPARE name(types) AS ... ($n placeholders)
    run: str  # EXECUTE name(%s, ...) (psycopg2's placeholders)
    names: tuple[str, ...]  # the parameters, in placeholder order
    compiled: SQLCompiler

    def args(self, params: Mapping[str, Any]) -> tuple[Any, ...]:
        values = self.compiled.construct_params(params, escape_names=False)
        return tuple(values[n] for n in self.names)


class Prepared:
    """One statement, prepared on each PostgreSQL connection that runs it; elsewhere (and
    once turned off) run as SQLAlchemy runs it. Rendered from its first run's parameter
    names, as SQLAlchemy compiles a statement for the names it is given (an INSERT's
    columns are those named): every run must give the same names."""

    def __init__(self, statement: Executable) -> None:
        self.statement = statement
        self.name = ""  # a digest of the text, once rendered
        self.enabled = True
        self._lock = threading.Lock()
        self._rendered: _Rendered | None = None

    def execute(
        self, conn: Connection, params: Mapping[str, Any]
    ) -> CursorResult[*tuple[Any, ...]]:
        if not self.enabled or conn.dialect.driver != "psycopg2":
            return conn.execute(self.statement, params)
        rendered = self._prepare_on(conn, params)
        try:
            return conn.exec_driver_sql(rendered.run, rendered.args(params))
        except DBAPIError as exc:
            if getattr(exc.orig, "pgcode", None) == _MISSING:
                conn.connection.info[_INFO_KEY].discard(self.name)
                self._turn_off("missing on its connection")
            raise

    def generic_plan(self, conn: Connection, params: Mapping[str, Any]) -> list[str]:
        """EXPLAIN of the plan PostgreSQL keeps for this statement once it stops planning
        each run anew: the generic plan, made without the values, possibly while a table
        was still empty, and kept for the connection's life. On a connection with no
        work of its own pending: its transaction is rolled back. psycopg2 only (a
        statement this class runs as SQLAlchemy does is prepared, if at all, by its
        driver)."""
        if conn.dialect.driver != "psycopg2":
            raise NotImplementedError(f"generic_plan: psycopg2 only, not {conn.dialect.driver}")
        rendered = self._prepare_on(conn, params)
        try:
            conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_generic_plan")
            rows = conn.exec_driver_sql(f"EXPLAIN {rendered.run}", rendered.args(params))
            return [str(r[0]) for r in rows]
        finally:
            conn.rollback()

    def _prepare_on(self, conn: Connection, params: Mapping[str, Any]) -> _Rendered:
        """The statement rendered, and prepared on `conn`'s connection from now on."""
        rendered = self._render(conn, params)
        names_here: set[str] = conn.connection.info.setdefault(_INFO_KEY, set())
        if self.name not in names_here:
            try:
                conn.exec_driver_sql(rendered.prepare)  # no parameters: sent as it is
            except DBAPIError as exc:
                if getattr(exc.orig, "pgcode", None) == _TAKEN:
                    self._turn_off("already prepared on a connection that had not")
                raise
            names_here.add(self.name)
        return rendered

    def _turn_off(self, why: str) -> None:
        self.enabled = False
        log.warning(
            "prepared statement %s %s (a pooler sharing server connections between "
            "transactions?): no longer preparing it",
            self.name,
            why,
        )

    def _render(self, conn: Connection, params: Mapping[str, Any]) -> _Rendered:
        """Once: PREPARE's text (each parameter's type where SQLAlchemy knows it),
        EXECUTE's, and the parameters' names in placeholder order."""
        if self._rendered is not None:
            return self._rendered
        with self._lock:
            if self._rendered is None:
                numbered: Any = type(conn.dialect)  # the same dialect, with $n placeholders
                dialect = numbered(paramstyle="numeric_dollar")
                compiled = self.statement.compile(  # type: ignore[attr-defined]
                    dialect=dialect, column_keys=list(params)
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
                self._rendered = _Rendered(
                    f"PREPARE {self.name}{body}", f"EXECUTE {self.name}{args}", names, compiled
                )
            return self._rendered
