"""The console is a long-running command like the others: `--metrics-port` serves /metrics,
/healthz and /readyz (ready while the broker answers), `--log-format json` keeps its stderr
one JSON object per line."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

from tests.e2e.console.harness import ConsoleProcess, wait_for
from tests.e2e.grpc.server_process import ServerProcess

_METRICS = re.compile(r"metrics on (http://[\w.\-]+:\d+)/metrics")


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_probes_follow_the_broker_and_logs_are_json(tmp_path: Path) -> None:
    broker = ServerProcess(tmp_path / "store", tmp_path / "home").start()
    console = ConsoleProcess(
        broker.endpoint, "--no-auth", "--metrics-port", "0", "--log-format", "json"
    ).start()
    try:
        base = wait_for(
            lambda: next(
                (m.group(1) for line in console.output if (m := _METRICS.search(line))), None
            )
        )
        assert _status(f"{base}/healthz") == 200
        assert wait_for(lambda: _status(f"{base}/readyz") == 200)
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as resp:
            assert b"process_cpu_seconds_total" in resp.read()
        serving = [line for line in console.output if "serving http://" in line]
        assert serving and json.loads(serving[0])["level"] == "WARNING"

        broker.kill()
        assert wait_for(lambda: _status(f"{base}/readyz") == 503)
        assert _status(f"{base}/healthz") == 200  # the console itself is alive
    finally:
        console.stop()
        broker.kill()
