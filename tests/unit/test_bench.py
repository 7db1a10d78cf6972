"""The benchmark runner's contract (not its figures): `python -m bench store --quick --json`
ends with one JSON object holding the agreed keys, and runs every discovered suite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = {"floor_msgs_s", "put_async_1k_msgs_s", "put_async_16k_mb_s", "put_sync_64_msgs_s",
            "sync_64_msgs_per_fsync", "dispatch_msgs_s", "read_msgs_s"}


@pytest.mark.slow
def test_store_suite_quick_json(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench", "store", "--quick", "--json",
                           "--dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    metrics = json.loads(lines[-1])
    assert isinstance(metrics, dict)
    assert not REQUIRED - metrics.keys(), REQUIRED - metrics.keys()
    for key in REQUIRED:
        assert isinstance(metrics[key], int | float) and metrics[key] > 0, key
    assert "floor 1 KiB" in proc.stdout  # the table is printed too
    assert "[bench]" in proc.stderr and "[bench]" not in proc.stdout  # progress on stderr
    assert list(tmp_path.iterdir()) == []  # the suite's files are removed


def test_runner_lists_suites_and_rejects_unknown_ones() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "store" in proc.stdout and "all" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "bench", "nope"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
