"""rocketmq suite: Apache RocketMQ 5 beside our server, in the same run, with the same clients.

Two servers are up together for each group of cases, and each client runs its cases against
one, then the other; while a case measures one server the other is stopped (SIGSTOP, until
the case is recorded: `bench.grpc.stop_the_others`), as on a quiet machine:

- `rocketmq`: Apache RocketMQ 5 (`apache_rocketmq`: a name server and the proxy in local
  mode, the broker in its JVM), its topics and groups made first (the proxy serves no
  other), the proxy's JVM given a bench-sized heap and both JIT compilers (JVM_OPTIONS);
- `ours`: `reliable broker start` (bench.grpc.broker_server: its native wire on);
- `gateway`: the same broker behind `reliable gateway start` (broker.gateway: gRPC served
  in Go, each call passed to the broker over its native wire), for every client's gRPC
  cases; its server CPU is the gateway's and the broker's together.

The first group runs both servers with asynchronous flush; the durable group runs Apache
RocketMQ with `flushDiskType=SYNC_FLUSH` beside ours with `--flush sync` (a send answered
after its fsync on both). The clients, each from one process, 1 KiB bodies:

- java_*: the official Java client (rocketmq-client-java, bench/java), a JVM per server
  driven over stdin (its start-up and JIT warm-up untimed): `send` one at a time,
  `sendAsync` with WINDOW in flight, `receive(32)` + `ackAsync` each;
- official_*: the official Python client, as bench.grpc measures it (`send`, `send_async`
  with 256 in flight, `receive(32)` + `ack` each);
- framework_*: the framework's grpc transport (`Producer.send`, `send_async` with WINDOW in
  flight, `SimpleConsumer.receive(32)` + `ack_async`);
- framework_wire_*: the same framework cases over our native wire (ours only: Apache
  RocketMQ has no such path), the reference the second target is held to.

Every figure is `<server>_<client>_<case>_msgs_s` (`rocketmq_java_send_msgs_s` beside
`ours_java_send_msgs_s`), with `_p50_ms`/`_p99_ms` for one-at-a-time cases and
`_client_cpu_us`/`_server_cpu_us`: CPU per message of the client process and of the server
process (Apache: the proxy's JVM, which holds the broker), every thread, from /proc.
The targets (printed with met/short, never asserted): our server at or ahead of Apache
RocketMQ in every case (the better of ours directly and behind the gateway: both serve at
once, and a deployment can point each client at either), and
the native wire at least 2x Apache RocketMQ's best client. `--repeat N`: N passes, every
server started afresh for each, the targets judged on each figure's median (a one-at-a-time
case's pass moves by a tenth either way); `passes` and `targets_met_each_pass` in the JSON.
"""

from __future__ import annotations

import json
import os
import queue
import statistics
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from apache_rocketmq.runtime import cache_root
from bench import grpc, peers
from bench._common import (
    Measured,
    Options,
    Row,
    SuiteResult,
    collected,
    fdatasync_p50_ms,
    format_table,
    progress,
    python_loop_s,
)
from bench._common import (
    passes as run_passes,
)
from bench.grpc import (
    BODY,
    SERVER_PIDS,
    STALL_TIMEOUT_S,
    WINDOW,
    CaseFailed,
    CpuProbe,
    Recorder,
    broker_server,
    gateway_server,
    process_cpu_s,
    server_cpu_s,
    stalled,
)

