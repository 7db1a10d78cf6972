"""gRPC suite: our RocketMQ 5 gRPC server, driven by the framework's `grpc` transport and by
the official client, beside RabbitMQ and NATS JetStream (the `peers` suite, same run, same
counts) and beside the cap the official client reaches against a server that does no work.

The server runs as a real subprocess (`reliable broker start`) on a loopback port, async
flush unless the case says sync_flush. 1 KiB bodies; one client process and thread:

- framework_send: `reliable.Producer.send`, one at a time (each call timed: p50/p99);
- framework_send_sync_flush: the same against a server started with `--flush sync` (a send
  is acknowledged after its fsync; concurrent sends share a group commit);
- framework_send_pipelined: `Producer.send_async` with a window of 1000 in flight;
- framework_send_pipelined_sync_flush: the same on the `--flush sync` server;
- framework_asend_pipelined: `await Producer.asend` on one asyncio loop, 1000 in flight;
- framework_send_batch: `Producer.send_batch` of 32 (one SendMessage, the repeated field);
- framework_wire_*: the framework cases (and the two sync_flush ones) with the transport's
  unary calls over the server's native wire (`wire="native"`, docs/wire.md) instead of gRPC;
- framework_receive_ack: `reliable.SimpleConsumer.receive(32)` + `ack_async` per message
  (batched into one AckMessage underneath; every ack confirmed before the clock stops), or
  `ack` per message with a client that has no `ack_async`;
- official_send / official_send_async / official_receive_ack: the official client
  (`rocketmq-python-client`): `Producer.send` one at a time, `send_async` with a window of
  256 (OFFICIAL_WINDOW: see there), `SimpleConsumer.receive(32)` + `ack` per message;
- stub_official_* / stub_framework_*: the same cases against `bench._stub`, a
  MessagingService that answers OK at once: each client's own cap on this machine. The
  stub and our server are up together for the official cases, and each of those runs
  against the stub, then at once against ours, before the next one starts;
- embedded_send / embedded_receive_ack: the framework's code over the in-process broker
  (no gRPC): `send_async` with a window of 1000, receive(32) + ack;
- embedded_push_consume: a `reliable.PushConsumer` (default settings, a listener that does
  nothing) over the in-process broker, from its start until it has consumed every message.
  The embedded cases wait (untimed) for the store to warm and dispatch what was put before
  each consume case and after the pipelined send, whose CPU per message includes that
  dispatch: the in-process store's background work counts where it was caused.

Consume cases take the pipelined count of messages from a topic holding all that was sent.
The table is followed by a comparison: each of our cases beside its peer, with the ratio and
the target it is held to.
"""

from __future__ import annotations

import asyncio
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
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import peers
from bench._common import (
    APART_S,
    Measured,
    Options,
    Row,
    SuiteResult,
    collected,
    fdatasync_apart_p50_ms,
    fdatasync_p50_ms,
    format_table,
    percentiles_ms,
    proc_stat,
    progress,
    python_loop_s,
    timed,
)
from bench._common import (
    passes as run_passes,
)

NAME = "grpc"
DESCRIPTION = "RocketMQ 5 gRPC server: framework, official client, embedded vs peers"
BODY = b"x" * 1024
WINDOW = 1000  # pipelined sends in flight, as the peers' pipelined cases
# the official client's send_async: with 1000 in flight on a loaded machine the case stalled
# (futures still pending after 300 s); 256 stays well inside the client's 3 s request deadline
OFFICIAL_WINDOW = 256
BATCH = 32  # messages per send_batch and per receive
REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 60.0
STALL_TIMEOUT_S = 60.0  # a case fails when nothing completes for this long
# the machine line warns when its slowest loop sample took this many times its fastest
UNSTEADY = 1.3
# the client's idle poll bound of the `_polled` case: long enough to poll through a durable
# send's whole wait (round trip and fsync), which the default 200 us does not cover
POLLED_US = 1000

# every figure this suite reports (null when its case failed); the JSON always has them
THROUGHPUT_KEYS = (
    "framework_send",
    "framework_send_sync_flush",
    "framework_send_pipelined",
    "framework_send_pipelined_sync_flush",
    "framework_asend_pipelined",
    "framework_send_batch",
    "framework_receive_ack",
    "framework_wire_send",
    "framework_wire_send_sync_flush",
    "framework_wire_send_sync_flush_polled",
    "framework_wire_send_pipelined",
    "framework_wire_send_pipelined_sync_flush",
    "framework_wire_asend_pipelined",
    "framework_wire_send_batch",
    "framework_wire_receive_ack",
    "official_send",
    "official_send_async",
    "official_receive_ack",
    "stub_official_send",
    "stub_official_send_async",
    "stub_official_receive_ack",
    "stub_framework_send",
    "stub_framework_send_pipelined",
    "stub_framework_asend_pipelined",
    "stub_framework_send_batch",
    "stub_framework_receive_ack",
    "embedded_send",
    "embedded_receive_ack",
    "embedded_push_consume",
)
LATENCY_KEYS = (
    "framework_send",
    "framework_send_sync_flush",
    "framework_wire_send",
    "framework_wire_send_sync_flush",
    "framework_wire_send_sync_flush_polled",
    "official_send",
    "stub_official_send",
    "stub_framework_send",
)
CAP_KEYS = (
    "official_send",
    "official_send_async",
    "official_receive_ack",
    "framework_send",
    "framework_send_pipelined",
    "framework_asend_pipelined",
    "framework_send_batch",
    "framework_receive_ack",
)


@dataclass(frozen=True)
class Comparison:
    ours: str
    peer: str
    target: str = ""
    target_ratio: float | None = None  # ours / peer at least this, when a target is set
    min_msgs_s: float | None = None  # and ours at least this rate
    max_p50_ms: float | None = None  # and ours at most this median latency


