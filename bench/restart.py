"""Restart suite: how long a SIGKILLed broker takes to serve again, by store size.

For each size a store is filled in process (`MessageStore.put_batch`, 1 KiB bodies, a
key and a unique key a message, 4 topics x 8 queues, the default 1 GiB commitlog files),
then served by a real `reliable broker start --flush sync` (a subprocess). A framework
producer (grpc transport, over gRPC, no retries of its own) sends one message after
another; the server is SIGKILLed and started again on the same store and port, KILLS times
in a row. Each round measures

- serving: from the SIGKILL to the restarted server's `serving on` line (the process's
  start, the store's recovery after an abnormal stop, the server's start);
- first send: from the SIGKILL to the first send of the producer that lived through the
  kill acknowledged again (its transport reconnecting within about a second of the
  server's return, docs/operations.md).

Figures are the median of the rounds. Sizes: 64 MiB, 256 MiB, 1 GiB, 4 GiB (`--quick`:
16 MiB and 64 MiB); a size not run is null in `--json`.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench._common import Options, SuiteResult, progress

DESCRIPTION = "restart after SIGKILL (--flush sync): time to serve again, by store size"

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20
SIZES_MIB = (64, 256, 1024, 4096)
QUICK_SIZES_MIB = (16, 64)
KEYS_MIB = tuple(sorted({*SIZES_MIB, *QUICK_SIZES_MIB}))
TOPICS, QUEUES, BATCH, BODY = 4, 8, 32, 1024
START_TIMEOUT_S = 300.0
NOT_YET_S = 0.25
_READY = re.compile(r"serving on [\w.\-]+:(\d+)")


def metric_keys() -> list[str]:
    """Every key the suite's `--json` carries (null for a size not run)."""
    return [
        f"restart_{mib}mib_{what}" for mib in KEYS_MIB for what in ("serving_s", "first_send_s")
    ]


def fill(store: Path, size: int) -> int:
    """A store of about `size` commitlog bytes, stopped cleanly; returns its records."""
    from broker.store.config import FlushMode, StoreConfig
    from broker.store.store import MessageStore
    from protocol.props import Prop

    s = MessageStore(StoreConfig(store_dir=store, flush_mode=FlushMode.ASYNC_FLUSH))
    s.start()
    try:
        bodies = [os.urandom(BODY)] * BATCH
        shared = {Prop.TAGS: "bench"}
        n = k = 0
        while s.commitlog.get_max_offset() < size:
            ids = range(n, n + BATCH)
            s.put_batch(
                f"RestartTopic{k % TOPICS}",
                (k // TOPICS) % QUEUES,
                bodies,
                shared,
                keys=[f"order-{i}" for i in ids],
                uniq_keys=[f"{i:032X}" for i in ids],
            )
            n += BATCH
            k += 1
        s.wait_dispatched(600.0)
    finally:
        s.shutdown()
    return n


class Server:
    """`reliable broker start --flush sync` on one store, started, SIGKILLed, started."""

    def __init__(self, store: Path, home: Path) -> None:
        self.store, self.home = store, home
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=20)

    def start(self) -> float:
        """Start it and wait for its ready line; returns `time.monotonic()` then."""
        env = dict(os.environ, HOME=str(self.home), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        argv = ["-m", "reliable_cli", "broker", "start", "--store", str(self.store)]
        argv += ["--port", str(self.port), "--flush", "sync"]
        # the disk is shared: its fill level is not this suite's to depend on
        argv += ["--disk-clean-ratio", "1.0", "--disk-full-ratio", "1.0"]
        proc = subprocess.Popen(
            [sys.executable, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=REPO,
        )
        self.proc = proc
        ready = threading.Event()
        when: list[float] = []

        def drain() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.tail.append(line)
                m = _READY.search(line)
                if m and not ready.is_set():
                    when.append(time.monotonic())
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=drain, name="restart-server-output", daemon=True).start()
        if not ready.wait(START_TIMEOUT_S) or not when:
            self.kill()
            raise RuntimeError(f"the server did not start: {''.join(self.tail)[-800:]}")
        return when[0]

    def kill(self) -> tuple[float, float]:
        """SIGKILL; returns `time.monotonic()` at the signal and once the process is gone
        (an answer read after that was not sent by it)."""
        at = time.monotonic()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        return at, time.monotonic()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()


class Sender:
    """A producer that lives through the kills, sending one message after another."""

    def __init__(self, endpoint: str) -> None:
        from reliable import Producer

        self.producer = Producer(
            "grpc", endpoint=endpoint, wire="grpc", retry_times_when_send_failed=0
        )
        self.acked: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="restart-sender", daemon=True)

    def __enter__(self) -> Sender:
        self.producer.start()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        try:
            self.producer.shutdown()
        except Exception as e:  # the server may be gone: the goodbye does not land
            progress(f"producer shutdown: {e}")

    def _loop(self) -> None:
        from reliable import Message

        while not self.stop.is_set():
            try:
                self.producer.send(Message("RestartProbe", b"x" * 64))
            except Exception:  # the server is down: the next send tries again
                time.sleep(0.01)
                continue
            self.acked.append(time.monotonic())

    def first_ack_after(self, since: float, timeout_s: float = 120.0) -> float | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            later = [t for t in self.acked[-64:] if t >= since]
            if later:
                return min(later)
            time.sleep(0.005)
        return None


