"""The job on a real Spark standalone cluster: a master and a worker started here from the
installed PySpark (on loopback, killed at the end), the job submitted with `spark-submit
--jars`, on a machine that has no system JDBC driver (RELIABLE_JDBC_SYSTEM_DIRS empty):
the driver reaches the executors only through --jars, which the job must keep.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from outbox.reconcile import driver_jars
from protocol.ports import free_port
from reliable_cli.exit_codes import ExitCode

from .conftest import small_jvm_options
from .dataset import build

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
LOOPBACK = "127.0.0.1"


def _spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def _state(webui: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{LOOPBACK}:{webui}/json/", timeout=2) as resp:
        return dict(json.load(resp))


def _wait(
    what: str, check: Any, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60.0
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError, ValueError):
            if check():
                return
        time.sleep(0.2)
    raise AssertionError(f"{what} not up after {timeout} s: {log.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """The daemon and whatever it started (the worker's executors) are one process group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@contextlib.contextmanager
def standalone_cluster(work: Path) -> Iterator[tuple[str, int, Callable[[], None]]]:
    """`spark://127.0.0.1:PORT` with one worker (1 core, 1 GB), the master's web UI port
    (its /json/ says what ran), and a function that waits until the master is ALIVE with
    its worker registered.

    The master and the worker start together, without waiting for each other: a worker
    that finds no master yet retries its registration, and an application submitted before
    the worker registered waits for executors. What the caller does meanwhile (starting a
    driver's JVM) overlaps the daemons' start-up instead of following it."""
    home = _spark_home()
    spark_class = os.path.join(home, "bin", "spark-class")
    env = {
        **os.environ,
        "SPARK_HOME": home,
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_LOG_DIR": str(work / "logs"),
        "SPARK_WORKER_DIR": str(work / "worker"),
        "PYSPARK_PYTHON": sys.executable,
        # the daemons (and the executor the worker starts) serve one small job: the quick
        # JIT compiler only, as the job chooses for its own JVM on a small database
        "SPARK_DAEMON_JAVA_OPTS": " ".join(small_jvm_options()),
    }
    port, webui, worker_ui = free_port(), free_port(), free_port()
    url = f"spark://{LOOPBACK}:{port}"
    procs: list[subprocess.Popen[bytes]] = []
    master_log, worker_log = work / "master.log", work / "worker.log"
    daemons = {
        master_log: [
            "org.apache.spark.deploy.master.Master",
            "--host",
            LOOPBACK,
            "--port",
            str(port),
            "--webui-port",
            str(webui),
        ],
        worker_log: [
            "org.apache.spark.deploy.worker.Worker",
            url,
            "--host",
            LOOPBACK,
            "--cores",
            "1",
            "--memory",
            "1g",
            "--webui-port",
            str(worker_ui),
            "--work-dir",
            str(work / "worker"),
        ],
    }
    try:
        for log, args in daemons.items():
            with open(log, "wb") as out:
                procs.append(
                    subprocess.Popen(
                        [spark_class, *args],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        master, worker = procs

        def wait_up() -> None:
            _wait("the master", lambda: _state(webui)["status"] == "ALIVE", master, master_log)
            _wait("the worker", lambda: _state(webui)["aliveworkers"] == 1, worker, worker_log)

        yield url, webui, wait_up
    finally:
        for proc in reversed(procs):
            _stop(proc)


def test_spark_submit_to_a_standalone_cluster_with_jars(sqlite_url, table_prefix, tmp_path: Path):
    seeded = build(table_prefix)
    seeded.insert(sa.create_engine(sqlite_url))
    # the driver jar under a name the job does not know, where the job does not look
    shipped = tmp_path / "ship" / "driver-for-the-cluster.jar"
    shipped.parent.mkdir()
    shutil.copy(driver_jars("sqlite")[0], shipped)
    home = _spark_home()
    entry = ROOT / "reliable_cli" / "reconcile" / "__main__.py"
    report = tmp_path / "report"
    with standalone_cluster(tmp_path) as (master, webui, wait_up):
        env = {
            **os.environ,
            "SPARK_HOME": home,
            "SPARK_LOCAL_IP": LOOPBACK,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "RELIABLE_JDBC_SYSTEM_DIRS": "",
            "RELIABLE_JDBC_JARS": "",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        # submitted while the master and the worker start: the driver's JVM and the job's
        # checks take longer than the daemons' start, and the application waits for its
        # executor if it registers first
        submit = subprocess.Popen(
            [
                os.path.join(home, "bin", "spark-submit"),
                "--master",
                master,
                "--jars",
                str(shipped),
                "--conf",
                "spark.ui.enabled=false",
                "--conf",
                "spark.executor.memory=512m",
                "--conf",
                "spark.cores.max=1",
                "--driver-java-options",
                " ".join(small_jvm_options()),
                "--conf",
                f"spark.executor.extraJavaOptions={' '.join(small_jvm_options())}",
                str(entry),
                "--db",
                sqlite_url,
                "--prefix",
                table_prefix,
                "--json",
                "--report-parquet",
                str(report),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            start_new_session=True,  # the driver's Python is its child: stopped together
        )
        try:
            wait_up()
            # a hang guard, not a timing: a loaded machine may take minutes
            stdout, stderr = submit.communicate(timeout=270)  # under pytest-timeout
        finally:
            if submit.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(submit.pid, signal.SIGKILL)
                submit.communicate()
        proc = subprocess.CompletedProcess(submit.args, submit.returncode, stdout, stderr)
        state = _state(webui)
    assert proc.returncode == ExitCode.UNACCOUNTED, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["master"] == master
    # every verdict as on local[*] (real time is later than the data set's clock: the
    # young unsent stub is past its grace too)
    expected = {c.value.lower(): len(ids) for c, ids in seeded.stubs.items()}
    expected["lost"] += 1
    expected["backlogged"] -= 1
    assert {k: v for k, v in doc["stubs"].items() if k != "total"} == expected
    assert doc["stubs"]["total"] == sum(len(ids) for ids in seeded.stubs.values())
    assert doc["log_rows"] == {"total": 11, "matched": 7, "orphan": 2, "stale": 2}
    # the executors ran on the worker, with the jar spark-submit shipped
    (app,) = state["completedapps"] or state["activeapps"]
    assert app["name"] == "reliable-reconcile"
    assert list(report.glob("*.parquet"))
    # sized from the data: a small run takes few tasks (a behaviour, not a timing)
    assert 0 < doc["tasks"] <= 60, doc["tasks"]
    # spark.log.level=WARN from the start: the INFO lines of a run are gone
    info = [ln for ln in proc.stderr.splitlines() if " INFO " in ln]
    assert len(info) <= 5, info[:20]