NAME = "rocketmq"
DESCRIPTION = "Apache RocketMQ 5 beside our server: official Python and Java clients, framework"
SERVERS = ("rocketmq", "ours")
# the clients' gRPC cases also run against ours behind the gateway (broker.gateway,
# docs/gateway.md): gRPC served in Go, the calls passed to the broker over its native wire
GATEWAY = "gateway"
GATEWAY_CLIENTS = ("java", "official", "framework")
# the proxy's JVM (broker inside) as its own start scripts run it, less their gigabytes:
# G1, a fixed 1 GiB heap, both JIT compilers (the test cluster's C1-only and serial
# collector are for a quick start, not for throughput), room for Netty's direct buffers
JVM_OPTIONS = (
    "-Xms1g",
    "-Xmx1g",
    "-XX:-UseSerialGC",
    "-XX:+UseG1GC",
    "-XX:TieredStopAtLevel=4",
    "-XX:MaxDirectMemorySize=512m",
)
# the Java client's JVM: the defaults (G1, both compilers), a fixed heap
CLIENT_JVM_OPTIONS = ("-Xms256m", "-Xmx512m")
# --quick checks the cases rather than measures them: every JVM (Apache RocketMQ's with the
# cluster's own small defaults, C1 only; the Java clients) starts on less CPU
QUICK_CLIENT_JVM_OPTIONS = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
QUICK_WARM = (20, 100)  # --quick: the Java clients' warm-up, one at a time and pipelined
START_TIMEOUT_S = 180.0  # a JVM's start on a loaded 2-core machine

# the cases of each client (the framework's native wire runs against ours only)
CASES = {
    "java": ("send", "send_async", "receive_ack"),
    "official": ("send", "send_async", "receive_ack"),
    "framework": ("send", "send_pipelined", "receive_ack"),
}
DURABLE_CASES = {
    "java": ("send_sync_flush", "send_async_sync_flush"),
    "framework": ("send_sync_flush", "send_pipelined_sync_flush"),
}
WIRE_CASES = (
    "framework_wire_send",
    "framework_wire_send_pipelined",
    "framework_wire_receive_ack",
    "framework_wire_send_sync_flush",
    "framework_wire_send_pipelined_sync_flush",
)
# what each case is, for the targets: one at a time, pipelined, receive + ack, durable
KINDS = {
    "one at a time": ("send",),
    "pipelined": ("send_async", "send_pipelined"),
    "receive + ack": ("receive_ack",),
    "durable, one at a time": ("send_sync_flush",),
    "durable, pipelined": ("send_async_sync_flush", "send_pipelined_sync_flush"),
}
WIRE_OF_KIND = {
    "one at a time": "framework_wire_send",
    "pipelined": "framework_wire_send_pipelined",
    "receive + ack": "framework_wire_receive_ack",
    "durable, one at a time": "framework_wire_send_sync_flush",
    "durable, pipelined": "framework_wire_send_pipelined_sync_flush",
}
ONE_AT_A_TIME = ("send", "send_sync_flush")


def client_cases() -> list[str]:
    """`<client>_<case>` of every case both servers run."""
    both = [f"{c}_{case}" for c, cases in CASES.items() for case in cases]
    return both + [f"{c}_{case}" for c, cases in DURABLE_CASES.items() for case in cases]


def metric_keys() -> list[str]:
    """Every figure the suite reports (null when not measured)."""
    keys = []
    cases = [f"{s}_{c}" for c in client_cases() for s in SERVERS]
    cases += [f"{GATEWAY}_{c}" for c in client_cases() if c.startswith(GATEWAY_CLIENTS)]
    cases += [f"ours_{c}" for c in WIRE_CASES]
    for case in cases:
        keys += [f"{case}_msgs_s", f"{case}_client_cpu_us", f"{case}_server_cpu_us"]
        if case.endswith(ONE_AT_A_TIME):
            keys += [f"{case}_p50_ms", f"{case}_p99_ms"]
    return keys


# --- the Java client's program


class JavaProbe(CpuProbe):
    """CPU per message of the Java client's process (not this one) and of its server."""

    def __init__(self, client_pid: int, server_pid: int | None) -> None:
        self.client_pid = client_pid
        super().__init__(server_pid)

    def start(self) -> JavaProbe:
        grpc.stop_the_others(self.server_pid)
        collected()
        self.client = process_cpu_s(self.client_pid)
        self.server = server_cpu_s(self.server_pid) if self.server_pid else 0.0
        return self

    def per_message(self, n: int) -> tuple[float | None, float]:
        client = (process_cpu_s(self.client_pid) - self.client) / n * 1e6
        server = None
        if self.server_pid:
            try:
                server = (server_cpu_s(self.server_pid) - self.server) / n * 1e6
            except OSError:
                server = None
        return server, client


