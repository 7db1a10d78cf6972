"""Peers suite: RabbitMQ and NATS JetStream on this machine, the brokers users would pick
instead, measured with the same message count and 1 KiB bodies as `bench grpc`.

Cases, each peer with its own standard Python client (one process, one connection):

- publish each: RabbitMQ `pika` with publisher confirms, one message at a time (the publish
  returns once the broker confirmed it; persistent messages are confirmed once written to
  disk); NATS `nats-py` `js.publish` awaited one at a time (acknowledged once the stream
  stored it; JetStream's file store syncs to disk every 2 minutes by default).
- publish pipelined: at most WINDOW (1000) unconfirmed messages in flight (RabbitMQ: an
  asynchronous connection publishing while confirms come back; NATS: `js.publish_async`
  with `publish_async_max_pending=1000`).
- consume + ack: RabbitMQ `basic_qos(prefetch_count=100)` and a manual `basic_ack` per
  message; NATS a durable pull subscription, `fetch(500)` and `ack()` per message.

Queues and streams are durable (a durable classic queue with persistent messages; a
JetStream stream with file storage), named per run, and deleted afterwards. A peer that is
not running is started (RabbitMQ by its service script, NATS as a subprocess with a store
in the suite's directory, stopped afterwards). A peer that cannot be reached or measured is
reported as such in its rows and in the JSON (`<peer>_error`, its figures null): the other
peer and the other suites still run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import (
    Measured,
    Options,
    Row,
    SuiteResult,
    collected,
    format_table,
    percentiles_ms,
    progress,
    timed,
)

NAME = "peers"
DESCRIPTION = "RabbitMQ and NATS JetStream: publish each, pipelined (window 1000), consume+ack"
BODY = b"x" * 1024
WINDOW = 1000
RABBITMQ_PREFETCH = 100
NATS_FETCH = 500
START_TIMEOUT_S = 60.0
CASE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Counts:
    """Messages per case: one-at-a-time cases are slow, pipelined ones fast; consume+ack
    takes `pipelined` messages from the queue holding all of them."""

    each: int
    pipelined: int


def counts(quick: bool) -> Counts:
    return Counts(each=200, pipelined=1500) if quick else Counts(each=2000, pipelined=10000)


@dataclass(frozen=True)
class Peer:
    name: str  # metric prefix: rabbitmq, nats
    title: str
    host: str
    port: int


RABBITMQ = Peer("rabbitmq", "RabbitMQ", "127.0.0.1", 5672)
NATS = Peer("nats", "NATS JetStream", "127.0.0.1", 4222)
PEERS = (RABBITMQ, NATS)
# metric names every run carries (null when the peer was not measured)
CASES = ("publish_each", "publish_pipelined", "consume_ack")
LATENCY_CASES = ("publish_each",)


class PeerUnavailable(Exception):
    """The peer is not running and could not be started, or could not be measured."""


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _wait_port(host: str, port: int, proc: subprocess.Popen[bytes] | None, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if port_open(host, port):
            return
        if proc is not None and proc.poll() is not None:
            raise PeerUnavailable(f"{what} exited with {proc.returncode} before listening")
        time.sleep(0.25)
    raise PeerUnavailable(f"{what} did not listen on {host}:{port} within {START_TIMEOUT_S:.0f} s")


def _stop(proc: subprocess.Popen[bytes], stop_command: list[str] | None = None) -> None:
    """Stop a peer started here: its own stop command first (the RabbitMQ script runs the
    node under `su`, which does not pass SIGTERM on), then its process group."""
    if proc.poll() is None and stop_command:
        subprocess.run(
            stop_command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            continue


@dataclass
class Started:
    how: str
    proc: subprocess.Popen[bytes] | None = None  # None: a service, left running
    stop_command: list[str] | None = None


@contextlib.contextmanager
def running(peer: Peer, workdir: Path) -> Iterator[str]:
    """Make sure `peer` listens; yield how it was found ("running" or "started ...").

    A peer started here as a subprocess is stopped on exit; one started through the
    machine's service script is left running, as the service it is."""
    if port_open(peer.host, peer.port):
        yield "running"
        return
    started: Started | None = None
    with open(workdir / f"{peer.name}.log", "wb") as log:
        try:
            started = (
                _start_rabbitmq(peer, workdir, log)
                if peer.name == "rabbitmq"
                else _start_nats(peer, workdir, log)
            )
            progress(f"{peer.title}: not running on {peer.host}:{peer.port}, {started.how}")
            _wait_port(peer.host, peer.port, started.proc, f"{peer.title} (log: {log.name})")
            yield started.how
        finally:
            if started is not None and started.proc is not None:
                _stop(started.proc, started.stop_command)