# our case beside its peer; the targets are the (never asserted by tests)
COMPARISONS = (
    Comparison("framework_send", "rabbitmq_publish_each"),
    Comparison("framework_send", "nats_publish_each"),
    Comparison(
        "framework_send_sync_flush",
        "rabbitmq_publish_each",
        ">= 3x, >= 2,000/s, p50 <= 0.6 ms",
        3.0,
        2000.0,
        0.6,
    ),
    Comparison("framework_send_sync_flush", "nats_publish_each"),
    Comparison(
        "framework_wire_send_sync_flush",
        "rabbitmq_publish_each",
        ">= 3x, >= 2,000/s, p50 <= 0.6 ms",
        3.0,
        2000.0,
        0.6,
    ),
    Comparison(
        "framework_wire_send_sync_flush_polled",
        "rabbitmq_publish_each",
        ">= 3x, >= 2,000/s, p50 <= 0.6 ms",
        3.0,
        2000.0,
        0.6,
    ),
    Comparison("framework_wire_send", "framework_send", "(the wire vs gRPC)"),
    Comparison("framework_wire_send_sync_flush", "framework_send_sync_flush", "(the wire vs gRPC)"),
    Comparison("framework_wire_send_pipelined", "framework_send_pipelined", "(the wire vs gRPC)"),
    Comparison("framework_wire_receive_ack", "framework_receive_ack", "(the wire vs gRPC)"),
    Comparison("framework_send_pipelined", "rabbitmq_publish_pipelined"),
    Comparison("framework_send_pipelined", "nats_publish_pipelined", ">= 1x", 1.0),
    Comparison("framework_wire_send_pipelined", "nats_publish_pipelined", ">= 1x", 1.0),
    Comparison("framework_send_pipelined_sync_flush", "rabbitmq_publish_pipelined"),
    Comparison("framework_wire_send_pipelined_sync_flush", "nats_publish_pipelined"),
    Comparison("framework_send_batch", "nats_publish_pipelined"),
    Comparison("framework_receive_ack", "rabbitmq_consume_ack"),
    Comparison("framework_receive_ack", "nats_consume_ack", ">= 1x", 1.0),
    Comparison("framework_wire_receive_ack", "nats_consume_ack", ">= 1x", 1.0),
    Comparison("official_send", "rabbitmq_publish_each"),
    Comparison("official_send_async", "rabbitmq_publish_pipelined"),
    Comparison("official_receive_ack", "rabbitmq_consume_ack"),
    Comparison("embedded_send", "nats_publish_pipelined", ">= 2x", 2.0),
    Comparison("embedded_receive_ack", "nats_consume_ack", ">= 2x", 2.0),
    Comparison("embedded_push_consume", "nats_consume_ack", ">= 2x", 2.0),
    Comparison("official_send", "stub_official_send", ">= 80% of cap", 0.8),
    Comparison("official_send_async", "stub_official_send_async", ">= 80% of cap", 0.8),
    Comparison("official_receive_ack", "stub_official_receive_ack", ">= 80% of cap", 0.8),
    Comparison("framework_send", "stub_framework_send"),
    Comparison("framework_send_pipelined", "stub_framework_send_pipelined"),
    Comparison("framework_asend_pipelined", "stub_framework_asend_pipelined"),
    Comparison("framework_send_batch", "stub_framework_send_batch"),
    Comparison("framework_receive_ack", "stub_framework_receive_ack"),
)


class CaseFailed(Exception):
    """A case did not complete (a send failed, a receive came up short)."""


STACK_DUMP_TIMEOUT_S = 30.0


def stalled(why: str, *clients: int) -> CaseFailed:
    """The failure of a case in which nothing completed for `STALL_TIMEOUT_S`, after the
    evidence a stall seen once leaves for later, on stderr: the state of every server
    process and of the case's client processes (`clients`), and the stacks of each one
    still running, and of this process's threads (a client library's own threads, such
    as the official client's event loop and callback pool, show where its futures
    wait): Python by py-spy (native frames too), a JVM by `jcmd Thread.print`. A server
    stopped for the case (`stop_the_others`) is not the one measured: its state only."""
    progress(f"stalled: {why}; the processes' state and stacks follow")
    servers = {*SERVER_PIDS.values(), *(p for ps in SIDE_BY_SIDE.values() for p in ps)}
    running = [os.getpid()]
    for pid in sorted(servers | set(clients)):
        try:
            state = process_state(pid)
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:160]
        except OSError:
            print(f"  process {pid}: gone", file=sys.stderr)
            continue
        print(f"  process {pid}: state {state}: {cmd.decode(errors='replace')}", file=sys.stderr)
        if state != "T":
            running.append(pid)
    for pid in running:
        argv = _stack_dump_argv(pid)
        if argv is None:
            continue
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=STACK_DUMP_TIMEOUT_S)
            text = out.stdout + out.stderr
        except (OSError, subprocess.TimeoutExpired) as exc:
            text = f"{Path(argv[0]).name} failed: {exc}"
        who = "this process (the clients)" if pid == os.getpid() else f"process {pid}"
        print(f"--- stacks of {who}\n{text}", file=sys.stderr, flush=True)
    return CaseFailed(why)


def _stack_dump_argv(pid: int) -> list[str] | None:
    """The command that prints `pid`'s stacks: py-spy for Python, the JVM's own `jcmd`
    for Java; None for another program (the gateway: Go prints its stacks only as it
    dies) or when the tool is missing."""
    try:
        exe = Path(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode())
    except OSError:
        return None
    if exe.name.startswith("python"):
        spy = Path(sys.executable).with_name("py-spy")
        return [str(spy), "dump", "--native", "--pid", str(pid)] if spy.exists() else None
    if exe.name == "java":
        jcmd = exe.with_name("jcmd") if exe.is_absolute() else None
        found = str(jcmd) if jcmd is not None and jcmd.exists() else shutil.which("jcmd")
        return [found, str(pid), "Thread.print"] if found else None
    return None


# --- processes