class JavaClient:
    """The bench's Java program (bench/java) for one server's topic and group."""

    def __init__(
        self,
        jar: Path,
        endpoint: str,
        topic: str,
        logs: Path,
        jvm_options: tuple[str, ...] = CLIENT_JVM_OPTIONS,
    ) -> None:
        from bench._java import java

        logs.mkdir(parents=True, exist_ok=True)
        self._stderr: IO[bytes] = open(logs / f"{topic}.err", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                java(),
                *jvm_options,
                f"-Drocketmq.log.root={logs}",
                "-jar",
                str(jar),
                endpoint,
                topic,
                f"{topic}-g",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self.logs = logs / f"{topic}.err"
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, name=f"java-{topic}", daemon=True).start()
        ready = self._answer(START_TIMEOUT_S)
        if not ready.get("ready"):
            raise CaseFailed(f"the Java client did not start: {ready}")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _answer(self, timeout_s: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise stalled(
                f"the Java client answered nothing in {timeout_s:.0f} s", self.proc.pid
            ) from None
        if line is None:
            tail = self.logs.read_text(errors="replace")[-600:]
            raise CaseFailed(f"the Java client exited ({self.proc.wait()}): {tail}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise CaseFailed(f"Java client: {answer['error']}")
        return answer

    def call(self, command: str, timeout_s: float = 4 * STALL_TIMEOUT_S) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._answer(timeout_s)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(20)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)
        self._stderr.close()


@dataclass
class Server:
    """One server of a group: its name (`rocketmq`, `ours`) and endpoint."""

    name: str
    endpoint: str

    @property
    def pid(self) -> int | None:
        return SERVER_PIDS.get(self.endpoint)


def java_cases(
    servers: list[Server],
    suffix: str,
    n: peers.Counts,
    rec: Recorder,
    logs: Path,
    *,
    receive: bool = True,
    warm: tuple[int, int],
    quick: bool = False,
) -> None:
    """The Java client's cases, each against one server then the other, after each
    client's untimed warm-up of `warm` messages (one at a time, pipelined); `quick`: the
    clients' JVMs sized for checking the cases, not for measuring them."""
    from bench._java import bench_jar

    jar = bench_jar()
    jvm = QUICK_CLIENT_JVM_OPTIONS if quick else CLIENT_JVM_OPTIONS
    with ExitStack() as stack:
        clients: list[tuple[Server, JavaClient]] = []
        for server in servers:
            topic = f"bench-{server.name}-java{suffix}".replace("_", "-")
            client = JavaClient(jar, server.endpoint, topic, logs, jvm)
            stack.callback(client.close)
            clients.append((server, client))
        for server, client in clients:
            progress(f"java client: warming up against {server.name}")
            client.call(f"warm {warm[0]} {warm[1]}")

        def case(name: str, command: str, note: str, count: int) -> None:
            for server, client in clients:
                probe = JavaProbe(client.proc.pid, server.pid)
                answer = client.call(command)
                measured = Measured(
                    int(answer["count"]),
                    float(answer["seconds"]),
                    int(answer["count"]) * len(BODY),
                    float(answer["thread_cpu_s"]),
                )
                if measured.count < count:  # a receive's last batch may overshoot
                    raise CaseFailed(f"{name}: {measured.count} of {count} messages")
                latencies = [us / 1e6 for us in answer.get("latencies_us", [])]
                rec.add(f"{server.name}_java_{name}", measured, note, latencies or None, probe)

        case(f"send{suffix}", f"send {n.each}", "send, one at a time", n.each)
        case(
            f"send_async{suffix}",
            f"send_async {n.pipelined} {WINDOW}",
            f"sendAsync, {WINDOW} in flight",
            n.pipelined,
        )
        if receive:
            case(
                "receive_ack",
                f"receive_ack {n.pipelined}",
                "receive(32), ackAsync each",
                n.pipelined,
            )


def framework_cases(
    servers: list[Server], suffix: str, n: peers.Counts, rec: Recorder, *, receive: bool = True
) -> None:
    """The framework's grpc transport against each server, then its native wire on ours."""
    for server in servers:
        with grpc.started(grpc._grpc_transport(server.endpoint)) as t:
            grpc.framework(
                t,
                f"{server.name}_framework",
                suffix,
                n,
                rec,
                asend=False,
                batch=False,
                receive=receive,
            )
    ours = next((s for s in servers if s.name == "ours"), None)
    if ours is not None:
        with grpc.started(grpc._grpc_transport(ours.endpoint, "native")) as t:
            grpc.framework(
                t,
                "ours_framework_wire",
                suffix,
                n,
                rec,
                asend=False,
                batch=False,
                receive=receive,
                native=True,
            )


# --- the servers


@contextmanager
def apache(directory: Path, *, sync_flush: bool, quick: bool = False) -> Iterator[Any]:
    """Apache RocketMQ for a group of cases, its topics and groups made, its proxy's pid
    known to the CPU probes (the broker runs in the proxy's JVM); `quick`: with the
    cluster's own small JVM options instead of the bench's (JVM_OPTIONS)."""
    from apache_rocketmq import running_cluster

    progress(f"starting Apache RocketMQ ({'SYNC_FLUSH' if sync_flush else 'ASYNC_FLUSH'})")
    jvm = () if quick else JVM_OPTIONS
    with running_cluster(directory, sync_flush=sync_flush, jvm_options=jvm) as cluster:
        SERVER_PIDS[cluster.endpoint] = cluster.pids["proxy"]
        suffix = "-sync-flush" if sync_flush else ""
        for client in ("java", "official", "framework"):
            topic = f"bench-rocketmq-{client}{suffix}"
            cluster.create_topic(topic)
            cluster.create_group(f"{topic}-g")
        yield cluster


def group(
    workdir: Path,
    home: Path,
    result: SuiteResult,
    rec: Recorder,
    n: peers.Counts,
    *,
    sync_flush: bool,
    started: Future[Any] | None = None,
    warm: tuple[int, int],
    quick: bool = False,
) -> None:
    """One group of cases: Apache RocketMQ and our server up together. `started`: the
    group's Apache RocketMQ, being started already (`run`, --quick); `warm`: the Java
    clients' warm-up (`java_cases`); `quick`: every JVM sized for a check, not a
    measurement."""
    suffix = "_sync_flush" if sync_flush else ""
    names = [
        k.removesuffix("_msgs_s")
        for k in metric_keys()
        if k.endswith("_msgs_s") and ("sync_flush" in k) == sync_flush
    ]
    where = workdir / ("durable" if sync_flush else "async")
    where.mkdir(exist_ok=True)
    with ExitStack() as stack:
        servers: list[Server] = []
        try:
            cluster = (
                started.result()
                if started is not None
                else stack.enter_context(
                    apache(where / "apache", sync_flush=sync_flush, quick=quick)
                )
            )
            servers.append(Server("rocketmq", cluster.endpoint))
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}".strip()[:300]
            progress(f"Apache RocketMQ not measured: {why}")
            result.metrics["rocketmq_error"] = why
            for name in names:
                if name.startswith("rocketmq_"):
                    result.rows.append(
                        Row(name, 0.0, 0.0, f"not measured: {why}"[:120], missing=True)
                    )
        with rec.section(*names):
            endpoint = stack.enter_context(
                broker_server(where / "ours-store", home, "sync" if sync_flush else "async")
            )
            servers.append(Server("ours", endpoint))
            # each case measures one server, the others stopped (`grpc.stop_the_others`)
            grpc.SIDE_BY_SIDE.clear()
            grpc.SIDE_BY_SIDE[SERVER_PIDS[endpoint]] = (SERVER_PIDS[endpoint],)
            try:
                front = stack.enter_context(gateway_server(endpoint, home))
            except CaseFailed as exc:
                why = str(exc).strip()[:300]
                progress(f"the gateway not measured: {why}")
                result.metrics["gateway_error"] = why
            else:
                gateway_pid = SERVER_PIDS[front]
                grpc.COMPANIONS[gateway_pid] = (SERVER_PIDS[endpoint],)
                stack.callback(grpc.COMPANIONS.pop, gateway_pid, None)
                grpc.SIDE_BY_SIDE[gateway_pid] = (gateway_pid,)
                servers.append(Server(GATEWAY, front))
            if servers[0].name == "rocketmq":
                grpc.SIDE_BY_SIDE[cluster.pids["proxy"]] = tuple(cluster.pids.values())
            stack.callback(grpc.SIDE_BY_SIDE.clear)
            stack.callback(grpc.continue_all)  # before any server is stopped for good
            with rec.section(*(n for n in names if "_java_" in n)):
                java_cases(
                    servers,
                    suffix,
                    n,
                    rec,
                    where / "java-logs",
                    receive=not sync_flush,
                    warm=warm,
                    quick=quick,
                )
            if not sync_flush:
                with rec.section(*(n for n in names if "_official_" in n)):
                    endpoints = {f"{s.name}_official": s.endpoint for s in servers}
                    # a deadline of 3 s (request) + 3 s (polling): the proxy polls at least 5 s
                    grpc.official(endpoints, n, rec, await_duration_s=3)
            with rec.section(*(n for n in names if "_framework_" in n)):
                framework_cases(servers, suffix, n, rec, receive=not sync_flush)


