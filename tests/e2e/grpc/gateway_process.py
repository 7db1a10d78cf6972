"""The gateway (`reliable gateway start`, broker/gateway) as a real subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

from tests.e2e.grpc.server_process import REPO, ChildProcess, ServerProcess

_READY = re.compile(r"reliable gateway: serving on ([\w.\-]+):(\d+)")


class GatewayProcess(ChildProcess):
    """Start, SIGTERM and SIGKILL one gateway in front of the broker at `broker`."""

    def __init__(self, broker: str, *extra: str, port: int = 0) -> None:
        self.broker = broker
        self.extra = extra
        self.port = port
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 300.0) -> GatewayProcess:
        """Started, and serving; the first start of a checkout builds the program (a
        minute or more on a loaded machine: the timeout allows for it)."""
        env = dict(os.environ, PYTHONPATH=str(REPO))
        listen = f"127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "reliable_cli", "gateway", "start"]
        cmd += ["--broker", self.broker, "--listen", listen, *self.extra]
        self.output = []
        self._launch(cmd, env, "the gateway", timeout_s)
        return self

    def _pumped(self, line: str, ready: threading.Event) -> None:
        m = _READY.search(line)
        if m and not ready.is_set():
            self.port = int(m.group(2))
            ready.set()


class Fronted:
    """A broker seen through its gateway: the gateway's endpoint, the rest the broker's
    (its store, its output, its wire port), so tests written for a `ServerProcess` run
    unchanged through the gateway."""

    def __init__(self, broker: ServerProcess, gateway: GatewayProcess) -> None:
        self.broker = broker
        self.gateway = gateway

    @property
    def endpoint(self) -> str:
        return self.gateway.endpoint

    def __getattr__(self, name: str) -> object:
        return getattr(self.broker, name)


__all__ = ["Fronted", "GatewayProcess"]
