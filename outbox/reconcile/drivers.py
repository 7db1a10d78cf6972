"""JDBC drivers and URLs: from a SQLAlchemy URL to what Spark's JDBC source needs.

Drivers come from the system (Debian installs them under /usr/share/java) or from jar paths
given with `--jdbc-jar` / the `RELIABLE_JDBC_JARS` environment variable (comma or colon
separated). A missing driver raises `DriverNotFound` naming the package and the setting.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from outbox.reconcile.errors import DriverNotFound, InvalidOptions

SYSTEM_JAR_DIRS: tuple[str, ...] = ("/usr/share/java",)
JARS_ENV = "RELIABLE_JDBC_JARS"
# where system driver jars are looked for (colon separated; empty: nowhere), for a
# machine whose drivers live elsewhere, or none at all (a cluster shipping --jars)
SYSTEM_DIRS_ENV = "RELIABLE_JDBC_SYSTEM_DIRS"


def system_jar_dirs() -> tuple[str, ...]:
    """The directories searched for system driver jars (`RELIABLE_JDBC_SYSTEM_DIRS`, else
    /usr/share/java)."""
    value = os.environ.get(SYSTEM_DIRS_ENV)
    if value is None:
        return SYSTEM_JAR_DIRS
    return tuple(d for d in value.split(os.pathsep) if d.strip())


@dataclass(frozen=True)
class JdbcDriver:
    """One database family: its driver class, the jar names it ships as, its package."""

    dialect: str
    driver_class: str
    jar_names: tuple[str, ...]
    package: str


DRIVERS: dict[str, JdbcDriver] = {
    "postgresql": JdbcDriver(
        "postgresql", "org.postgresql.Driver", ("postgresql.jar",), "libpostgresql-jdbc-java"
    ),
    "sqlite": JdbcDriver(
        "sqlite",
        "org.sqlite.JDBC",
        ("sqlite-jdbc.jar", "xerial-sqlite-jdbc.jar"),
        "libxerial-sqlite-jdbc-java",
    ),
    "mysql": JdbcDriver(
        "mysql", "org.mariadb.jdbc.Driver", ("mariadb-java-client.jar",), "libmariadb-java"
    ),
}
_DIALECT_ALIASES = {"postgres": "postgresql", "mariadb": "mysql"}


@dataclass(frozen=True)
class JdbcTarget:
    """Where Spark reads and writes: JDBC URL, connection properties, driver."""

    url: str
    driver: JdbcDriver
    properties: dict[str, str] = field(default_factory=dict)
    sqlalchemy_url: str = ""

    @property
    def dialect(self) -> str:
        return self.driver.dialect

    def redacted(self) -> str:
        """The SQLAlchemy URL without its password, for reports."""
        from sqlalchemy.engine import make_url

        return make_url(self.sqlalchemy_url).render_as_string(hide_password=True)


def jdbc_target(sqlalchemy_url: str) -> JdbcTarget:
    """Translate a SQLAlchemy URL (`postgresql+psycopg2://u:p@h:5432/db`, `sqlite:///x.db`,
    `mysql+pymysql://...`, any form `outbox.database` reads) into a JDBC URL and
    properties for Spark."""
    from outbox.database import DatabaseUrlError, canonical_url

    try:
        url = canonical_url(sqlalchemy_url)  # `postgres://` and the like: SQLAlchemy's names
    except DatabaseUrlError as exc:
        raise InvalidOptions(f"--db {exc}") from None
    sqlalchemy_url = url.render_as_string(hide_password=False)
    backend = url.get_backend_name()
    backend = _DIALECT_ALIASES.get(backend, backend)
    driver = DRIVERS.get(backend)
    if driver is None:
        raise InvalidOptions(
            f"reconciliation reads sqlite, postgresql or mysql/mariadb; not {backend!r}"
        )
    props: dict[str, str] = {"driver": driver.driver_class}
    if url.username:
        props["user"] = url.username
    if url.password:
        props["password"] = str(url.password)
    if backend == "sqlite":
        if not url.database or url.database == ":memory:":
            raise InvalidOptions("an in-memory SQLite database cannot be read by Spark")
        jdbc = f"jdbc:sqlite:{Path(url.database).resolve()}"
    else:
        host = url.host or "localhost"
        port = f":{url.port}" if url.port else ""
        # MariaDB's driver accepts the jdbc:mysql scheme, which selects Spark's MySQL
        # dialect (backtick quoting); jdbc:mariadb would get ANSI double quotes.
        scheme = "postgresql" if backend == "postgresql" else "mysql"
        jdbc = f"jdbc:{scheme}://{host}{port}/{url.database or ''}"
    return JdbcTarget(url=jdbc, driver=driver, properties=props, sqlalchemy_url=sqlalchemy_url)


def configured_jars(extra: tuple[str, ...] = ()) -> list[str]:
    """Jar paths given explicitly (argument first, then the environment variable)."""
    paths = list(extra)
    env = os.environ.get(JARS_ENV, "")
    for part in env.replace(os.pathsep, ",").split(","):
        if part.strip():
            paths.append(part.strip())
    return paths


def driver_jars(
    dialect: str,
    extra: tuple[str, ...] = (),
    search_dirs: tuple[str, ...] | None = None,
    provided: tuple[str, ...] = (),
) -> list[str]:
    """Jars to put on Spark's classpath for `dialect`: every configured jar, plus the
    system jar when no configured one looks like this driver. `provided`: jars already
    on the classpath (spark-submit's `--jars`; kept by the session, not returned, and
    possibly remote URLs, so not checked here). Raises `DriverNotFound` (naming the
    package and the setting) when there is nothing to use."""
    driver = DRIVERS[_DIALECT_ALIASES.get(dialect, dialect)]
    if search_dirs is None:
        search_dirs = system_jar_dirs()
    configured = configured_jars(extra)
    for path in configured:
        if not Path(path).is_file():
            raise InvalidOptions(f"configured JDBC jar does not exist: {path}")
    keys = _JAR_KEYS[driver.dialect]
    names = [p.rstrip("/").rsplit("/", 1)[-1].lower() for p in (*configured, *provided)]
    if any(key in name for name in names for key in keys):
        return configured
    searched = list(configured)
    for directory in search_dirs:
        for name in driver.jar_names:
            candidate = Path(directory) / name
            searched.append(str(candidate))
            if candidate.is_file():
                return [*configured, str(candidate)]
    if configured or provided:
        return configured  # unrecognised names: the class check after start-up decides
    raise DriverNotFound(driver.dialect, driver.driver_class, driver.package, searched)


def installed_system_jars(search_dirs: tuple[str, ...] | None = None) -> list[str]:
    """Every system JDBC driver jar present (one per dialect). A JVM's classpath is fixed
    when its first session starts, so a session built with all of them serves every
    database a later job in the same process reads."""
    if search_dirs is None:
        search_dirs = system_jar_dirs()
    found: list[str] = []
    for driver in DRIVERS.values():
        for directory in search_dirs:
            hit = next(
                (
                    str(Path(directory) / n)
                    for n in driver.jar_names
                    if (Path(directory) / n).is_file()
                ),
                None,
            )
            if hit:
                found.append(hit)
                break
    return list(dict.fromkeys(found))


_JAR_KEYS: dict[str, tuple[str, ...]] = {
    "postgresql": ("postgresql",),
    "sqlite": ("sqlite",),
    "mysql": ("mariadb", "mysql"),
}