SERVER_PIDS: dict[str, int] = {}  # endpoint -> the server process serving it
# the servers measured side by side in one run (a server's pid -> all its processes): a
# case measures one of them with the others stopped (SIGSTOP), as on a quiet machine; an
# idle JVM's timers and collector alone take 0.4 of a core of a 2-core machine
SIDE_BY_SIDE: dict[int, tuple[int, ...]] = {}
# a server's pid -> the processes that serve its calls with it (the gateway -> its broker):
# counted in its CPU, and never stopped while it is measured
COMPANIONS: dict[int, tuple[int, ...]] = {}
_stopped: set[int] = set()


def stop_the_others(server_pid: int | None) -> None:
    """Stop every server of `SIDE_BY_SIDE` but `server_pid`'s (nothing when it is not one
    of them), until `continue_all`."""
    continue_all()
    if server_pid is None or server_pid not in SIDE_BY_SIDE:
        return
    keep = {server_pid, *COMPANIONS.get(server_pid, ())}
    for main, pids in SIDE_BY_SIDE.items():
        if main != server_pid:
            for pid in pids:
                if pid in keep:
                    continue
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    continue
                _stopped.add(pid)


def continue_all() -> None:
    """Let every server `stop_the_others` stopped run again."""
    for pid in list(_stopped):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    _stopped.clear()


def process_state(pid: int) -> str:
    """The process's state letter (R running, S sleeping, T stopped, ...)."""
    return proc_stat(pid)[1][0]


def process_cpu_s(pid: int | None = None) -> float:
    """User + system CPU seconds of a process (this one when None), every thread."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    fields = proc_stat(pid)[1]
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu_s(pid: int) -> float:
    """CPU seconds of a server process and of its `COMPANIONS`."""
    return sum(process_cpu_s(p) for p in (pid, *COMPANIONS.get(pid, ())))


class CpuProbe:
    """CPU per message of the client process and of the server process over one case:
    steadier than msg/s on a loaded machine (every thread counted, unlike `cpu_us`)."""

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid
        self.client = self.server = 0.0
        self.start()

    def start(self) -> CpuProbe:
        """Begin a case: the other servers stopped until it is recorded (`Recorder.add`)."""
        stop_the_others(self.server_pid)
        collected()  # the collection the case's clock runs, before the CPU is read
        self.client = process_cpu_s()
        self.server = server_cpu_s(self.server_pid) if self.server_pid else 0.0
        return self

    def per_message(self, n: int) -> tuple[float | None, float]:
        client = (process_cpu_s() - self.client) / n * 1e6
        server = None
        if self.server_pid:
            try:
                server = (server_cpu_s(self.server_pid) - self.server) / n * 1e6
            except OSError:
                server = None
        return server, client


@contextmanager
def serving(argv: list[str], home: Path, what: str) -> Iterator[str]:
    """Run a server subprocess that prints `serving on <host>:<port>`; yield the endpoint.
    Its output is drained in a thread (a full pipe would stall it) and shown on failure."""
    env = dict(os.environ, HOME=str(home), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert proc.stdout is not None
    tail: collections.deque[str] = collections.deque(maxlen=20)
    found = threading.Event()
    endpoint: list[str] = []

    def drain() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line)
            if not found.is_set():
                m = re.search(r"serving on ([\w.]+):(\d+)", line)
                if m:
                    endpoint.append(f"127.0.0.1:{m.group(2)}")
                    found.set()
        found.set()

    threading.Thread(target=drain, name=f"{what}-output", daemon=True).start()
    try:
        if not found.wait(START_TIMEOUT_S) or not endpoint:
            raise CaseFailed(f"{what} did not start: {''.join(tail)[-800:]}")
        SERVER_PIDS[endpoint[0]] = proc.pid
        yield endpoint[0]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def broker_server(store: Path, home: Path, flush: str = "async") -> Any:
    """Our server, its native wire on (docs/wire.md): the wire cases use it, the others
    do not (a client not asking for the wire is served as without it)."""
    return serving(
        [
            "-m",
            "reliable_cli",
            "broker",
            "start",
            "--store",
            str(store),
            "--port",
            "0",
            "--min-long-polling-ms",
            "1000",
            "--min-invisible-ms",
            "1000",
            "--flush",
            flush,
            "--wire-port",
            "0",
        ],
        home,
        f"server (--flush {flush})",
    )


def gateway_server(broker: str, home: Path) -> Any:
    """The gateway (broker.gateway, docs/gateway.md) in front of the server at `broker`,
    on one core (`--procs 1`: on two cores shared with the broker and the client, Go's
    scheduler spent 15-25% more CPU a call with two); its CPU is counted with the
    broker's (`COMPANIONS`)."""
    return serving(
        [
            *("-m", "reliable_cli", "gateway", "start", "--broker", broker),
            *("--listen", "127.0.0.1:0", "--procs", "1"),
        ],
        home,
        "gateway",
    )


def stub_server(home: Path, work_us: float = 0.0) -> Any:
    """The no-work stub (`bench._stub`); `work_us`: the CPU it spends per send and ack."""
    argv = ["-m", "bench._stub", "--port", "0"]
    if work_us:
        argv += ["--work-us", str(work_us)]
    return serving(argv, home, "stub server")


# --- measuring helpers