def _start_rabbitmq(peer: Peer, workdir: Path, log: Any) -> Started:
    script = Path("/etc/init.d/rabbitmq-server")
    if peer.port == RABBITMQ.port and script.exists():
        done = subprocess.run(
            [str(script), "start"],
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=START_TIMEOUT_S,
            check=False,
        )
        if done.returncode == 0:
            return Started("started the rabbitmq-server service")
    binary = shutil.which("rabbitmq-server")
    if binary is None:
        raise PeerUnavailable("rabbitmq-server is not installed (apt-get install rabbitmq-server)")
    env = dict(os.environ, RABBITMQ_NODE_PORT=str(peer.port))
    stop = [shutil.which("rabbitmqctl") or "rabbitmqctl", "stop"]
    if peer.port != RABBITMQ.port:  # a node of its own beside the machine's
        base = workdir / f"rabbitmq-{peer.port}"
        base.mkdir(exist_ok=True)
        (base / "rabbitmq.conf").write_text(f"listeners.tcp.local = {peer.host}:{peer.port}\n")
        (base / "enabled_plugins").write_text("[].\n")
        if os.geteuid() == 0:  # the server script runs the node as the rabbitmq user
            for path in (workdir, base, base / "rabbitmq.conf", base / "enabled_plugins"):
                shutil.chown(path, "rabbitmq", "rabbitmq")
        node = f"bench{peer.port}@localhost"
        env.update(
            RABBITMQ_NODENAME=node,
            RABBITMQ_DIST_PORT=str(peer.port + 20000 if peer.port < 45536 else peer.port - 20000),
            RABBITMQ_CONFIG_FILE=str(base / "rabbitmq.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"),
            RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
            RABBITMQ_LOG_BASE=str(base / "log"),
        )
        stop = [stop[0], "-n", node, "stop"]
    proc = subprocess.Popen(
        [binary], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    return Started("started rabbitmq-server", proc, stop)


def _start_nats(peer: Peer, workdir: Path, log: Any) -> Started:
    binary = shutil.which("nats-server")
    if binary is None:
        raise PeerUnavailable("nats-server is not installed (apt-get install nats-server)")
    store = workdir / f"nats-{peer.port}"
    store.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [binary, "-a", peer.host, "-p", str(peer.port), "-js", "-sd", str(store)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return Started("started nats-server", proc)


# --- RabbitMQ


def _rabbit_params(peer: Peer) -> Any:
    import pika

    return pika.ConnectionParameters(
        host=peer.host,
        port=peer.port,
        credentials=pika.PlainCredentials("guest", "guest"),
        connection_attempts=1,
        socket_timeout=10,
        blocked_connection_timeout=60,
    )


def _rabbit(peer: Peer, n: Counts, body: bytes) -> dict[str, Any]:
    import pika

    queue = f"reliable-bench-{os.getpid()}-{time.monotonic_ns()}"
    persistent = pika.BasicProperties(delivery_mode=2)
    out: dict[str, Any] = {}
    conn = pika.BlockingConnection(_rabbit_params(peer))
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", queue, body, persistent, mandatory=True)  # warm-up

        latencies: list[float] = []

        def publish_each() -> tuple[int, int]:
            for _ in range(n.each):
                t = time.perf_counter()
                ch.basic_publish("", queue, body, persistent, mandatory=True)
                latencies.append(time.perf_counter() - t)
            return n.each, n.each * len(body)

        out["publish_each"] = timed(publish_each)
        out["publish_each_latency"] = latencies
        out["publish_pipelined"] = _rabbit_pipelined(peer, queue, n.pipelined, body)
        ch.close()
        total = 1 + n.each + n.pipelined
        out["consume_ack"] = timed(
            lambda: _rabbit_consume(conn, queue, n.pipelined, total, len(body))
        )
    finally:
        try:
            if conn.is_open:
                conn.channel().queue_delete(queue)
        finally:
            if conn.is_open:
                conn.close()
    return out


def _rabbit_pipelined(peer: Peer, queue: str, n: int, body: bytes) -> Measured:
    """Publish `n` persistent messages with at most WINDOW unconfirmed, on pika's
    asynchronous connection (the blocking one waits for each confirm); timed from the
    first publish to the last confirm (not the connection's set-up)."""
    import pika
    from pika.spec import Basic

    persistent = pika.BasicProperties(delivery_mode=2)
    pending: deque[int] = deque()
    state: dict[str, Any] = {
        "sent": 0,
        "confirmed": 0,
        "error": None,
        "channel": None,
        "start": 0.0,
        "cpu": 0.0,
        "end": 0.0,
        "end_cpu": 0.0,
    }

    def fail(conn: Any, why: str) -> None:
        if state["error"] is None:
            state["error"] = why
        if conn.is_open:
            conn.close()
        else:
            conn.ioloop.stop()

    def publish_more() -> None:
        ch = state["channel"]
        while state["sent"] < n and len(pending) < WINDOW:
            ch.basic_publish("", queue, body, persistent)
            state["sent"] += 1
            pending.append(state["sent"])  # delivery tags count from 1 on a confirm channel

    def on_confirm(frame: Any) -> None:
        method = frame.method
        if isinstance(method, Basic.Nack):
            fail(conn, f"broker nacked delivery tag {method.delivery_tag}")
            return
        tag = method.delivery_tag
        if method.multiple:
            while pending and pending[0] <= tag:
                pending.popleft()
                state["confirmed"] += 1
        elif pending and pending[0] == tag:
            pending.popleft()
            state["confirmed"] += 1
        else:
            pending.remove(tag)
            state["confirmed"] += 1
        if state["confirmed"] >= n:
            state["end"], state["end_cpu"] = time.perf_counter(), time.thread_time()
            conn.close()
        else:
            publish_more()

    def begin(_frame: Any) -> None:
        state["start"], state["cpu"] = collected()
        publish_more()

    def on_channel(ch: Any) -> None:
        state["channel"] = ch
        ch.confirm_delivery(on_confirm, callback=begin)

    conn = pika.SelectConnection(
        _rabbit_params(peer),
        on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
        on_open_error_callback=lambda c, exc: (
            state.update(error=f"connect: {exc}"),
            c.ioloop.stop(),
        ),
        on_close_callback=lambda c, reason: c.ioloop.stop(),
    )
    conn.ioloop.call_later(CASE_TIMEOUT_S, lambda: fail(conn, "timed out"))
    conn.ioloop.start()
    if state["error"] is not None or state["confirmed"] < n:
        raise PeerUnavailable(
            f"pipelined publish: {state['error'] or 'closed early'} "
            f"({state['confirmed']}/{n} confirmed)"
        )
    return Measured(
        n, state["end"] - state["start"], n * len(body), state["end_cpu"] - state["cpu"]
    )


def _rabbit_consume(conn: Any, queue: str, n: int, available: int, size: int) -> tuple[int, int]:
    ch = conn.channel()
    ch.basic_qos(prefetch_count=RABBITMQ_PREFETCH)
    got = 0
    for method, _props, _body in ch.consume(queue, auto_ack=False, inactivity_timeout=10):
        if method is None:
            break
        ch.basic_ack(method.delivery_tag)
        got += 1
        if got >= n:
            break
    ch.cancel()
    ch.close()
    if got < min(n, available):
        raise PeerUnavailable(f"consume: {got}/{n} messages within the timeout")
    return got, got * size


# --- NATS JetStream


def _nats(peer: Peer, n: Counts, body: bytes) -> dict[str, Any]:
    return asyncio.run(_nats_async(peer, n, body))


async def _nats_async(peer: Peer, n: Counts, body: bytes) -> dict[str, Any]:
    import nats
    from nats.js.api import StorageType

    tag = f"{os.getpid()}_{time.monotonic_ns()}"
    stream, subject = f"RELIABLE_BENCH_{tag}", f"reliable.bench.{tag}"
    nc = await nats.connect(
        f"nats://{peer.host}:{peer.port}", connect_timeout=5, allow_reconnect=False
    )
    out: dict[str, Any] = {}
    try:
        js = nc.jetstream(publish_async_max_pending=WINDOW, timeout=30)
        await js.add_stream(name=stream, subjects=[subject], storage=StorageType.FILE)
        try:
            await js.publish(subject, body)  # warm-up
            latencies: list[float] = []
            start, cpu = collected()
            for _ in range(n.each):
                t = time.perf_counter()
                await js.publish(subject, body)
                latencies.append(time.perf_counter() - t)
            out["publish_each"] = _measured(n.each, start, cpu, len(body))
            out["publish_each_latency"] = latencies

            start, cpu = collected()
            futures = [await js.publish_async(subject, body) for _ in range(n.pipelined)]
            await asyncio.wait_for(js.publish_async_completed(), CASE_TIMEOUT_S)
            for f in futures:
                f.result()  # a failed publish raises here
            out["publish_pipelined"] = _measured(n.pipelined, start, cpu, len(body))

            sub = await js.pull_subscribe(subject, durable=f"bench_{tag}", stream=stream)
            start, cpu = collected()
            got = 0
            while got < n.pipelined:
                msgs = await sub.fetch(min(NATS_FETCH, n.pipelined - got), timeout=10)
                for m in msgs:
                    await m.ack()
                got += len(msgs)
            out["consume_ack"] = _measured(got, start, cpu, len(body))
            await sub.unsubscribe()
        finally:
            await js.delete_stream(stream)
    finally:
        await nc.close()
    return out


# --- measuring


def _measured(count: int, start: float, cpu: float, size: int) -> Measured:
    return Measured(count, time.perf_counter() - start, count * size, time.thread_time() - cpu)


MEASURE = {"rabbitmq": _rabbit, "nats": _nats}
NOTES = {
    "publish_each": {"rabbitmq": "confirm each, persistent", "nats": "js.publish awaited each"},
    "publish_pipelined": {
        "rabbitmq": f"confirms, {WINDOW} outstanding",
        "nats": f"publish_async, window {WINDOW}",
    },
    "consume_ack": {
        "rabbitmq": f"prefetch {RABBITMQ_PREFETCH}, basic_ack each",
        "nats": f"pull fetch {NATS_FETCH}, ack each",
    },
}


def measure(
    n: Counts,
    workdir: Path,
    result: SuiteResult,
    peers: tuple[Peer, ...] = PEERS,
    body: bytes = BODY,
) -> None:
    """Measure every peer into `result` (rows and metrics); never raises for a peer that
    cannot be measured: its rows say why and its figures are null."""
    for peer in peers:
        for case in CASES:
            result.metrics[f"{peer.name}_{case}_msgs_s"] = None
        for case in LATENCY_CASES:
            result.metrics[f"{peer.name}_{case}_p50_ms"] = None
            result.metrics[f"{peer.name}_{case}_p99_ms"] = None
        try:
            with running(peer, workdir) as how:
                progress(f"{peer.title} on {peer.host}:{peer.port} ({how})")
                figures = MEASURE[peer.name](peer, n, body)
        except Exception as exc:  # any failure of one peer: say so, go on
            why = f"{type(exc).__name__}: {exc}".strip()
            progress(f"{peer.title}: not measured ({why})")
            result.metrics[f"{peer.name}_error"] = why
            for case in CASES:
                result.rows.append(
                    Row(f"{peer.name}_{case}", 0.0, 0.0, f"not measured: {why}"[:120], missing=True)
                )
            continue
        for case in CASES:
            m: Measured = figures[case]
            key = f"{peer.name}_{case}"
            note = NOTES[case][peer.name]
            lat = figures.get(f"{case}_latency")
            if lat:
                p50, p99 = percentiles_ms(lat)
                result.metrics[f"{key}_p50_ms"] = p50
                result.metrics[f"{key}_p99_ms"] = p99
                note += f"; p50 {p50:.2f} ms, p99 {p99:.2f} ms"
            result.rows.append(Row(key, m.msgs_s, m.mb_s, note, m.cpu_us))
            result.metrics[f"{key}_msgs_s"] = round(m.msgs_s)
            progress(f"{key}: {m.msgs_s:,.0f} msg/s")


def run(opts: Options) -> SuiteResult:
    workdir = opts.workdir or Path.cwd()
    n = counts(opts.quick)
    result = SuiteResult()
    measure(n, workdir, result)
    result.metrics["peer_messages_each"] = n.each
    result.metrics["peer_messages_pipelined"] = n.pipelined
    result.notes.append(
        f"{len(BODY)} B bodies; publish each: {n.each} messages; pipelined "
        f"and consume+ack: {n.pipelined}; durable queue / file stream"
    )
    return result


if __name__ == "__main__":
    print(format_table(DESCRIPTION, run(Options(quick="--quick" in sys.argv))))
