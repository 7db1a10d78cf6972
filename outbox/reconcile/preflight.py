"""Checks made in Python before Spark starts: each fails in well under 2 s with one line
naming the fix, instead of after the JVM's start-up with a Java traceback.

- Java: `JAVA_HOME/bin/java`, else `java` on the PATH (what PySpark's launcher runs).
- The database: reachable with the URL given (SQLAlchemy, a 2 s connect timeout), and
  holding the tables the job reads (stubs, confirmations, consumption log) with their
  required columns. Skipped when SQLAlchemy has no Python driver for the URL (the JDBC
  read then reports the problem).
- A Parquet root: the directory exists (local paths only).

While connected, the database check can also say whether the input is small (its rows
counted up to a bound, so a large table costs no more than a small one): a small input
starts the JVM with settings that suit it (see `job.SMALL_INPUT_ROWS`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from outbox.reconcile.errors import JavaNotFound, SourceUnavailable
from outbox.reconcile.sources import TABLES, TableNames

if TYPE_CHECKING:
    from sqlalchemy import URL, Connection, Engine

    from outbox.reconcile.drivers import JdbcTarget

CONNECT_TIMEOUT_S = 2
# the tables whose rows are counted before a run (the job reads them whole)
COUNTED_TABLES = ("stub", "confirmation", "log")
FIX_TABLES = (
    "create them with `reliable worker resend --ensure-schema` or "
    "`OutboxTables(...).create_all(engine)`"
)


def find_java(env: dict[str, str] | None = None) -> str:
    """The java executable PySpark will start; `JavaNotFound` when there is none."""
    env = dict(os.environ) if env is None else env
    home = env.get("JAVA_HOME")
    if home:
        java = Path(home) / "bin" / "java"
        if java.is_file() and os.access(java, os.X_OK):
            return str(java)
        raise JavaNotFound(f"JAVA_HOME={home} has no bin/java")
    found = shutil.which("java", path=env.get("PATH", os.defpath))
    if found is None:
        raise JavaNotFound("JAVA_HOME is not set and no `java` is on the PATH")
    return found


def check_database(
    target: JdbcTarget,
    names: TableNames,
    count_up_to: int = 0,
    counts: dict[str, int] | None = None,
) -> int | None:
    """Connect with SQLAlchemy and look for the tables and required columns the job reads;
    `SourceUnavailable` with the fix otherwise. With `count_up_to` > 0, also count the rows
    of the stub, confirmation and log tables, each up to that many (`SELECT COUNT(*) FROM
    (SELECT 1 FROM t LIMIT n)`: bounded work whatever the table's size), and return their
    sum; None when nothing was counted (no Python driver for the URL). `counts`, when
    given, receives each table's count by its logical name."""
    import sqlalchemy as sa
    from sqlalchemy.engine import make_url

    url = make_url(target.sqlalchemy_url)
    where = target.redacted()
    backend = url.get_backend_name()
    if backend == "sqlite":
        database = url.database or ""
        if not Path(database).is_file():
            raise SourceUnavailable(
                f"the database {where}", f"no such SQLite file {database!r} (check --db)"
            )
        args: dict[str, object] = {"timeout": CONNECT_TIMEOUT_S}
    else:
        args = {"connect_timeout": CONNECT_TIMEOUT_S}
    engine = _engine(url, args)
    if engine is None:
        return None  # no Python driver for this URL: the JDBC read will say what is wrong
    counted: int | None = None
    try:
        with engine.connect() as conn:
            inspector = sa.inspect(conn)
            missing: list[str] = []
            for logical in ("stub", "confirmation", "log"):
                table = names.physical(logical)
                if not inspector.has_table(table, schema=names.schema):
                    missing.append(table)
                    continue
                present = {
                    c["name"].lower() for c in inspector.get_columns(table, schema=names.schema)
                }
                _, required = TABLES[logical]
                missing.extend(f"{table}.{c}" for c in required if c not in present)
            if count_up_to > 0 and not missing:
                each = {
                    t: _count_up_to(conn, names.physical(t), names.schema, count_up_to)
                    for t in COUNTED_TABLES
                }
                counted = sum(each.values())
                if counts is not None:
                    counts.update(each)
    except sa.exc.DBAPIError as exc:
        raise SourceUnavailable(
            f"the database {where}", f"{_one_line(exc.orig or exc)} (check --db)"
        ) from None
    except ImportError:
        return None
    finally:
        engine.dispose()
    if missing:
        raise SourceUnavailable(
            f"the database {where}", f"missing outbox tables {', '.join(missing)}; {FIX_TABLES}"
        )
    return counted


def count_rows(target: JdbcTarget, names: TableNames, up_to: int) -> dict[str, int] | None:
    """The rows of the stub, confirmation and log tables, each counted up to `up_to`
    (bounded work, as `check_database` counts them), by logical name; None when they cannot
    be counted from Python (no driver for the URL, a database error): the caller then
    reads the tables as if nothing was counted."""
    import sqlalchemy as sa
    from sqlalchemy.engine import make_url

    url = make_url(target.sqlalchemy_url)
    if url.get_backend_name() == "sqlite":
        if not Path(url.database or "").is_file():
            return None
        args: dict[str, object] = {"timeout": CONNECT_TIMEOUT_S}
    else:
        args = {"connect_timeout": CONNECT_TIMEOUT_S}
    engine = _engine(url, args)
    if engine is None:
        return None
    try:
        with engine.connect() as conn:
            return {
                t: _count_up_to(conn, names.physical(t), names.schema, up_to)
                for t in COUNTED_TABLES
            }
    except (sa.exc.SQLAlchemyError, ImportError):
        return None
    finally:
        engine.dispose()


def _count_up_to(conn: Connection, table: str, schema: str | None, limit: int) -> int:
    import sqlalchemy as sa

    head = sa.select(sa.literal(1)).select_from(sa.table(table, schema=schema)).limit(limit)
    return int(conn.execute(sa.select(sa.func.count()).select_from(head.subquery())).scalar_one())


def _engine(url: str | URL, args: dict[str, object]) -> Engine | None:
    """An engine with an installed Python driver (`outbox.database`: a URL naming none
    gets the installed one); None when there is none: the JDBC read needs no Python
    driver, and says itself what is wrong."""
    from outbox.database import DriverMissing, create_engine

    try:
        return create_engine(url, connect_args=args)
    except (DriverMissing, ImportError):
        return None


def check_parquet(root: str) -> None:
    if "://" in root:
        return
    if not Path(root).is_dir():
        raise SourceUnavailable(f"parquet root {root}", "no such directory")


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]