class Recorder:
    """Rows, metrics and the latencies of one run."""

    def __init__(self, result: SuiteResult) -> None:
        self.result = result
        self.errors: list[str] = []

    def add(
        self,
        name: str,
        m: Measured,
        note: str,
        latencies: list[float] | None = None,
        cpu: CpuProbe | None = None,
    ) -> None:
        continue_all()  # the servers stopped for the case (`CpuProbe`)
        metrics = self.result.metrics
        if latencies:
            p50, p99 = percentiles_ms(latencies)
            metrics[f"{name}_p50_ms"] = p50
            metrics[f"{name}_p99_ms"] = p99
            note += f"; p50 {p50:.2f} ms, p99 {p99:.2f} ms"
        if cpu is not None and m.count:
            server_us, client_us = cpu.per_message(m.count)
            metrics[f"{name}_client_cpu_us"] = round(client_us, 1)
            note += f"; CPU/msg client {client_us:.0f} us"
            if server_us is not None:
                metrics[f"{name}_server_cpu_us"] = round(server_us, 1)
                note += f", server {server_us:.0f} us"
        self.result.rows.append(Row(name, m.msgs_s, m.mb_s, note, m.cpu_us))
        metrics[f"{name}_msgs_s"] = round(m.msgs_s)
        progress(f"{name}: {m.msgs_s:,.0f} msg/s")

    def failed(self, names: tuple[str, ...], exc: BaseException) -> None:
        continue_all()
        why = f"{type(exc).__name__}: {exc}".strip()[:200]
        progress(f"{', '.join(names)}: FAILED ({why})")
        self.errors.append(f"{'/'.join(names)}: {why}")
        for name in names:
            self.result.rows.append(Row(name, 0.0, 0.0, f"FAILED: {why}"[:120], missing=True))

    @contextmanager
    def section(self, *names: str) -> Iterator[None]:
        """Run a group of cases; a failure marks the ones not yet measured, and the run
        goes on with the next group."""
        try:
            yield
        except Exception as exc:
            done = {row.name for row in self.result.rows}
            self.failed(tuple(n for n in names if n not in done), exc)


def each(call: Callable[[], Any], n: int) -> tuple[Measured, list[float]]:
    """`call` n times, one at a time, each timed."""
    latencies: list[float] = []

    def run() -> tuple[int, int]:
        for _ in range(n):
            t = time.perf_counter()
            call()
            latencies.append(time.perf_counter() - t)
        return n, n * len(BODY)

    return timed(run), latencies


def windowed(submit: Callable[[], Any], n: int, window: int = WINDOW) -> Measured:
    """`submit()` (returning a concurrent future) n times with at most `window` futures
    unresolved: a sliding window, as the peers' pipelined publishers keep."""
    slots = threading.BoundedSemaphore(window)
    errors: list[BaseException] = []

    def done(f: Any) -> None:
        exc = f.exception()
        if exc is not None:
            errors.append(exc)
        slots.release()

    def run() -> tuple[int, int]:
        for _ in range(n):
            if not slots.acquire(timeout=STALL_TIMEOUT_S):
                raise stalled(f"no send completed for {STALL_TIMEOUT_S:.0f} s")
            if errors:
                break
            submit().add_done_callback(done)
        for _ in range(window):
            if not slots.acquire(timeout=STALL_TIMEOUT_S):
                raise stalled(f"sends still pending, none completed for {STALL_TIMEOUT_S:.0f} s")
        if errors:
            raise CaseFailed(f"{len(errors)} pipelined sends failed, first: {errors[0]!r}")
        return n, n * len(BODY)

    return timed(run)


def async_windowed(send: Callable[[], Awaitable[Any]], n: int, window: int = WINDOW) -> Measured:
    """`await send()` n times on one asyncio loop with at most `window` awaiting at once."""

    async def main() -> None:
        slots = asyncio.Semaphore(window)
        errors: list[BaseException] = []
        tasks: set[asyncio.Task[None]] = set()

        async def one() -> None:
            try:
                await send()
            except Exception as exc:
                errors.append(exc)
            finally:
                slots.release()

        for _ in range(n):
            try:
                await asyncio.wait_for(slots.acquire(), STALL_TIMEOUT_S)
            except TimeoutError:
                raise stalled(f"no send completed for {STALL_TIMEOUT_S:.0f} s") from None
            if errors:
                break
            task = asyncio.ensure_future(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks, timeout=STALL_TIMEOUT_S)
        if tasks:
            raise stalled(f"{len(tasks)} sends still pending after {STALL_TIMEOUT_S:.0f} s")
        if errors:
            raise CaseFailed(f"{len(errors)} pipelined sends failed, first: {errors[0]!r}")

    def run() -> tuple[int, int]:
        asyncio.run(main())
        return n, n * len(BODY)

    return timed(run)


def drain(receive: Callable[[], list[Any]], ack: Callable[[Any], None], n: int) -> int:
    got = 0
    deadline = time.monotonic() + STALL_TIMEOUT_S
    while got < n and time.monotonic() < deadline:
        for m in receive():
            ack(m)
            got += 1
            deadline = time.monotonic() + STALL_TIMEOUT_S
    if got < n:
        raise stalled(f"received {got} of {n} messages, then none for {STALL_TIMEOUT_S:.0f} s")
    return got


def consumed(receive: Callable[[], list[Any]], ack: Callable[[Any], None], n: int) -> Measured:
    return timed(lambda: (drain(receive, ack, n), n * len(BODY)))


# --- the official client


@dataclass
class _OfficialClient:
    """The official client's producer and consumer of one server's topic."""

    prefix: str
    topic: str
    producer: Any
    consumer: Any
    message_class: Any  # rocketmq.Message, imported once, not per send
    server_pid: int | None  # its server's process, whose CPU a case reads (`CpuProbe`)

    def message(self) -> Any:
        m = self.message_class()
        m.topic, m.body = self.topic, BODY
        return m

    def send(self) -> Any:
        return self.producer.send(self.message())

    def send_async(self) -> Any:
        return self.producer.send_async(self.message())

    def receive(self) -> list[Any]:
        return list(self.consumer.receive(BATCH, 30))


OFFICIAL_START_ATTEMPTS = 3


def _started_official(prefix: str, endpoint: str, await_duration_s: int) -> _OfficialClient:
    """The official client's consumer and producer of `endpoint`, started. Its start asks
    the route once, within its 3 s request timeout, and gives up: on a machine busy with
    other work (the suite's other units) that first call can miss the deadline, so a
    refused start is retried with fresh clients, as a deployment's supervisor would."""
    from rocketmq import (
        ClientConfiguration,
        Credentials,
        FilterExpression,
        Message,
        Producer,
        SimpleConsumer,
    )

    topic = f"bench-{prefix.replace('_', '-')}"
    for attempt in range(1, OFFICIAL_START_ATTEMPTS + 1):
        config = ClientConfiguration(endpoint, Credentials())
        consumer = SimpleConsumer(
            config, f"{topic}-g", {topic: FilterExpression("*")}, await_duration=await_duration_s
        )
        producer = Producer(config, [topic])
        try:
            consumer.startup()
            producer.startup()
        except Exception as e:  # the client raises a bare Exception for a missed route
            with suppress(Exception):
                producer.shutdown()
            with suppress(Exception):
                consumer.shutdown()
            if attempt == OFFICIAL_START_ATTEMPTS:
                raise
            print(f"official client on {endpoint}: {e}; starting again", file=sys.stderr)
            time.sleep(1.0)
            continue
        return _OfficialClient(
            prefix, topic, producer, consumer, Message, SERVER_PIDS.get(endpoint)
        )
    raise AssertionError("unreachable")


