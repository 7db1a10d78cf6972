"""`reliable reconcile` checks in Python, before any JVM starts, what it can: Java, the
database URL, the tables. Each failure is one line naming the fix, from a real process run
with the environment a user would have (no JVM is started: the progress lines say so).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from outbox import OutboxTables
from reliable_cli.exit_codes import ExitCode

ROOT = Path(__file__).resolve().parents[3]
POSTGRES = os.environ.get(
    "RELIABLE_TEST_POSTGRES", "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
)


def _reconcile(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "reliable_cli", "reconcile", *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def _one_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The failure is one line; the rest of stderr is the job's own progress, and Spark
    was never started."""
    lines = proc.stderr.strip().splitlines()
    errors = [ln for ln in lines if not ln.startswith("reconcile: ")]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith("reliable reconcile: "), proc.stderr
    assert "starting Spark" not in proc.stderr
    assert proc.stdout == ""
    return errors[0]


@pytest.fixture
def sqlite_db(tmp_path: Path) -> str:
    import sqlalchemy as sa

    path = tmp_path / "app.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    OutboxTables().create_all(engine)
    engine.dispose()
    return f"sqlite:///{path}"


def test_without_java(sqlite_db: str, tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env.update(PATH=str(empty), PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "reliable_cli", "reconcile", "--db", sqlite_db],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == ExitCode.FAILURE
    line = _one_error(proc)
    assert "Java runtime" in line and "JAVA_HOME" in line and "apt-get install" in line


def test_with_java_home_pointing_nowhere(sqlite_db: str, tmp_path: Path) -> None:
    proc = _reconcile("--db", sqlite_db, env={"JAVA_HOME": str(tmp_path)})
    assert proc.returncode == ExitCode.FAILURE
    assert f"JAVA_HOME={tmp_path} has no bin/java" in _one_error(proc)


def test_with_a_missing_sqlite_file(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    proc = _reconcile("--db", f"sqlite:///{missing}")
    assert proc.returncode == ExitCode.UNAVAILABLE
    assert "no such SQLite file" in _one_error(proc)
    assert not missing.exists()  # the check created nothing


@pytest.mark.postgres
def test_with_a_wrong_database_url() -> None:
    proc = _reconcile("--db", "postgresql+psycopg2://postgres@127.0.0.1:1/test")
    assert proc.returncode == ExitCode.UNAVAILABLE
    line = _one_error(proc)
    assert "127.0.0.1" in line and "check --db" in line
    # a URL naming no Python driver is checked with whichever one is installed
    proc = _reconcile("--db", "postgresql://postgres@127.0.0.1:5432/no_such_database")
    assert proc.returncode == ExitCode.UNAVAILABLE
    assert "no_such_database" in _one_error(proc)


@pytest.mark.parametrize(
    "db_url",
    [
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ],
    indirect=True,
)
def test_with_missing_tables(db_url: str, table_prefix: str) -> None:
    import sqlalchemy as sa

    with sa.create_engine(db_url).connect() as conn:  # the database exists (a SQLite file)
        conn.execute(sa.text("SELECT 1"))
    proc = _reconcile("--db", db_url, "--prefix", table_prefix)
    assert proc.returncode == ExitCode.UNAVAILABLE
    line = _one_error(proc)
    assert f"missing outbox tables {table_prefix}message_stub" in line
    # "reliable reconcile: cannot read the database URL: missing ...; create them ..."
    assert line.count(": ") == 2, line
    assert "--ensure-schema" in line and "create_all" in line


def test_a_small_database_is_told_from_a_bounded_count(sqlite_url: str, table_prefix: str) -> None:
    """The rows are counted before the JVM starts, each table up to the bound only, and a
    small database gets the quick JIT compiler alone; a large one, a caller's own Java
    options or spark-submit's JVM keep theirs."""
    import sqlalchemy as sa

    from outbox.reconcile import job
    from outbox.reconcile.drivers import jdbc_target
    from outbox.reconcile.preflight import check_database
    from outbox.reconcile.sources import TableNames

    from .dataset import build

    build(table_prefix).insert(sa.create_engine(sqlite_url))
    target, names = jdbc_target(sqlite_url), TableNames.for_prefix(table_prefix)
    assert check_database(target, names) is None  # nothing counted unless asked
    assert check_database(target, names, count_up_to=1000) == 41 + 23 + 11
    assert check_database(target, names, count_up_to=5) == 15  # 5 per table at most
    small = job.small_input_java_options
    assert small(75, {}) == job.SMALL_INPUT_JAVA_OPTIONS == ("-XX:TieredStopAtLevel=1",)
    assert small(job.SMALL_INPUT_ROWS, {}) == ()
    assert small(None, {}) == ()
    assert small(75, {"spark.driver.extraJavaOptions": "-Xss4m"}) == ()