def measure(store: Path, home: Path, kills: int) -> tuple[list[float], list[float]]:
    """(serving seconds, first-send seconds), one of each a round."""
    server = Server(store, home)
    server.start()
    serving: list[float] = []
    first_send: list[float] = []
    try:
        with Sender(f"127.0.0.1:{server.port}") as sender:
            if sender.first_ack_after(0.0, 60.0) is None:
                raise RuntimeError("no send was acknowledged before the first kill")
            for _ in range(kills):
                time.sleep(0.2)  # sends in flight at the kill
                down, gone = server.kill()
                ready = server.start()
                # answers the dead process sent before it died may still be read just
                # after: none of the new one's comes this soon (its imports alone take
                # longer)
                back = sender.first_ack_after(gone + NOT_YET_S)
                serving.append(ready - down)
                first_send.append(float("nan") if back is None else back - down)
    finally:
        server.stop()
    return serving, first_send


def run(opts: Options) -> SuiteResult:
    result = SuiteResult()
    workdir = opts.workdir or Path.cwd()
    sizes = QUICK_SIZES_MIB if opts.quick else SIZES_MIB
    kills = 2 if opts.quick else 3
    result.metrics.update(dict.fromkeys(metric_keys()))
    home = workdir / "home"  # the server's HOME (nothing is written there by it)
    home.mkdir(exist_ok=True)
    lines = [
        f"{'store':>8} {'records':>10} {'serving s (median)':>19} {'first send s':>13}  rounds",
        "-" * 84,
    ]
    for mib in sizes:
        store = workdir / f"store-{mib}mib"
        try:
            progress(f"filling a {mib} MiB store")
            records = fill(store, mib * MIB)
            progress(f"{mib} MiB: {records:,} records; SIGKILL and restart x{kills}")
            serving, first = measure(store, home, kills)
        except Exception as exc:  # one size failing never hides the others
            result.errors.append(f"{mib} MiB: {type(exc).__name__}: {exc}")
            lines.append(f"{mib:>5} MiB  not measured: {exc}")
            continue
        finally:
            shutil.rmtree(store, ignore_errors=True)
        med_serving = round(statistics.median(serving), 3)
        med_first = round(statistics.median(first), 3)
        result.metrics[f"restart_{mib}mib_serving_s"] = med_serving
        result.metrics[f"restart_{mib}mib_first_send_s"] = med_first
        rounds = ", ".join(f"{s:.2f}/{f:.2f}" for s, f in zip(serving, first, strict=True))
        lines.append(
            f"{mib:>5} MiB {records:>10,} {med_serving:>19.2f} {med_first:>13.2f}  {rounds}"
        )
    shutil.rmtree(home, ignore_errors=True)
    lines.append(
        "serving: SIGKILL to the `serving on` line; first send: SIGKILL to the first send "
        "acknowledged to the producer that lived through it (rounds: serving/first send)"
    )
    result.notes.extend(lines)
    return result