def official(
    endpoints: dict[str, str], n: peers.Counts, rec: Recorder, await_duration_s: int = 2
) -> None:
    """The official client's three cases against each server of `endpoints` (prefix ->
    endpoint: `stub_official` for the cap, `official` for ours), case by case, each
    server's run right after the other's: on a machine whose speed moves within minutes a
    case and its cap are measured at the same speed, not minutes apart.
    `await_duration_s`: the consumer's long polling (Apache RocketMQ's proxy refuses a
    receive whose deadline leaves less than 5 s to poll: the rocketmq suite passes 3)."""
    clients: list[_OfficialClient] = []
    try:
        for prefix, endpoint in endpoints.items():
            client = _started_official(prefix, endpoint, await_duration_s)
            clients.append(client)
            client.send()  # warm-up: route, channel, topic creation
            drain(client.receive, client.consumer.ack, 1)
        # the client's CPU is read with the server's: on two cores a server's every µs a
        # call costs the client CPU too (its threads sleep and wake for each answer)
        for c in clients:
            probe = CpuProbe(c.server_pid)
            sync, latencies = each(c.send, n.each)
            rec.add(f"{c.prefix}_send", sync, "send, one at a time", latencies, probe)
        for c in clients:
            probe = CpuProbe(c.server_pid)
            rec.add(
                f"{c.prefix}_send_async",
                windowed(c.send_async, n.pipelined, OFFICIAL_WINDOW),
                f"send_async, {OFFICIAL_WINDOW} in flight",
                cpu=probe,
            )
        for c in clients:
            probe = CpuProbe(c.server_pid)
            rec.add(
                f"{c.prefix}_receive_ack",
                consumed(c.receive, c.consumer.ack, n.pipelined),
                f"receive({BATCH}), ack each",
                cpu=probe,
            )
    finally:
        for c in clients:
            c.producer.shutdown()
            c.consumer.shutdown()


# --- the framework (grpc and embedded transports)