# --- the targets


def targets(metrics: dict[str, Any]) -> tuple[list[str], int, int]:
    """The comparison table, and how many targets were met and short."""
    met = short = 0

    def rate(key: str) -> float | None:
        value = metrics.get(f"{key}_msgs_s")
        return float(value) if isinstance(value, int | float) else None

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f}"

    def verdict(ours: float | None, theirs: float | None, at_least: float) -> tuple[str, str]:
        nonlocal met, short
        if ours is None or not theirs:
            return "-", ""
        ratio = ours / theirs
        if ratio >= at_least:
            met += 1
            return f"{ratio:.2f}x", "met"
        short += 1
        return f"{ratio:.2f}x", "short"

    lines = [
        "",
        "our server beside Apache RocketMQ 5 (same run, same clients, 1 KiB); each client's",
        "cases against ours directly and behind the gateway, the better one judged:",
        f"{'case':<32} {'Apache msg/s':>12} {'ours msg/s':>12} {'gateway':>9} {'ratio':>7}  "
        f"{'CPU us/msg client, server: Apache | ours | gateway':<52} target",
        "-" * 138,
    ]

    def cpu(key: str) -> str:
        c, s = metrics.get(f"{key}_client_cpu_us"), metrics.get(f"{key}_server_cpu_us")
        return ", ".join(f"{v:.0f}" if isinstance(v, int | float) else "-" for v in (c, s))

    for case in client_cases():
        direct, front = rate(f"ours_{case}"), rate(f"{GATEWAY}_{case}")
        best = max((v for v in (direct, front) if v is not None), default=None)
        ratio, v = verdict(best, rate(f"rocketmq_{case}"), 1.0)
        which = " (gateway)" if v and front is not None and best == front else ""
        cpus = f"{cpu(f'rocketmq_{case}')} | {cpu(f'ours_{case}')}"
        if case.startswith(GATEWAY_CLIENTS):
            cpus += f" | {cpu(f'{GATEWAY}_{case}')}"
        lines.append(
            f"{case:<32} {fmt(rate(f'rocketmq_{case}')):>12} {fmt(direct):>12} {fmt(front):>9} "
            f"{ratio:>7}  {cpus:<52} >= 1x{f' ({v}{which})' if v else ''}"
        )
    lines += [
        "",
        "the framework's native wire beside Apache RocketMQ's best client path:",
        f"{'case':<24} {'Apache best':<34} {'msg/s':>10} {'wire msg/s':>12} {'ratio':>7}  target",
        "-" * 100,
    ]
    for kind, cases in KINDS.items():
        candidates = [
            (value, f"{client}_{case}")
            for client in CASES
            for case in cases
            if (value := rate(f"rocketmq_{client}_{case}")) is not None
        ]
        best, best_name = max(candidates) if candidates else (None, "-")
        wire = rate(f"ours_{WIRE_OF_KIND[kind]}")
        ratio, v = verdict(wire, best, 2.0)
        lines.append(
            f"{kind:<24} {best_name:<34} {fmt(best):>10} {fmt(wire):>12} {ratio:>7}  "
            f">= 2x{f' ({v})' if v else ''}"
        )
    return lines, met, short


