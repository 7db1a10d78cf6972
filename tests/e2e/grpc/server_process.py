"""The broker server as a real subprocess (`python -m reliable_cli broker start ...`)."""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
# Small files: the 1 GiB default is preallocated on disk for every store a test makes.
# Watermarks off: these tests are about delivery, and the host disk is shared, so its
# fill level is not theirs to depend on (disk-full behaviour has its own tests).
TEST_STORE = (
    "--commitlog-file-size",
    str(8 << 20),
    "--disk-clean-ratio",
    "1.0",
    "--disk-full-ratio",
    "1.0",
)
_READY = re.compile(r"serving on ([\w.\-]+):(\d+)")
_WIRE = re.compile(r"native wire on ([\w.\-]+):(\d+)")


class ChildProcess:
    """A child process (`proc`) started by `_launch`, which reads its output (`output`)
    until the ready line, and ended with SIGKILL or SIGTERM."""

    proc: subprocess.Popen[str] | None = None
    output: list[str]
    _reader: threading.Thread | None = None  # reads `output` until the pipe closes

    def _launch(
        self,
        cmd: list[str],
        env: dict[str, str],
        what: str,
        timeout_s: float,
        log_file: Path | None = None,
    ) -> None:
        """Start `cmd` and return once `_pumped` has seen its ready line; RuntimeError with
        its output when it exits or `timeout_s` passes first. Its output is read to its
        end in a thread (a full pipe would stall it), kept in `log_file` too when given."""
        self.output = []
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO
        )
        ready = threading.Event()
        if log_file is not None:
            log_file.parent.mkdir(parents=True, exist_ok=True)

        def pump(proc: subprocess.Popen[str]) -> None:
            assert proc.stdout is not None
            kept = log_file.open("a") if log_file is not None else None
            try:
                for line in proc.stdout:
                    self.output.append(line)
                    if kept is not None:
                        kept.write(line)
                        kept.flush()
                    self._pumped(line, ready)
            finally:
                if kept is not None:
                    kept.close()

        self._reader = threading.Thread(target=pump, args=(self.proc,), daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout_s
        while not ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{what} did not start:\n" + "".join(self.output))

    def _pumped(self, line: str, ready: threading.Event) -> None:
        """One line of output: set `ready` at the ready line."""
        raise NotImplementedError

    def kill(self) -> None:
        """SIGKILL: no shutdown hook runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self._read_to_the_end()

    def terminate(self, timeout_s: float = 20.0) -> int:
        """SIGTERM and wait; returns the exit code, with every line the process wrote in
        `output` (its last lines, such as an exit summary, are read after it exits)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout_s)
        self._read_to_the_end()
        return code

    def _read_to_the_end(self, timeout_s: float = 10.0) -> None:
        """Wait for the reader to reach the end of the output (a child of the process
        that outlives it keeps the pipe open: then up to `timeout_s`)."""
        if self._reader is not None:
            self._reader.join(timeout_s)


class ServerProcess(ChildProcess):
    """Start, SIGTERM, SIGKILL and restart one server on one store directory."""

    def __init__(self, store: Path, home: Path, *extra: str, port: int = 0) -> None:
        self.store = store
        self.home = home
        self.extra: Sequence[str] = extra
        self.port = port
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []
        self.wire_port = 0  # the native wire's port, when started with --wire-port

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> ServerProcess:
        env = dict(os.environ, HOME=str(self.home), PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [
            sys.executable,
            "-m",
            "reliable_cli",
            "broker",
            "start",
            "--store",
            str(self.store),
            "--port",
            str(self.port),
            *TEST_STORE,
            *self.extra,
        ]
        # kept beside the store as well: the output of a run that failed stays on disk
        log_file = self.store.parent / f"{self.store.name}.log"
        self._launch(cmd, env, "server", timeout_s, log_file)
        return self

    def _pumped(self, line: str, ready: threading.Event) -> None:
        wired = _WIRE.search(line)
        if wired:
            self.wire_port = int(wired.group(2))
        m = _READY.search(line)
        if m and not ready.is_set():
            self.port = int(m.group(2))
            ready.set()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`reliable ARGS...` as a user runs it, from the repository, to its end."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "reliable_cli", *args],
        env=env,
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=180,
    )


def admin_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`reliable admin ARGS...` as a user runs it, from the repository."""
    return cli("admin", *args)


def admin_json(*args: str) -> Any:
    """The JSON document `reliable admin ARGS... --json` prints; it must exit 0."""
    done = admin_cli(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def stored_records(store: Path) -> Iterator[Any]:
    """Every message record of a store's commitlog (a `MessageExt` each), read file by file
    from disk, in offset order: what a store holds, whatever its server says."""
    from broker.store.codec import BLANK_MAGIC_CODE, decode_message

    for path in sorted((store / "commitlog").iterdir()):
        if not path.name.isdigit():
            continue
        buf = path.read_bytes()
        pos = 0
        while pos + 8 <= len(buf):
            total, magic = struct.unpack_from(">ii", buf, pos)
            if total <= 0 or magic == BLANK_MAGIC_CODE:
                break
            yield decode_message(buf, pos)
            pos += total
