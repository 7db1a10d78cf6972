"""`python -m bench flow`: its contract, not its figures. The quick run ends with one JSON
object carrying the agreed keys, and the whole flow was verified exactly once (every order
one reservation, every stub confirmed); the run's tables are dropped afterwards. The quick
run measures one handler-thread count and leaves out the Spark reconciliation (a JVM
start), so that it stays well under a minute."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import flow

ROOT = Path(__file__).resolve().parents[2]
FLOW_KEYS = {
    "publish_txn_alone_commits_s",
    "publish_with_stub_commits_s",
    "publish_stub_overhead",
    "consume_bare_msgs_s",
    "consume_guard_msgs_s",
    "consume_guard_overhead",
    "flow_orders_s",
    "flow_floor_orders_s",
    "flow_baseline_orders_s",
    "flow_exactly_once",
    "consume_processes_scaling",
    "resend_sweep_1m_s",
}


def test_the_agreed_keys_are_the_suites() -> None:
    assert set(flow.AGREED) == FLOW_KEYS


def test_targets_read_short_met_or_unmeasured() -> None:
    verdicts = {name: met for name, met, _ in flow.verdicts({})}
    assert verdicts["flow exactly once"] is False  # never verified: never claimed
    assert verdicts["guard <= 25%, 4 thr"] is None
    m = {"consume_processes_scaling": {"1": 100.0, "2": 180.0, "4": 250.0}}
    verdicts = {name: met for name, met, _ in flow.verdicts(m)}
    assert verdicts["consume 2 procs >= 1.7x"] is True
    assert verdicts["consume 4 procs >= 3x"] is False
    # the guard's line says how much of a core each one-process case took
    m = {
        "consume_guard_overhead": 0.4,
        "consume_guard_t4_msgs_s": 800.0,
        "consume_guard_t4_cpu_us": {"consumers": 1000.0, "postgres": 500.0},
        "consume_guard_t4_machine_busy": 0.75,
        "consume_bare_t4_msgs_s": 1300.0,
        "consume_bare_t4_cpu_us": {"consumers": 600.0},
    }
    figures = {name: (met, words) for name, met, words in flow.verdicts(m)}
    met, words = figures["guard <= 25%, 4 thr"]
    assert met is False
    assert words == (
        "throughput -40%; bare's process 0.78 of a core; "
        "guard's process 0.80 of a core (machine 75% busy)"
    )


def test_quick_runs_one_thread_count_and_no_spark() -> None:
    quick, full = flow.counts(True), flow.counts(False)
    assert quick.consume_threads == (flow.PROCESS_THREADS,) and not quick.reconcile
    assert full.consume_threads == flow.CONSUME_THREADS and full.reconcile
    assert full.sweep == 1_000_000


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.mariadb
@pytest.mark.redis
@pytest.mark.timeout(300)  # about 50 s alone; more on a busy 2-core machine
def test_flow_suite_quick_json_verifies_exactly_once(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "flow", "--quick", "--json", "--dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, (metrics.get("errors"), proc.stderr[-3000:])
    assert not FLOW_KEYS - metrics.keys(), FLOW_KEYS - metrics.keys()
    assert metrics["flow_exactly_once"] is True
    for key in FLOW_KEYS - {"flow_exactly_once", "resend_sweep_1m_s", "consume_processes_scaling"}:
        assert isinstance(metrics[key], int | float), key
    assert set(metrics["consume_processes_scaling"]) == {"1", "2", "4"}
    assert metrics["resend_sweep_1m_s"] is None  # the quick sweep is not over 1M stubs
    assert metrics["resend_sweep_s"] > 0 and metrics["resend_sweep_stubs"] == 20_000
    assert metrics["flow_stubs_confirmed"] == metrics["flow_commits"]  # each stub confirmed
    # the background publish drained every commit's send itself: none left to the worker
    for writers in flow.PUBLISH_WRITERS:
        key = f"publish_with_stub_background_w{writers}"
        assert metrics[f"{key}_commits_s"] > 0 and metrics[f"{key}_left_to_worker"] == 0
    assert metrics["resend_sweep_resent"] == metrics["resend_sweep_due"]
    assert "flow_ours" in proc.stdout and "target: flow exactly once" in proc.stdout
    # what each flow case cost, layer by layer: ours ran the broker, its consumers,
    # PostgreSQL and Redis; the baseline its relay, consumers and NATS; the floor neither
    ours, base = metrics["flow_cpu_us"], metrics["flow_baseline_cpu_us"]
    assert {"bench", "broker", "consumers", "postgres"} <= ours.keys(), ours
    assert {"relay", "hw_consumers", "nats", "postgres"} <= base.keys(), base
    assert not {"broker", "relay", "nats", "hw_consumers"} & metrics["flow_floor_cpu_us"].keys()
    for key in ("flow", "flow_floor", "flow_baseline", "consume_guard_t4", "consume_guard_p2"):
        assert 0 < metrics[f"{key}_machine_busy"] <= 1, key
    assert set(metrics["consume_processes_machine_busy"]) == {"1", "2", "4"}
    # MariaDB's and SQLite's cases, on tables of their own: the order alone and with the
    # stub; MariaDB's bare and guarded handler and its flow, exactly once, stubs confirmed
    assert "mariadb_error" not in metrics and "sqlite_error" not in metrics
    for label in ("mariadb", "sqlite"):
        for writers in flow.PUBLISH_WRITERS:
            for case in ("txn_alone", "with_stub"):
                assert metrics[f"{label}_publish_{case}_w{writers}_commits_s"] > 0, label
        assert isinstance(metrics[f"{label}_publish_stub_overhead"], float), label
    assert "mariadb" in metrics["mariadb_publish_with_stub_w16_cpu_us"]  # its own layer
    assert metrics["mariadb_consume_bare_t4_msgs_s"] > 0
    assert metrics["mariadb_consume_guard_t4_msgs_s"] > 0
    assert isinstance(metrics["mariadb_consume_guard_overhead"], float)
    assert metrics["mariadb_flow_exactly_once"] is True
    assert metrics["mariadb_flow_orders_s"] > 0 and metrics["mariadb_flow_floor_orders_s"] > 0
    assert metrics["mariadb_flow_stubs_confirmed"] == metrics["mariadb_flow_commits"]
    assert list(tmp_path.iterdir()) == []
