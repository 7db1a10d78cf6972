"""Database URLs as people write them: the one place every command, the default guard and the
reconciliation turn a `--db` URL into an engine.

SQLAlchemy alone does not take every form the docs and other tools write:

- `postgres://u@h/db` (Heroku and others): SQLAlchemy has no `postgres` dialect; here it
  is `postgresql+psycopg2://u@h/db`.
- `postgresql://u@h/db`: SQLAlchemy 2.1 picks psycopg 3, 2.0 psycopg2, whether installed
  or not; here the first installed of psycopg2, psycopg, pg8000.
- `mysql://u@h/db`, `mariadb://u@h/db`: SQLAlchemy picks mysqlclient (a C build against
  libmysqlclient); here `mysql+pymysql://` / `mariadb+pymysql://`.
- a URL naming its driver (`postgresql+psycopg2://`, `mysql+pymysql://`, ...) keeps it.

A URL that names no driver gets the first *installed* one of a fixed preference list: the
drivers this project depends on (psycopg2-binary, PyMySQL) come first, so a plain
`pip install reliable` reads every form above. A URL that names a driver keeps it; if that
driver is not installed, `DriverMissing` says which package to install, instead of an
`ImportError` from deep inside SQLAlchemy at the first connection.

`canonical_url` only parses and renames the backend (no driver needed: what the Spark job
uses to build its JDBC URL); `database_url` also settles the Python driver; `create_engine`
is `sqlalchemy.create_engine(database_url(url), **kwargs)`.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from sqlalchemy import Engine, make_url
from sqlalchemy import create_engine as _sa_create_engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError

from outbox.errors import OutboxError

# backend names written by other tools -> SQLAlchemy's
_BACKEND_ALIASES = {"postgres": "postgresql"}

# driver name -> (module to find, pip requirement that provides it)
_DRIVERS: dict[str, tuple[str, str]] = {
    "psycopg2": ("psycopg2", "psycopg2-binary"),
    "psycopg": ("psycopg", "psycopg[binary]"),
    "pg8000": ("pg8000", "pg8000"),
    "pymysql": ("pymysql", "pymysql"),
    "mysqldb": ("MySQLdb", "mysqlclient"),
    "mysqlconnector": ("mysql.connector", "mysql-connector-python"),
    "mariadbconnector": ("mariadb", "mariadb"),
}

# the driver a URL naming none gets: the first installed, in this order
_PREFERRED: dict[str, tuple[str, ...]] = {
    "postgresql": ("psycopg2", "psycopg", "pg8000"),
    "mysql": ("pymysql", "mysqldb", "mysqlconnector"),
    "mariadb": ("pymysql", "mysqldb", "mariadbconnector"),
}


class DatabaseUrlError(OutboxError, ValueError):
    """A database URL that cannot be read (not a URL, or no usable Python driver)."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url  # without its password
        self.reason = reason
        super().__init__(f"{url}: {reason}")


class DriverMissing(DatabaseUrlError):
    """The Python driver the URL needs is not installed (`requirement` names the package)."""

    def __init__(self, url: str, driver: str, requirement: str, reason: str) -> None:
        self.driver = driver
        self.requirement = requirement
        super().__init__(url, reason)


def _redacted(text: str) -> str:
    try:
        return make_url(text).render_as_string(hide_password=True)
    except Exception:  # not even a URL: show the scheme only, never a password
        scheme, sep, _ = text.partition("://")
        return f"{scheme}{sep}..." if sep else repr(text[:40])


def canonical_url(url: str | URL) -> URL:
    """The URL parsed, with another tool's backend name (`postgres`) made SQLAlchemy's;
    the driver is left as given (none stays none)."""
    if isinstance(url, URL):
        parsed = url
    else:
        try:
            parsed = make_url(url.strip())
        except ArgumentError:
            raise DatabaseUrlError(
                _redacted(url),
                "not a database URL (e.g. postgresql://user@host/db, "
                "mysql://user@host/db, sqlite:///path/app.db)",
            ) from None
    backend, sep, driver = parsed.drivername.partition("+")
    backend = _BACKEND_ALIASES.get(backend, backend)
    return parsed.set(drivername=f"{backend}{sep}{driver}")


def _installed(driver: str) -> bool:
    module = _DRIVERS[driver][0]
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing (mysql.connector)
        return False


def database_url(url: str | URL) -> URL:
    """The URL with a Python driver that is installed: the one it names, or the first of
    the preference list for its backend. `DatabaseUrlError` / `DriverMissing` otherwise."""
    parsed = canonical_url(url)
    backend, _, driver = parsed.drivername.partition("+")
    shown = parsed.render_as_string(hide_password=True)
    if driver:
        if driver in _DRIVERS and not _installed(driver):
            requirement = _DRIVERS[driver][1]
            hint = ""
            if backend in _PREFERRED:
                hint = f", or write {backend}://... to use an installed driver"
            raise DriverMissing(
                shown,
                driver,
                requirement,
                f"the Python driver {driver!r} is not installed "
                f"(pip install '{requirement}'{hint})",
            )
        return parsed
    preferred = _PREFERRED.get(backend)
    if not preferred:
        return parsed  # sqlite, or a backend SQLAlchemy picks the driver for
    for candidate in preferred:
        if _installed(candidate):
            return parsed.set(drivername=f"{backend}+{candidate}")
    first = preferred[0]
    raise DriverMissing(
        shown,
        first,
        _DRIVERS[first][1],
        f"no Python driver for {backend} is installed (pip install '{_DRIVERS[first][1]}')",
    )


def require_existing_sqlite(url: str | URL) -> None:
    """For a command that reads an outbox: a SQLite URL whose file is not there raises
    `DatabaseUrlError`, instead of SQLite creating an empty database (or failing with
    "unable to open database file" when the directory does not exist). Other backends,
    in-memory and `file:` URI databases pass; creating a database is another command's
    (`--ensure-schema`)."""
    parsed = canonical_url(url)
    if parsed.get_backend_name() != "sqlite":
        return
    path = parsed.database or ""
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    shown = parsed.render_as_string(hide_password=True)
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise DatabaseUrlError(shown, f"no such directory: {os.path.dirname(path) or '.'}")
    if not os.path.isfile(path):
        raise DatabaseUrlError(shown, f"no such SQLite database file: {path}")


def create_engine(url: str | URL, **kwargs: Any) -> Engine:
    """`sqlalchemy.create_engine` for a URL as people write it (see `database_url`)."""
    return _sa_create_engine(database_url(url), **kwargs)


__all__ = [
    "DatabaseUrlError",
    "DriverMissing",
    "canonical_url",
    "create_engine",
    "database_url",
    "require_existing_sqlite",
]
