"""`reliable reconcile`: exit codes, JSON, report table, and the errors that say what to fix."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from outbox.reconcile import DriverNotFound, InvalidOptions, driver_jars
from reliable_cli import main
from reliable_cli.exit_codes import ExitCode

from .conftest import small_jvm_options
from .dataset import build

pytestmark = pytest.mark.spark


def test_json_exit_code_and_report_table(spark, sqlite_url, table_prefix, capsys):
    seeded = build(table_prefix)
    engine = sa.create_engine(sqlite_url)
    seeded.insert(engine)
    report = f"{table_prefix}reconcile_report"
    rc = main(
        [
            "reconcile",
            "--db",
            sqlite_url,
            "--prefix",
            table_prefix,
            "--json",
            "--report-table",
            report,
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    # real time is later than the data set's clock: the unsent stub is past its grace too
    assert rc == ExitCode.UNACCOUNTED == doc["exit_code"]
    assert doc["stubs"]["total"] == 41 and doc["certificate"]["clean"] is False
    assert doc["log_rows"] == {"total": 11, "matched": 7, "orphan": 2, "stale": 2}
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(f'SELECT kind, class, COUNT(*) FROM "{report}" GROUP BY kind, class')
        ).all()
    detail = {(k, c): n for k, c, n in rows}
    assert detail[("stub", "LOST")] == doc["stubs"]["lost"]
    assert ("stub", "CONFIRMED") not in detail
    assert sum(n for (k, _c), n in detail.items() if k == "log") == 11


def test_a_small_run_with_a_report_takes_few_tasks(spark, sqlite_url, table_prefix, tmp_path):
    """Partitions are sized from the data: the 41-stub data set with a report table and a
    Parquet report runs in a few dozen tasks (Spark's default 200 shuffle partitions made
    it over a thousand) and writes one Parquet file. A count of work, not a timing."""
    from outbox.reconcile import ReconcileOptions, reconcile

    from .dataset import NOW

    build(table_prefix).insert(sa.create_engine(sqlite_url))
    parquet = tmp_path / "report"
    result = reconcile(
        ReconcileOptions(
            db_url=sqlite_url,
            table_prefix=table_prefix,
            report_table=f"{table_prefix}report",
            report_parquet=str(parquet),
        ),
        spark=spark,
        now=NOW,
    )
    assert result.shuffle_partitions == spark.sparkContext.defaultParallelism == 2
    assert 0 < result.tasks <= 60, result.tasks
    assert len(list(parquet.glob("*.parquet"))) == 1
    # a small input is planned once per query, not again after each query stage (adaptive
    # execution made it 20 jobs), and its tables, counted before the run, are read whole
    # without a bounds query each (three jobs more); the session gets its settings back
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup(result.run_id)
    assert 0 < len(jobs) <= 7, len(jobs)
    plans = {k: result.plans[k] for k in ("stub", "confirmation", "log")}
    assert plans == {
        "stub": ("id", 1, 41),
        "confirmation": ("_rowid", 1, 23),
        "log": ("queue_offset", 1, 11),
    }, result.plans
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true"
    assert spark.conf.get("spark.sql.codegen.wholeStage") == "true"
    assert spark.conf.get("spark.sql.icu.caseMappings.enabled") == "true"
    # the caller's setting stands
    again = reconcile(
        ReconcileOptions(
            db_url=sqlite_url,
            table_prefix=table_prefix,
            spark_conf={"spark.sql.shuffle.partitions": "7"},
        ),
        spark=spark,
        now=NOW,
    )
    assert again.shuffle_partitions == 7
    assert spark.conf.get("spark.sql.shuffle.partitions") != "7"  # given back afterwards


def test_clean_window_exits_zero(spark, sqlite_url, table_prefix, capsys):
    build(table_prefix).insert(sa.create_engine(sqlite_url))
    # the first ten stubs (08:00-08:09) are all confirmed
    rc = main(
        [
            "reconcile",
            "--db",
            sqlite_url,
            "--prefix",
            table_prefix,
            "--since",
            "2026-01-01T08:00",
            "--until",
            "2026-01-01T08:10",
        ]
    )
    out = capsys.readouterr().out
    assert rc == ExitCode.OK
    assert "zero-loss certificate [2026-01-01 08:00:00, 2026-01-01 08:10:00): CLEAN" in out
    assert "produced 10  confirmed 10" in out


def test_bad_options_and_missing_tables(spark, sqlite_url, table_prefix, capsys):
    rc = main(["reconcile", "--db", sqlite_url, "--since", "2026-01-02", "--until", "2026-01-01"])
    assert rc == ExitCode.USAGE
    assert "empty window" in capsys.readouterr().err
    sa.create_engine(sqlite_url).connect().close()  # the database file, without tables
    rc = main(["reconcile", "--db", sqlite_url, "--prefix", "absent_"])
    assert rc == ExitCode.UNAVAILABLE
    assert "absent_message_stub" in capsys.readouterr().err


def test_missing_driver_names_the_package_and_the_setting(tmp_path, monkeypatch):
    monkeypatch.delenv("RELIABLE_JDBC_JARS", raising=False)
    with pytest.raises(DriverNotFound) as err:
        driver_jars("postgresql", search_dirs=(str(tmp_path),))
    message = str(err.value)
    assert "libpostgresql-jdbc-java" in message and "--jdbc-jar" in message
    assert "RELIABLE_JDBC_JARS" in message
    with pytest.raises(DriverNotFound, match="libmariadb-java"):
        driver_jars("mariadb", search_dirs=(str(tmp_path),))
    with pytest.raises(InvalidOptions, match="does not exist"):
        driver_jars("sqlite", extra=(str(tmp_path / "nope.jar"),))
    jar = tmp_path / "sqlite-jdbc-3.45.jar"
    jar.write_bytes(b"PK")
    assert driver_jars("sqlite", extra=(str(jar),), search_dirs=()) == [str(jar)]


@pytest.mark.slow
def test_runs_unchanged_under_spark_submit(sqlite_url, table_prefix, tmp_path):
    """The entry point `spark-submit` runs keeps spark-submit's master and prints JSON;
    on a machine without system drivers, `--jdbc-jar` given to the job (not to
    spark-submit) reaches the driver and the executors; Spark logs no INFO lines."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import pyspark

    import reliable_cli.reconcile

    build(table_prefix).insert(sa.create_engine(sqlite_url))
    jar = tmp_path / "ship" / "jdbc-driver.jar"  # a name that says nothing
    jar.parent.mkdir()
    shutil.copy(driver_jars("sqlite")[0], jar)
    spark_home = os.path.dirname(pyspark.__file__)
    entry = Path(reliable_cli.reconcile.__file__).with_name("__main__.py")
    root = Path(reliable_cli.reconcile.__file__).parents[2]
    env = {
        **os.environ,
        "SPARK_HOME": spark_home,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "RELIABLE_JDBC_SYSTEM_DIRS": "",
        "RELIABLE_JDBC_JARS": "",
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [
            os.path.join(spark_home, "bin", "spark-submit"),
            "--master",
            "local[1]",
            "--conf",
            "spark.ui.enabled=false",
            # what the job chooses for a small database when it starts the JVM itself
            "--driver-java-options",
            " ".join(small_jvm_options()),
            str(entry),
            "--db",
            sqlite_url,
            "--prefix",
            table_prefix,
            "--json",
            "--jdbc-jar",
            str(jar),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert proc.returncode == ExitCode.UNACCOUNTED, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["master"] == "local[1]"
    assert doc["stubs"]["total"] == 41
    info = [ln for ln in proc.stderr.splitlines() if " INFO " in ln]
    assert len(info) <= 5, info[:20]


def test_bad_data_fails_with_a_typed_error(spark, sqlite_url, table_prefix, capsys):
    seeded = build(table_prefix)
    engine = sa.create_engine(sqlite_url)
    seeded.insert(engine)
    with engine.begin() as conn:  # a row no datetime parser accepts
        conn.execute(
            sa.text(
                f'UPDATE "{table_prefix}message_stub" '
                "SET created_at = 'yesterday-ish' WHERE id = 1"
            )
        )
    rc = main(["reconcile", "--db", sqlite_url, "--prefix", table_prefix])
    err = capsys.readouterr().err
    assert rc == ExitCode.FAILURE
    assert "the reconciliation job failed" in err and "yesterday-ish" in err


def test_a_driver_missing_from_the_session_is_named(spark):
    from outbox.reconcile.drivers import JdbcDriver
    from outbox.reconcile.session import require_driver

    absent = JdbcDriver(
        "postgresql", "org.example.NoSuchDriver", ("none.jar",), "libpostgresql-jdbc-java"
    )
    with pytest.raises(DriverNotFound, match="libpostgresql-jdbc-java"):
        require_driver(spark, absent)


def test_jars_spark_submit_set_are_kept(tmp_path, monkeypatch):
    """spark-submit's --jars count as the driver (no system jar needed) and stay first in
    spark.jars: merged with --conf spark.jars and --jdbc-jar, never replaced."""
    from outbox.reconcile.session import merge_jars, split_jars

    monkeypatch.delenv("RELIABLE_JDBC_JARS", raising=False)
    nowhere = (str(tmp_path),)
    # a driver shipped by spark-submit, possibly remote: nothing more to add, no error
    assert (
        driver_jars(
            "postgresql", search_dirs=nowhere, provided=("hdfs:///jars/postgresql-42.7.jar",)
        )
        == []
    )
    # a name that says nothing: the class check in the started session decides
    assert driver_jars("mariadb", search_dirs=nowhere, provided=("/opt/x/driver.jar",)) == []
    monkeypatch.setenv("RELIABLE_JDBC_SYSTEM_DIRS", "")
    with pytest.raises(DriverNotFound):
        driver_jars("sqlite")  # no system directory to search, nothing shipped
    submitted = split_jars(" /a/one.jar,hdfs:///b/two.jar ,")
    assert merge_jars(submitted, split_jars("/c/three.jar,/a/one.jar"), ["/d/four.jar"]) == [
        "/a/one.jar",
        "hdfs:///b/two.jar",
        "/c/three.jar",
        "/d/four.jar",
    ]


@pytest.mark.slow
def test_a_local_session_binds_to_loopback(tmp_path):
    """Without SPARK_LOCAL_IP, a local master's driver still binds to 127.0.0.1 (no
    non-loopback address, no warning about one)."""
    import os
    import subprocess
    import sys

    code = (
        "from outbox.reconcile.session import spark_session\n"
        f"s = spark_session('local[1]', java_options={small_jvm_options()!r})\n"
        "print(s.sparkContext.getConf().get('spark.driver.host'))\n"
        "s.stop()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SPARK_LOCAL_IP"}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    import socket

    host = proc.stdout.strip().splitlines()[-1]  # "localhost" for 127.0.0.1
    assert socket.gethostbyname(host).startswith("127."), host
    assert "loopback" not in proc.stderr
