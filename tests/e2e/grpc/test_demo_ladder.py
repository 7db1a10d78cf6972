"""`reliable demo --endpoint` against a served broker: the demo reads the server's retry
ladder (the Settings reply's backoff policy) and waits for it, or says why it cannot; it
never reports loss for a configuration difference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.grpc.server_process import REPO, ServerProcess


def _demo(endpoint: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "reliable_cli",
            "demo",
            "--endpoint",
            endpoint,
            "--no-reconcile",
            "--db",
            f"sqlite:///{tmp_path / 'shop.db'}",
            "--table-prefix",
            f"ladder{os.getpid()}_",
            *args,
        ],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.redis
def test_a_ladder_too_long_to_wait_for_is_said_not_reported_as_loss(
    tmp_path: Path, client_home: Path
) -> None:
    # started as the README shows: RocketMQ's default ladder (10 s, 30 s, 1 min, 2 min, ...)
    server = ServerProcess(tmp_path / "store", client_home).start()
    try:
        done = _demo(server.endpoint, tmp_path, "--orders", "5", "--max-reconsume-times", "8")
    finally:
        server.kill()
    assert done.returncode == 4, done.stdout + done.stderr
    assert "retry ladder waits 10s, 30s, 1m, 2m" in done.stderr, done.stderr
    assert "--delay-levels" in done.stderr and "Nothing was published" in done.stderr
    assert "NOT CLEAN" not in done.stdout + done.stderr


@pytest.mark.redis
@pytest.mark.slow
def test_the_demo_waits_for_the_servers_ladder(
    tmp_path: Path, make_server: Callable[..., ServerProcess]
) -> None:
    server = make_server("--delay-levels", "1s 1s 3s 3s 3s 3s")
    # --timeout 3 alone would give up while retries still wait on the server's ladder
    done = _demo(
        server.endpoint,
        tmp_path,
        "--orders",
        "15",
        "--seed",
        "3",
        "--poison",
        "1",
        "--timeout",
        "3",
        "--json",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "retry ladder (the broker's delay levels): 3s, 3s, 3s" in done.stderr, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["settled"] and summary["unaccounted"] == 0 and summary["problems"] == []
    assert summary["dead_lettered"] == summary["poison"] == 1