def one_pass(opts: Options, workdir: Path, home: Path, n: peers.Counts) -> SuiteResult:
    """Every group's cases once, on servers started for this pass (their stores under
    `workdir`); the figures, not the targets."""
    result = SuiteResult()
    for key in metric_keys():
        result.metrics[key] = None
    rec = Recorder(result)
    with ExitStack() as early:
        durable: Future[Any] | None = None
        if opts.quick:
            # a quick run checks the cases rather than measures them: the durable group's
            # Apache RocketMQ starts (a JVM, ~15 s) while the first group runs
            pool = ThreadPoolExecutor(1, thread_name_prefix="apache-start")
            early.callback(pool.shutdown)
            (workdir / "durable").mkdir(exist_ok=True)
            durable = pool.submit(
                early.enter_context,
                apache(workdir / "durable" / "apache", sync_flush=True, quick=True),
            )
        # a quick run checks the cases: a short warm-up touches every path without
        # doubling the Java clients' work (their JIT figures are not read there)
        warm = QUICK_WARM if opts.quick else (n.each, n.pipelined)
        for sync_flush, started in ((False, None), (True, durable)):
            group(
                workdir,
                home,
                result,
                rec,
                n,
                sync_flush=sync_flush,
                started=started,
                warm=warm,
                quick=opts.quick,
            )
    result.errors.extend(rec.errors)
    return result


