"""gRPC's core fork handlers stay off in the project's processes (`protocol/__init__.py`).

On, they run at every fork of a process that has loaded grpc: beside a channel, a
`subprocess.Popen` with a `preexec_fn` (a fork, where Python otherwise uses vfork) starts
a poller in the child that finds its epoll descriptor closed, and the child dies of
SIGABRT before its exec (grpc/grpc#43055; here within a few dozen forks). Each case runs
a fresh interpreter, since the core reads the setting once, at grpc's first import.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# a channel busy connecting (nothing listens on port 1), then forks to exec, as a launcher
# does; the core logs each fork it handles (or skips) at debug verbosity
SCRIPT = """
import subprocess
{first}
import grpc
channel = grpc.insecure_channel("127.0.0.1:1")
try:
    grpc.channel_ready_future(channel).result(timeout=0.3)
except grpc.FutureTimeoutError:
    pass
crashed = 0
for _ in range({forks}):
    crashed += subprocess.run(["true"], preexec_fn=lambda: None).returncode != 0
channel.close()
print(crashed)
"""
FORKS = 60


def _run(first: str) -> tuple[int, str]:
    """(children that did not exit 0, the core's log)."""
    environ = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    environ.update(GRPC_VERBOSITY="debug", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(first=first, forks=FORKS)],
        capture_output=True,
        text=True,
        timeout=120,
        env=environ,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(proc.stdout.split()[-1]), proc.stderr


def _handled(crashed: int, log: str) -> bool:
    """The core took part in the forks: it logged one (handled or skipped), or a child
    died before its exec."""
    return crashed > 0 or "fork_posix" in log


def test_grpc_alone_handles_the_forks_and_children_die() -> None:
    """The control: without the project, grpcio's core takes part in the forks."""
    assert _handled(*_run(""))


def test_importing_the_client_first_turns_the_handlers_off() -> None:
    crashed, log = _run("import reliable")
    assert crashed == 0 and "fork_posix" not in log


def test_each_package_that_loads_grpc_turns_them_off() -> None:
    for package in ("broker", "reliable_cli", "apache_rocketmq", "bench"):
        crashed, log = _run(f"import {package}")
        assert crashed == 0 and "fork_posix" not in log, package


def test_a_setting_of_the_users_wins() -> None:
    """A user who runs gRPC in forked children without an exec keeps the fork support
    they asked for (gRPC's Python layer then takes part in the forks too)."""
    environ = dict(os.environ, GRPC_ENABLE_FORK_SUPPORT="true", PYTHONPATH=str(ROOT))
    probe = "import os, reliable; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=environ, check=True
    )
    assert out.stdout.strip() == "true"