def framework(
    transport: Any,
    prefix: str,
    suffix: str,
    n: peers.Counts,
    rec: Recorder,
    *,
    send_each: bool = True,
    each_note: str = "send, one at a time",
    pipelined: bool = True,
    asend: bool = True,
    batch: bool = True,
    receive: bool = True,
    native: bool | None = None,
    settle: Callable[[], None] | None = None,
) -> None:
    """`settle` (the embedded broker: `settled`) runs after the warm-up and after the
    pipelined send, untimed but inside its CPU probe: the work a send causes in the
    background (dispatch to the consume queues and the index) counts in the send's CPU
    per message, not in the receive case after it; its msg/s stays the rate at which sends
    were acknowledged, as the peers' publish rates are."""
    from reliable import Message, Producer, SimpleConsumer

    topic = f"bench-{prefix}{suffix}".replace("_", "-")
    with (
        SimpleConsumer(
            f"{topic}-g",
            {topic: "*"},
            transport=transport,
            await_duration_s=1,
            invisible_duration_s=30,
        ) as consumer,
        Producer(transport) as producer,
    ):
        producer.send(Message(topic, BODY))  # warm-up: route, channel, topic creation
        drain(lambda: consumer.receive(max_messages=BATCH), consumer.ack, 1)
        if settle is not None:
            settle()
        if (
            native is not None
            and getattr(getattr(transport, "stub", None), "native", None) is not native
        ):
            raise CaseFailed(f"the transport does not use the wire it was given (native={native})")
        probe = CpuProbe(SERVER_PIDS.get(getattr(transport, "endpoint", "")))
        if send_each:
            probe.start()
            sync, latencies = each(lambda: producer.send(Message(topic, BODY)), n.each)
            rec.add(f"{prefix}_send{suffix}", sync, each_note, latencies, probe)
        if pipelined:
            name = f"{prefix}_send_pipelined{suffix}" if send_each else f"{prefix}_send{suffix}"
            before = _requests(producer)
            probe.start()
            window = windowed(lambda: producer.send_async(Message(topic, BODY)), n.pipelined)
            note = f"send_async, {WINDOW} in flight{_per_request(producer, before, n.pipelined)}"
            if settle is not None:
                settle()
                note += "; CPU includes the dispatch"
            rec.add(name, window, note, cpu=probe)
        if asend:
            before = _requests(producer)
            probe.start()
            rec.add(
                f"{prefix}_asend_pipelined{suffix}",
                async_windowed(lambda: producer.asend(Message(topic, BODY)), n.pipelined),
                f"await asend, {WINDOW} in flight{_per_request(producer, before, n.pipelined)}",
                cpu=probe,
            )
        if batch:
            batches = max(1, n.pipelined // BATCH)

            def send_batches() -> tuple[int, int]:
                for _ in range(batches):
                    producer.send_batch([Message(topic, BODY) for _ in range(BATCH)])
                return batches * BATCH, batches * BATCH * len(BODY)

            probe.start()
            rec.add(
                f"{prefix}_send_batch{suffix}",
                timed(send_batches),
                f"send_batch of {BATCH}",
                cpu=probe,
            )
        if receive:
            probe.start()
            measured, note = receive_ack(consumer, n.pipelined)
            rec.add(f"{prefix}_receive_ack{suffix}", measured, note, cpu=probe)


def push_consume(
    transport: Any, n: int, rec: Recorder, settle: Callable[[], None] | None = None
) -> None:
    """`n` messages sent first (then `settle()`, untimed, where given), then a PushConsumer
    with a no-op listener, timed from its start until the listener has seen them all."""
    from reliable import ConsumeFrom, ConsumeResult, Message, Producer, PushConsumer

    topic = "bench-embedded-push"
    batches = max(1, n // BATCH)
    # the group, its subscription and retry topic made before the clock, as the peers'
    # durable consumer and queue are: a first start writes them (fsyncs included)
    PushConsumer(
        f"{topic}-g", lambda *_: ConsumeResult.SUCCESS, {topic: "*"}, transport=transport
    ).start().shutdown()
    with Producer(transport) as producer:
        for _ in range(batches):
            producer.send_batch([Message(topic, BODY) for _ in range(BATCH)])
    if settle is not None:
        settle()
    total = batches * BATCH
    seen = [0]
    lock = threading.Lock()

    def listener(messages: Any, context: Any) -> ConsumeResult:
        with lock:
            seen[0] += len(messages)
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(
        f"{topic}-g", listener, {topic: "*"}, transport=transport, consume_from=ConsumeFrom.FIRST
    )

    def run() -> tuple[int, int]:
        consumer.start()
        last, deadline = 0, time.monotonic() + STALL_TIMEOUT_S
        while seen[0] < total:
            time.sleep(0.002)
            if seen[0] != last:
                last, deadline = seen[0], time.monotonic() + STALL_TIMEOUT_S
            elif time.monotonic() > deadline:
                raise stalled(
                    f"consumed {last} of {total} messages, then none for {STALL_TIMEOUT_S:.0f} s"
                )
        return total, total * len(BODY)

    try:
        probe = CpuProbe(None)  # the whole process: consumer and broker
        rec.add("embedded_push_consume", timed(run), "PushConsumer, no-op listener", cpu=probe)
    finally:
        consumer.shutdown()


def settled(store: Any) -> None:
    """Wait until the in-process store has dispatched everything put and pre-touched the
    commitlog ahead of its write position (a fresh store: ~64 MiB of page faults in the
    background after its first put; the server of the other cases did this before they
    ran), so that a case is not charged for the work of the one before."""
    files = store.commitlog.queue.mapped_files
    deadline = time.monotonic() + START_TIMEOUT_S
    while files and files[-1].warming and time.monotonic() < deadline:
        time.sleep(0.01)
    if not store.wait_dispatched(STALL_TIMEOUT_S):
        raise CaseFailed(f"the store did not dispatch what was sent in {STALL_TIMEOUT_S:.0f} s")


def _requests(producer: Any) -> int | None:
    """Requests the producer's send pipeline has made, where it counts them."""
    count = getattr(producer, "requests_sent", None)
    return count if isinstance(count, int) else None


def _per_request(producer: Any, before: int | None, messages: int) -> str:
    """`; N msgs/request` for the row's note: how well the pipeline batched."""
    after = _requests(producer)
    if before is None or after is None or after <= before:
        return ""
    return f"; {messages / (after - before):.1f} msgs/request"


def receive_ack(consumer: Any, n: int) -> tuple[Measured, str]:
    """receive(32) and ack each message: with `ack_async` where the consumer has it (acks
    made close together leave as one request, as RabbitMQ's and NATS's acks do not wait
    either), all acks confirmed before the clock stops; else `ack`, one call each."""
    ack_async = getattr(consumer, "ack_async", None)
    if ack_async is None:
        return (
            consumed(lambda: consumer.receive(max_messages=BATCH), consumer.ack, n),
            f"receive({BATCH}), ack each",
        )
    pending: list[Any] = []

    def run() -> tuple[int, int]:
        got = drain(
            lambda: consumer.receive(max_messages=BATCH), lambda m: pending.append(ack_async(m)), n
        )
        for future in pending:
            future.result(timeout=STALL_TIMEOUT_S)  # an ack that failed fails the case
        return got, got * len(BODY)

    return timed(run), f"receive({BATCH}), ack_async each"


def _grpc_transport(endpoint: str, wire: str = "grpc", **options: Any) -> Any:
    import reliable

    return reliable.connect("grpc", endpoint=endpoint, wire=wire, **options)


@contextmanager
def started(transport: Any) -> Iterator[Any]:
    transport.start()
    try:
        yield transport
    finally:
        transport.close()


# --- the run


def measure(
    n: peers.Counts,
    workdir: Path,
    result: SuiteResult,
    only: str | None = None,
    stub_work_us: float = 0.0,
) -> list[str]:
    """The suite's cases into `result`; returns the failures (empty when all ran).

    `only` (a regular expression) keeps the groups of cases with a name it matches (a
    group shares one server: `official_` runs the three official cases); the others stay
    null in the metrics. `stub_work_us`: the CPU the stub spends per send and ack."""
    pattern = re.compile(only) if only else None
    result.metrics["stub_work_us"] = stub_work_us

    def wanted(*names: str) -> bool:
        return pattern is None or any(pattern.search(name) for name in names)

    home = workdir / "home"
    home.mkdir(exist_ok=True)
    os.environ["HOME"] = str(home)  # the official client logs under $HOME from its import
    for key in THROUGHPUT_KEYS:
        result.metrics[f"{key}_msgs_s"] = None
    for key in LATENCY_KEYS:
        result.metrics[f"{key}_p50_ms"] = result.metrics[f"{key}_p99_ms"] = None
    for peer in peers.PEERS:
        for case in peers.CASES:
            result.metrics[f"{peer.name}_{case}_msgs_s"] = None
        for case in peers.LATENCY_CASES:
            result.metrics[f"{peer.name}_{case}_p50_ms"] = None
            result.metrics[f"{peer.name}_{case}_p99_ms"] = None
    rec = Recorder(result)

    chosen = tuple(p for p in peers.PEERS if wanted(*(f"{p.name}_{case}" for case in peers.CASES)))
    if chosen:
        peers.measure(n, workdir, result, peers=chosen)

    framework_cases = (
        "framework_send",
        "framework_send_pipelined",
        "framework_asend_pipelined",
        "framework_send_batch",
        "framework_receive_ack",
    )
    stub_official = ("stub_official_send", "stub_official_send_async", "stub_official_receive_ack")
    official_cases = ("official_send", "official_send_async", "official_receive_ack")
    if wanted(*stub_official, *official_cases):
        # the cap and our server up together, each case run against one then the other
        with rec.section(*stub_official, *official_cases), ExitStack() as servers:
            endpoints = {}
            if wanted(*stub_official):
                endpoints["stub_official"] = servers.enter_context(stub_server(home, stub_work_us))
            if wanted(*official_cases):
                endpoints["official"] = servers.enter_context(
                    broker_server(workdir / "official-store", home)
                )
            official(endpoints, n, rec)

    stub_framework = tuple(f"stub_{case}" for case in framework_cases)
    if wanted(*stub_framework):
        with (
            rec.section(*stub_framework),
            stub_server(home, stub_work_us) as endpoint,
            started(_grpc_transport(endpoint)) as t,
        ):
            framework(t, "stub_framework", "", n, rec)

    wire_cases = tuple(c.replace("framework_", "framework_wire_") for c in framework_cases)
    if wanted(*framework_cases, *wire_cases):
        with (
            rec.section(*framework_cases, *wire_cases),
            broker_server(workdir / "server-store", home) as endpoint,
        ):
            if wanted(*framework_cases):
                with rec.section(*framework_cases), started(_grpc_transport(endpoint)) as t:
                    framework(t, "framework", "", n, rec)
            if wanted(*wire_cases):
                with (
                    rec.section(*wire_cases),
                    started(_grpc_transport(endpoint, "native")) as t,
                ):
                    framework(t, "framework_wire", "", n, rec, native=True)

    sync_cases = ("framework_send_sync_flush", "framework_send_pipelined_sync_flush")
    wire_sync_cases = tuple(c.replace("framework_", "framework_wire_") for c in sync_cases)
    polled = "framework_wire_send_sync_flush_polled"
    if wanted(*sync_cases, *wire_sync_cases, polled):
        with (
            rec.section(*sync_cases, *wire_sync_cases, polled),
            broker_server(workdir / "sync-store", home, flush="sync") as endpoint,
        ):
            if wanted(*sync_cases):
                with rec.section(*sync_cases), started(_grpc_transport(endpoint)) as t:
                    framework(
                        t,
                        "framework",
                        "_sync_flush",
                        n,
                        rec,
                        asend=False,
                        batch=False,
                        receive=False,
                    )
            if wanted(*wire_sync_cases):
                with (
                    rec.section(*wire_sync_cases),
                    started(_grpc_transport(endpoint, "native")) as t,
                ):
                    framework(
                        t,
                        "framework_wire",
                        "_sync_flush",
                        n,
                        rec,
                        asend=False,
                        batch=False,
                        receive=False,
                        native=True,
                    )
            if wanted(polled):
                with (
                    rec.section(polled),
                    started(_grpc_transport(endpoint, "native", idle_poll_us=POLLED_US)) as t,
                ):
                    framework(
                        t,
                        "framework_wire",
                        "_sync_flush_polled",
                        n,
                        rec,
                        each_note=f"send, one at a time; client idle_poll_us={POLLED_US}",
                        pipelined=False,
                        asend=False,
                        batch=False,
                        receive=False,
                        native=True,
                    )

    embedded_cases = ("embedded_send", "embedded_receive_ack", "embedded_push_consume")
    if wanted(*embedded_cases):
        with rec.section(*embedded_cases):
            import reliable
            from broker.config import BrokerConfig
            from broker.store.config import StoreConfig

            embedded = reliable.connect(
                "embedded",
                store_config=StoreConfig(
                    store_dir=workdir / "embedded-store", mapped_file_size_commitlog=256 << 20
                ),
                broker_config=BrokerConfig(),
            )
            with started(embedded) as t:
                if wanted("embedded_send", "embedded_receive_ack"):
                    with rec.section("embedded_send", "embedded_receive_ack"):
                        framework(
                            t,
                            "embedded",
                            "",
                            n,
                            rec,
                            send_each=False,
                            asend=False,
                            batch=False,
                            settle=lambda: settled(t.broker.store),
                        )
                if wanted("embedded_push_consume"):
                    with rec.section("embedded_push_consume"):
                        push_consume(t, n.pipelined, rec, lambda: settled(t.broker.store))

    shares_of_cap(result.metrics)
    return rec.errors


def shares_of_cap(metrics: dict[str, Any]) -> None:
    """`<case>_pct_of_cap`: each client case against our server, as a share of the same
    case against the no-work stub (null when the stub was made to work: not the cap)."""
    stub_work_us = metrics.get("stub_work_us")
    for key in CAP_KEYS:
        ours, cap = metrics.get(f"{key}_msgs_s"), metrics.get(f"stub_{key}_msgs_s")
        metrics[f"{key}_pct_of_cap"] = (
            round(100 * float(ours) / float(cap), 1)
            if isinstance(ours, int | float)
            and isinstance(cap, int | float)
            and cap
            and not stub_work_us
            else None
        )


def median_of(passes: list[SuiteResult]) -> SuiteResult:
    """One result from several passes of the suite: each figure the median of the passes
    that measured it (so a pass disturbed by the machine moves no verdict), each row the
    pass whose rate is that median, its note saying the spread; a failure in any pass
    is a failure."""
    merged = SuiteResult()
    for name in dict.fromkeys(row.name for p in passes for row in p.rows):
        rows = sorted(
            (row for p in passes for row in p.rows if row.name == name and not row.missing),
            key=lambda row: row.msgs_s,
        )
        if not rows:
            merged.rows.append(next(r for p in passes for r in p.rows if r.name == name))
            continue
        mid = rows[(len(rows) - 1) // 2]
        spread = ", ".join(f"{row.msgs_s:,.0f}" for row in rows)
        merged.rows.append(
            Row(mid.name, mid.msgs_s, mid.mb_s, f"{mid.note}; passes: {spread}", mid.cpu_us)
        )
    for key in dict.fromkeys(k for p in passes for k in p.metrics):
        values = sorted(
            v
            for p in passes
            if isinstance(v := p.metrics.get(key), int | float) and not isinstance(v, bool)
        )
        if values:
            merged.metrics[key] = values[(len(values) - 1) // 2]
        else:
            merged.metrics[key] = next(
                (p.metrics[key] for p in passes if p.metrics.get(key) is not None), None
            )
    shares_of_cap(merged.metrics)
    for p in passes:
        merged.errors.extend(e for e in p.errors if e not in merged.errors)
    return merged


def comparison_table(metrics: dict[str, Any]) -> list[str]:
    """Each of our cases beside its peer: ratio (or % of the stub's cap) and target."""
    lines = [
        "",
        "ours beside the peers (same run, same counts, 1 KiB):",
        f"{'case':<36} {'ours msg/s':>11}  {'peer case':<32} {'peer msg/s':>11} "
        f"{'ratio':>7}  target",
        "-" * 124,
    ]

    def fmt(value: Any) -> str:
        return f"{value:,.0f}" if isinstance(value, int | float) else "-"

    stub_worked = bool(metrics.get("stub_work_us"))  # its figures are not the cap then
    for c in COMPARISONS:
        ours, peer = metrics.get(f"{c.ours}_msgs_s"), metrics.get(f"{c.peer}_msgs_s")
        ratio, verdict = "-", ""
        if isinstance(ours, int | float) and isinstance(peer, int | float) and peer:
            r = ours / peer
            ratio = f"{100 * r:.0f}%" if c.peer.startswith("stub_") else f"{r:.2f}x"
            if stub_worked and c.peer.startswith("stub_"):
                verdict = " (no verdict: the stub worked)"
            elif c.target_ratio is not None:
                p50 = metrics.get(f"{c.ours}_p50_ms")
                met = (
                    r >= c.target_ratio
                    and (c.min_msgs_s is None or ours >= c.min_msgs_s)
                    and (
                        c.max_p50_ms is None
                        or (isinstance(p50, int | float) and p50 <= c.max_p50_ms)
                    )
                )
                verdict = " (met)" if met else " (short)"
        lines.append(
            f"{c.ours:<36} {fmt(ours):>11}  {c.peer:<32} {fmt(peer):>11} "
            f"{ratio:>7}  {c.target}{verdict if c.target else ''}"
        )
    lat = [
        f"{key} p50 {metrics[f'{key}_p50_ms']:.2f} ms p99 {metrics[f'{key}_p99_ms']:.2f} ms"
        for key in (*LATENCY_KEYS, "rabbitmq_publish_each", "nats_publish_each")
        if isinstance(metrics.get(f"{key}_p50_ms"), int | float)
        and isinstance(metrics.get(f"{key}_p99_ms"), int | float)
    ]
    if lat:
        lines.append("one at a time: " + "; ".join(lat))
    return lines


def run(opts: Options) -> SuiteResult:
    workdir = opts.workdir or Path.cwd()
    n = peers.counts(opts.quick)
    loops = python_loop_s()
    fsync_ms = fdatasync_p50_ms(workdir)
    apart_ms = fdatasync_apart_p50_ms(workdir)
    progress(
        f"machine: a 10M-iteration Python loop {statistics.median(loops):.2f} s, "
        f"fdatasync p50 {fsync_ms:.3f} ms, {apart_ms:.3f} ms {APART_S * 1000:g} ms apart"
    )

    def one_pass(where: Path) -> SuiteResult:
        one = SuiteResult()
        one.errors.extend(measure(n, where, one, opts.only, opts.stub_work_us))
        return one

    passes = run_passes(opts.repeat, workdir, one_pass, loops)
    result = passes[0] if len(passes) == 1 else median_of(passes)
    result.metrics["messages_each"] = n.each
    result.metrics["messages_pipelined"] = n.pipelined
    result.metrics["passes"] = len(passes)
    loop_s, fastest, slowest = statistics.median(loops), min(loops), max(loops)
    result.metrics["machine_python_loop_s"] = round(loop_s, 3)
    result.metrics["machine_python_loop_min_s"] = round(fastest, 3)
    result.metrics["machine_python_loop_max_s"] = round(slowest, 3)
    result.metrics["machine_fdatasync_p50_ms"] = round(fsync_ms, 3)
    result.metrics["machine_fdatasync_apart_p50_ms"] = round(apart_ms, 3)
    result.notes.append(
        f"{len(BODY)} B bodies; one-at-a-time cases: {n.each} messages, "
        f"pipelined and consume cases: {n.pipelined}; server: a separate "
        "process on loopback, async flush unless the case says sync_flush"
        + (f"; each figure the median of {len(passes)} passes" if len(passes) > 1 else "")
    )
    result.notes.append(
        f"machine: a 10-million-iteration Python loop takes {loop_s:.2f} s "
        f"({fastest:.2f}-{slowest:.2f} s in {len(loops)} samples before and after the "
        f"passes), fdatasync of 1 KiB {fsync_ms:.3f} ms at p50 (figures of Python-bound "
        "cases move with the first); in a written file "
        f"{APART_S * 1000:g} ms after the last one (a lone durable send's pace) "
        f"{apart_ms:.3f} ms: the durable one-at-a-time case's floor"
    )
    if slowest >= UNSTEADY * fastest:
        result.notes.append(
            f"machine unsteady: its Python speed moved {slowest / fastest:.1f}x during the "
            "run; a Python-bound figure can move as much from one pass to the next"
        )
    if opts.stub_work_us:
        result.notes.append(
            f"the stub spent {opts.stub_work_us:g} us of CPU on each send and ack "
            "(--stub-work-us): its figures are not the no-work cap"
        )
    result.notes.extend(comparison_table(result.metrics))
    return result


if __name__ == "__main__":
    print(format_table(DESCRIPTION, run(Options(quick="--quick" in sys.argv))))
