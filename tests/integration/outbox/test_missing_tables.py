"""A guard or a resend worker pointed at a database without the outbox tables fails at
start with one line naming the fix, instead of looping (the worker) or dead-lettering every
message (the guard)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from idempotency import IdempotencyGuard
from outbox import OutboxTables, TablesMissing, require_tables
from reliable_cli.exit_codes import ExitCode

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
ALL = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mariadb", marks=pytest.mark.mariadb),
]


def _worker(db_url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}",
        "OUTBOX_TEST_DB": db_url,
        "OUTBOX_TEST_PREFIX": prefix,
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "reliable_cli",
            "worker",
            "resend",
            "--db",
            db_url,
            "--table-prefix",
            prefix,
            "--sender",
            "outbox_testkit:sender_from_env",
            "--once",
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("db_url", ALL, indirect=True)
def test_the_resend_worker_names_the_fix_and_exits(db_url, engine, table_prefix) -> None:
    prefix = f"{table_prefix}none_"
    proc = _worker(db_url, prefix)
    assert proc.returncode == ExitCode.FAILURE, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr  # one line, no traceback
    assert lines[0].startswith("reliable worker resend: outbox tables missing in ")
    assert f"{prefix}message_stub" in lines[0] and "--ensure-schema" in lines[0]
    assert "create_all" in lines[0]
    assert proc.stdout == ""
    with pytest.raises(TablesMissing):  # nothing was created on the way
        require_tables(engine, OutboxTables(prefix=prefix))


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_with_ensure_schema_the_worker_creates_them_and_runs(db_url, engine, table_prefix) -> None:
    proc = _worker(db_url, table_prefix, "--ensure-schema")
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert proc.stdout.startswith("done: ")
    require_tables(engine, OutboxTables(prefix=table_prefix))


@pytest.mark.parametrize("db_url", ALL, indirect=True)
def test_a_guard_without_the_tables_refuses_to_start(db_url, engine, table_prefix) -> None:
    tables = OutboxTables(prefix=f"{table_prefix}none_")
    with pytest.raises(TablesMissing) as info:
        IdempotencyGuard(engine, tables, None)
    text = str(info.value)
    assert "\n" not in text and "--ensure-schema" in text and "create_all" in text
    assert info.value.missing == [t.name for t in tables.metadata.sorted_tables]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_table_missing_a_later_column_is_named(db_url, engine, table_prefix) -> None:
    tables = OutboxTables(prefix=table_prefix)
    tables.create_all(engine)
    with engine.begin() as conn:  # as an older version made it
        conn.execute(
            sa.text(f"ALTER TABLE {table_prefix}consumption_log DROP COLUMN dead_lettered_at")
        )
    with pytest.raises(TablesMissing) as info:
        IdempotencyGuard(engine, tables, None)
    assert info.value.missing == [f"{table_prefix}consumption_log.dead_lettered_at"]


def test_a_guard_started_while_its_database_is_down_starts(table_prefix) -> None:
    # unreachable is not missing: the guard answers RECONSUME_LATER until it is back
    engine = sa.create_engine(
        "postgresql+psycopg2://postgres@127.0.0.1:1/none", connect_args={"connect_timeout": 2}
    )
    guard = IdempotencyGuard(engine, OutboxTables(prefix=table_prefix), None)
    assert guard.engine is engine


def test_reliable_consume_with_idempotent_true_names_the_fix(tmp_path: Path) -> None:
    (tmp_path / "myhandlers.py").write_text(
        "from reliable import handler\n\n"
        "@handler('Orders', group='billing', idempotent=True)\n"
        "def bill(message, session):\n    pass\n"
    )
    db = tmp_path / "empty.db"
    sa.create_engine(f"sqlite:///{db}").connect().close()
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
        "RELIABLE_DATABASE_URL": f"sqlite:///{db}",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "reliable_cli",
            "consume",
            "myhandlers",
            "--store",
            str(tmp_path / "store"),
            "--commitlog-file-size",
            str(4 << 20),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == ExitCode.FAILURE
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("reliable consume: idempotent=True: outbox tables missing")
    assert "--ensure-schema" in lines[0]