def run(opts: Options) -> SuiteResult:
    workdir = opts.workdir or Path.cwd()
    n = peers.counts(opts.quick)
    loops = python_loop_s()
    fsync_ms = fdatasync_p50_ms(workdir)
    progress(
        f"machine: a 10M-iteration Python loop {statistics.median(loops):.2f} s, "
        f"fdatasync p50 {fsync_ms:.3f} ms"
    )
    home = workdir / "home"
    home.mkdir(exist_ok=True)
    # the caches (Apache RocketMQ's jars, the Java program) stay where they are; the
    # official Python client logs under $HOME from its import
    os.environ.setdefault("RELIABLE_CACHE_DIR", str(cache_root()))
    os.environ["HOME"] = str(home)
    passes = run_passes(opts.repeat, workdir, lambda where: one_pass(opts, where, home, n), loops)
    # several passes: each figure the median of the passes, Apache RocketMQ's as ours
    # (a case's round trips move by a tenth from one pass to the next on either side)
    result = passes[0] if len(passes) == 1 else grpc.median_of(passes)
    lines, met, short = targets(result.metrics)
    result.metrics.update(
        messages_each=n.each,
        messages_pipelined=n.pipelined,
        passes=len(passes),
        targets_met=met,
        targets_short=short,
        machine_python_loop_s=round(statistics.median(loops), 3),
        machine_fdatasync_p50_ms=round(fsync_ms, 3),
    )
    if len(passes) > 1:
        result.metrics["targets_met_each_pass"] = [targets(p.metrics)[1] for p in passes]
    result.notes.append(
        f"{len(BODY)} B bodies; one-at-a-time cases: {n.each} messages, pipelined and "
        f"consume cases: {n.pipelined}; each server a separate process on loopback; "
        "sync_flush: Apache flushDiskType=SYNC_FLUSH, ours --flush sync; server CPU of "
        "Apache: the proxy's JVM (broker inside; the name server is idle and not counted)"
        + (
            f"; each figure the median of {len(passes)} passes (servers started afresh "
            "for each), targets met in each pass: "
            + ", ".join(str(m) for m in result.metrics["targets_met_each_pass"])
            if len(passes) > 1
            else ""
        )
    )
    result.notes.append(
        f"machine: a 10-million-iteration Python loop takes {statistics.median(loops):.2f} s "
        f"({min(loops):.2f}-{max(loops):.2f}), fdatasync of 1 KiB {fsync_ms:.3f} ms at p50"
    )
    result.notes.extend(lines)
    return result


if __name__ == "__main__":
    print(format_table(DESCRIPTION, run(Options(quick="--quick" in sys.argv))))
