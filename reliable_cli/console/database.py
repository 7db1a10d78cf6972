"""The console's read-only view of the outbox database (`--db URL`): the stub backlog by
status and age, and the last reconciliation runs.

Only SELECTs are issued, in sessions the database itself keeps read-only (PostgreSQL and
MySQL/MariaDB: `SET SESSION ... READ ONLY`; SQLite: `PRAGMA query_only`), so a bug in the
console cannot change a stub. Tables are the outbox's (`outbox.models.OutboxTables`, same
prefix and schema options as the other commands) and the reconciliation's detail-row table
(`outbox.reconcile.details.report_table`, the name given to `reliable reconcile
--report-table`) and repair audit table (`<prefix>reconcile_audit`).

A reconciliation run is known by its detail rows: the run id starts with the time it ran
(`20261124T003000-1a2b3c4d`), and its certificate is clean when none of its stubs inside
the window was classed LOST (the only class that is not accounted for) or EXHAUSTED (an
escalation still awaiting manual handling), as `reliable reconcile` says.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa

from outbox.database import create_engine, require_existing_sqlite
from outbox.models import OutboxTables, StubStatus
from outbox.reconcile.classes import UNACCOUNTED, StubClass
from outbox.reconcile.details import report_table
from outbox.reconcile.repair import audit_table
from reliable_cli.console.broker_view import ConsoleError

if TYPE_CHECKING:
    from sqlalchemy.engine.interfaces import DBAPIConnection
    from sqlalchemy.pool import ConnectionPoolEntry

T = TypeVar("T")

# age buckets of unconfirmed stubs: (label, older than)
AGE_BUCKETS: tuple[tuple[str, timedelta], ...] = (
    ("< 1 min", timedelta(0)),
    ("1-5 min", timedelta(minutes=1)),
    ("5-60 min", timedelta(minutes=5)),
    ("1-24 h", timedelta(hours=1)),
    ("> 24 h", timedelta(hours=24)),
)


class DatabaseUnavailable(ConsoleError):
    """The outbox database refused or did not answer."""


@dataclass
class Backlog:
    """The stub table at one moment."""

    by_status: dict[str, int]
    ages: list[tuple[str, int]]  # unconfirmed stubs per age bucket, youngest first
    by_topic: list[dict[str, Any]]  # per topic: status counts and oldest unconfirmed age
    oldest: list[dict[str, Any]]  # the oldest unconfirmed stubs
    escalated: int
    now: datetime


@dataclass
class ReconcileRun:
    """One reconciliation run, from its detail rows (and its repairs, if any)."""

    run_id: str
    ran_at: datetime | None
    stubs: dict[str, int] = field(default_factory=dict)  # class -> count (rows written)
    logs: dict[str, int] = field(default_factory=dict)
    unaccounted: int = 0
    manual: int = 0  # escalations awaiting an operator (EXHAUSTED) in the window
    repairs: int = 0
    unaccounted_ids: list[dict[str, Any]] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.unaccounted == 0 and self.manual == 0

    @property
    def verdict(self) -> str:
        """`CLEAN`, or `NOT CLEAN (...)` as the reconcile command words it."""
        if self.clean:
            return "CLEAN"
        reasons = [f"{self.unaccounted} unaccounted"] if self.unaccounted else []
        if self.manual:
            reasons.append(f"{self.manual} awaiting manual handling")
        return f"NOT CLEAN ({', '.join(reasons)})"


def run_time(run_id: str) -> datetime | None:
    try:
        return datetime.strptime(run_id[:15], "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
    except ValueError:
        return None


def _naive_utc_now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)  # the outbox writes naive UTC


class OutboxView:
    """Read-only queries on the outbox's tables."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "reliable_",
        schema: str | None = None,
        report: str | None = None,
    ) -> None:
        try:
            require_existing_sqlite(url)  # a wrong path is refused, not created empty
            self.engine = create_engine(url, pool_pre_ping=True)
        except (sa.exc.SQLAlchemyError, ImportError, ValueError) as exc:
            raise DatabaseUnavailable(f"--db: {str(exc).splitlines()[0]}") from None
        sa.event.listen(self.engine, "connect", _read_only)
        self.url = self.engine.url.render_as_string(hide_password=True)
        self.tables = OutboxTables(prefix=prefix, schema=schema)
        self.report_name = report or f"{prefix}reconcile_report"
        self.report = report_table(self.tables.metadata, self.report_name, schema)
        self.audit = audit_table(self.tables.metadata, prefix, schema)

    def close(self) -> None:
        self.engine.dispose()

    def _read(self, fn: Callable[[sa.Connection], T]) -> T:
        try:
            with self.engine.connect() as conn:
                return fn(conn)
        except sa.exc.SQLAlchemyError as exc:
            raise DatabaseUnavailable(f"outbox database: {str(exc).splitlines()[0]}") from None

    # ------------------------------------------------------------------ backlog
    def backlog(self, oldest: int = 20) -> Backlog:
        stub = self.tables.stub
        unconfirmed = stub.c.status == StubStatus.UNCONFIRMED.value
        now = _naive_utc_now()

        def read(conn: sa.Connection) -> Backlog:
            by_status = {
                str(s): int(n)
                for s, n in conn.execute(
                    sa.select(stub.c.status, sa.func.count()).group_by(stub.c.status)
                )
            }
            cases = []
            bounds = [now - b for _, b in AGE_BUCKETS] + [None]
            for (label, _), newer, older in zip(AGE_BUCKETS, bounds, bounds[1:], strict=False):
                cond = stub.c.created_at <= newer
                if older is not None:
                    cond = sa.and_(cond, stub.c.created_at > older)
                cases.append(sa.func.sum(sa.case((cond, 1), else_=0)).label(label))
            ages_row = conn.execute(sa.select(*cases).where(unconfirmed)).one()
            ages = [(label, int(ages_row[i] or 0)) for i, (label, _) in enumerate(AGE_BUCKETS)]
            topics: dict[str, dict[str, Any]] = {}
            for topic, status, n, first in conn.execute(
                sa.select(
                    stub.c.topic, stub.c.status, sa.func.count(), sa.func.min(stub.c.created_at)
                ).group_by(stub.c.topic, stub.c.status)
            ):
                row = topics.setdefault(str(topic), {"topic": str(topic), "oldest": None})
                row[str(status)] = int(n)
                if status == StubStatus.UNCONFIRMED.value:
                    row["oldest"] = first
            escalated = conn.execute(
                sa.select(sa.func.count()).where(unconfirmed, stub.c.escalated_at.is_not(None))
            ).scalar_one()
            rows = conn.execute(
                sa.select(
                    stub.c.message_id,
                    stub.c.topic,
                    stub.c["keys"],
                    stub.c.status,
                    stub.c.send_count,
                    stub.c.max_sends,
                    stub.c.created_at,
                    stub.c.next_resend_at,
                    stub.c.escalated_at,
                    stub.c.last_error,
                )
                .where(unconfirmed)
                .order_by(stub.c.created_at, stub.c.id)
                .limit(oldest)
            )
            return Backlog(
                by_status,
                ages,
                sorted(topics.values(), key=lambda r: r["topic"]),
                [dict(r._mapping) for r in rows],
                int(escalated),
                now,
            )

        result: Backlog = self._read(read)
        return result

    # ------------------------------------------------------------------ reconciliation
    def reconcile_runs(self, last: int = 10) -> list[ReconcileRun] | None:
        """The last runs, newest first; None when no run wrote a report table yet."""
        report, audit = self.report, self.audit

        def read(conn: sa.Connection) -> list[ReconcileRun] | None:
            inspector = sa.inspect(conn)
            if not inspector.has_table(report.name, schema=report.schema):
                return None
            ids = [
                str(r)
                for r in conn.execute(
                    sa.select(report.c.run_id)
                    .distinct()
                    .order_by(report.c.run_id.desc())
                    .limit(last)
                ).scalars()
            ]
            runs = {i: ReconcileRun(i, run_time(i)) for i in ids}
            if not ids:
                return []
            lost = sa.and_(
                report.c.kind == "stub",
                report.c["class"].in_([c.value for c in UNACCOUNTED]),
                sa.or_(report.c.in_window.is_(True), report.c.in_window.is_(None)),
            )
            for run_id, kind, cls, in_window, n in conn.execute(
                sa.select(
                    report.c.run_id,
                    report.c.kind,
                    report.c["class"],
                    report.c.in_window,
                    sa.func.count(),
                )
                .where(report.c.run_id.in_(ids))
                .group_by(report.c.run_id, report.c.kind, report.c["class"], report.c.in_window)
            ):
                run = runs[str(run_id)]
                bucket = run.stubs if kind == "stub" else run.logs
                bucket[str(cls)] = bucket.get(str(cls), 0) + int(n)
                if kind == "stub" and cls == StubClass.LOST.value and in_window is not False:
                    run.unaccounted += int(n)
                if kind == "stub" and cls == StubClass.EXHAUSTED.value and in_window is not False:
                    run.manual += int(n)
            # Spark's JDBC writer stores a timestamp as SQLite sees fit (epoch ms): read it raw
            created = sa.type_coerce(report.c.created_at, sa.types.NullType()).label("created")
            for r in conn.execute(
                sa.select(
                    report.c.run_id,
                    report.c.message_id,
                    report.c.topic,
                    report.c.consumer_group,
                    report.c.reason,
                    created,
                )
                .where(report.c.run_id.in_(ids), lost)
                .order_by(report.c.created_at)
                .limit(20 * len(ids))
            ):
                run = runs[str(r.run_id)]
                if len(run.unaccounted_ids) < 20:
                    row = dict(r._mapping)
                    row["created_at"] = _as_time(row.pop("created"))
                    run.unaccounted_ids.append(row)
            if inspector.has_table(audit.name, schema=audit.schema):
                for run_id, n in conn.execute(
                    sa.select(audit.c.run_id, sa.func.count())
                    .where(audit.c.run_id.in_(ids))
                    .group_by(audit.c.run_id)
                ):
                    runs[str(run_id)].repairs = int(n)
            return [runs[i] for i in ids]

        result: list[ReconcileRun] | None = self._read(read)
        return result


def _as_time(value: object) -> datetime | str | None:
    """A timestamp as a database returned it: a datetime, epoch milliseconds, or text."""
    if value is None or isinstance(value, datetime):
        return value
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value / 1000, UTC).replace(tzinfo=None)
    return str(value)


def _read_only(dbapi_conn: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
    """Make every session of the console's pool read-only, in the database itself."""
    module = type(dbapi_conn).__module__
    cursor = dbapi_conn.cursor()
    try:
        if module.startswith("sqlite3"):
            cursor.execute("PRAGMA query_only = ON")
        elif module.startswith("psycopg"):
            cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            dbapi_conn.commit()
        elif module.startswith(("pymysql", "MySQLdb", "mysql")):
            cursor.execute("SET SESSION TRANSACTION READ ONLY")
    finally:
        cursor.close()
