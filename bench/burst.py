"""A burst of sends issued at once by several producers: how soon the first answer comes,
how long the slowest take, what is refused, and whether every message is stored once.

Each producer is a process of its own (as four applications would be) that issues all its
sends at once, each with a deadline (3 s, the official client's default), and resends a
send by the same message id until it is acknowledged, as the official RocketMQ client does:

- an answer `TOO_MANY_REQUESTS` (in the response's status) or a gRPC `RESOURCE_EXHAUSTED`
  is a refusal: the producer backs off (a random wait, doubling from 20 ms up to 1 s);
- anything else that is not OK (a deadline passed, a cancelled call, another status) is
  resent at once.

Run against `reliable broker start --flush sync` over gRPC (raw stubs of the protocol) and
over the native wire (the framework's `NativeStub`), and against NATS JetStream
(`js.publish` with a `Nats-Msg-Id`, its de-duplication), whose server `bench.peers` starts
when none runs. What is counted:

    burst_<target>_first_answer_ms   from the start to the first answer of any call
    burst_<target>_p99_ms            the 99th percentile of the calls' answer times
    burst_<target>_refused           calls answered with a refusal (back-pressure)
    burst_<target>_abandoned         calls that ended at their deadline or cancelled
    burst_<target>_stored_once       messages stored exactly once (must be all of them)
    burst_<target>_duplicates        messages stored more than once (must be 0)
    burst_<target>_seconds           until every message was acknowledged

`<target>` is `grpc`, `wire` or `nats`. `run_burst` is also what the end-to-end tests of
the served broker's burst use (tests/e2e/grpc/test_burst.py).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import peers
from bench._common import Options, Row, SuiteResult, progress

DESCRIPTION = "a burst of concurrent sends (first answer, p99, refusals, copies stored)"
REPO = Path(__file__).resolve().parents[1]
TARGETS = ("grpc", "wire", "nats")
OK = "OK"
REFUSALS = ("TOO_MANY_REQUESTS", "RESOURCE_EXHAUSTED")
ABANDONED = ("DEADLINE_EXCEEDED", "CANCELLED")
START_TIMEOUT_S = 60.0
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.02, 1.0


@dataclass(frozen=True)
class Plan:
    producers: int = 4
    per_producer: int = 1000
    deadline_s: float = 3.0
    budget_s: float = 45.0  # a producer gives up on what is not acknowledged by then
    body_bytes: int = 100
    topic: str = "burst"


@dataclass
class Outcome:
    """What the producers saw, all of them together."""

    calls: collections.Counter[str] = field(default_factory=collections.Counter)
    answer_s: list[float] = field(default_factory=list)  # each answered call's time
    first_answer_s: float | None = None  # from the start
    acknowledged: list[str] = field(default_factory=list)  # message ids answered OK
    unacknowledged: int = 0  # messages given up at the budget
    seconds: float = 0.0  # until the last producer was done

    @property
    def refused(self) -> int:
        return sum(self.calls[k] for k in REFUSALS)

    @property
    def abandoned(self) -> int:
        return sum(self.calls[k] for k in ABANDONED)

    def p99_ms(self) -> float | None:
        ordered = sorted(self.answer_s)
        if not ordered:
            return None
        return round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000, 1)


# --- one producer (a process of its own)


def _request(topic: str, message_id: str, body: bytes) -> Any:
    from protocol.pb import service_pb2

    request = service_pb2.SendMessageRequest()
    m = request.messages.add()
    m.topic.name = topic
    m.body = body
    sp = m.system_properties
    sp.message_id = message_id
    sp.message_type = 1  # NORMAL
    sp.body_encoding = 1  # IDENTITY
    sp.born_host = "127.0.0.1"
    sp.born_timestamp.GetCurrentTime()
    return request


def _status_name(code: int) -> str:
    from broker.server.codes import Code

    try:
        return Code(code).name
    except ValueError:
        return str(code)


async def _produce(
    target: str, address: str, wire_port: int, plan: Plan, index: int, start_at: float
) -> dict[str, Any]:
    """Every send of one producer at once, each resent until acknowledged (or the budget)."""
    import grpc

    calls: collections.Counter[str] = collections.Counter()
    answers: list[float] = []
    first: list[float] = []
    body = os.urandom(plan.body_bytes)
    metadata = (("x-mq-client-id", f"burst-{os.getpid()}-{index}"),)
    closers: list[Any] = []
    if target == "nats":
        import nats

        nc = await nats.connect(f"nats://{address}", connect_timeout=5, allow_reconnect=False)
        closers.append(nc.close)
        js = nc.jetstream()

        async def call(message_id: str, request: Any) -> str:
            try:
                await js.publish(
                    plan.topic,
                    body,
                    timeout=plan.deadline_s,
                    headers={"Nats-Msg-Id": message_id},
                )
            except nats.errors.TimeoutError:
                return "DEADLINE_EXCEEDED"
            except nats.js.errors.APIError as exc:
                return "TOO_MANY_REQUESTS" if exc.code == 503 else f"API_{exc.code}"
            return OK

    else:
        from protocol.pb import service_pb2_grpc

        channel = grpc.aio.insecure_channel(address)
        closers.append(channel.close)
        if target == "grpc":
            stub = service_pb2_grpc.MessagingServiceStub(channel)

            async def invoke(request: Any) -> Any:
                return await stub.SendMessage(request, metadata=metadata, timeout=plan.deadline_s)

        else:
            from reliable.transport._native_wire import NativeStub

            host = address.rsplit(":", 1)[0]
            native = NativeStub(None, None, host=host, ask_port=None, port=wire_port)
            closers.append(native.close)

            async def invoke(request: Any) -> Any:
                future = native.SendMessage.future(
                    request, timeout=plan.deadline_s, metadata=metadata
                )
                return await asyncio.wrap_future(future)

        async def call(message_id: str, request: Any) -> str:
            try:
                response = await invoke(request)
            except grpc.RpcError as exc:
                return str(exc.code().name)
            return OK if response.status.code == 20000 else _status_name(response.status.code)

    give_up = start_at + plan.budget_s
    delay = max(0.0, start_at - time.monotonic())
    await asyncio.sleep(delay)

    async def one() -> str | None:
        message_id = uuid.uuid4().hex.upper()
        request = None if target == "nats" else _request(plan.topic, message_id, body)
        backoff = BACKOFF_FIRST_S
        while time.monotonic() < give_up:
            began = time.monotonic()
            outcome = await call(message_id, request)
            now = time.monotonic()
            calls[outcome] += 1
            if outcome not in ABANDONED:
                answers.append(now - began)
                if not first:
                    first.append(now - start_at)
            if outcome == OK:
                return message_id
            if outcome in REFUSALS:
                await asyncio.sleep(random.uniform(backoff / 2, backoff))
                backoff = min(backoff * 2, BACKOFF_MAX_S)
        return None

    results = await asyncio.gather(*(one() for _ in range(plan.per_producer)))
    done = time.monotonic() - start_at
    for close in closers:
        closed = close()
        if asyncio.iscoroutine(closed):
            await closed
    return {
        "calls": dict(calls),
        "answers": answers,
        "first": first[0] if first else None,
        "acknowledged": [r for r in results if r is not None],
        "unacknowledged": sum(1 for r in results if r is None),
        "seconds": done,
    }


def _producer_main() -> None:
    """`python -m bench.burst '<json>'`: one producer; what it saw, as JSON on stdout."""
    args = json.loads(sys.argv[1])
    plan = Plan(**args["plan"])
    try:
        report = asyncio.run(
            _produce(
                args["target"],
                args["address"],
                args["wire_port"],
                plan,
                args["index"],
                args["start_at"],
            )
        )
    except BaseException as exc:  # reported to the parent, which fails the case
        report = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(report), flush=True)


def run_burst(target: str, address: str, plan: Plan, wire_port: int = 0) -> Outcome:
    """`plan.producers` processes, each issuing its sends at once (all starting together);
    what they saw. `target`: grpc, wire (`wire_port` needed) or nats."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, not {target!r}")
    start_at = time.monotonic() + 2.0 + 0.5 * plan.producers  # every process ready by then
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = []
    for index in range(plan.producers):
        args = {
            "target": target,
            "address": address,
            "wire_port": wire_port,
            "plan": asdict(plan),
            "index": index,
            "start_at": start_at,
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "bench.burst", json.dumps(args)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=REPO,
            )
        )
    outcome = Outcome()
    errors: list[str] = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=plan.budget_s + 60 + START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            errors.append("a producer did not report")
            continue
        lines = out.strip().splitlines()
        if proc.returncode != 0 or not lines:
            errors.append(f"a producer failed: {err[-800:]}")
            continue
        got = json.loads(lines[-1])
        if "error" in got:
            errors.append(got["error"])
            continue
        outcome.calls.update(got["calls"])
        outcome.answer_s += got["answers"]
        if got["first"] is not None:
            first = got["first"]
            if outcome.first_answer_s is None or first < outcome.first_answer_s:
                outcome.first_answer_s = first
        outcome.acknowledged += got["acknowledged"]
        outcome.unacknowledged += got["unacknowledged"]
        outcome.seconds = max(outcome.seconds, got["seconds"])
    if errors:
        raise RuntimeError("; ".join(errors))
    return outcome


# --- the served broker and NATS


_SERVING = re.compile(r"serving on ([\w.\-]+):(\d+)")
_WIRE = re.compile(r"native wire on ([\w.\-]+):(\d+)")


@dataclass
class Served:
    endpoint: str
    wire_port: int
    output: list[str]


@contextmanager
def broker(store: Path, *extra: str) -> Iterator[Served]:
    """`reliable broker start --flush sync` with its native wire, on `store`."""
    env = dict(os.environ, HOME=str(store.parent), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    argv = [sys.executable, "-m", "reliable_cli", "broker", "start", "--store", str(store)]
    argv += ["--port", "0", "--wire-port", "0", "--flush", "sync"]
    argv += ["--commitlog-file-size", str(64 << 20), "--disk-full-ratio", "1.0"]
    argv += ["--disk-clean-ratio", "1.0", *extra]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO
    )
    served = Served("", 0, [])
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            served.output.append(line)
            if m := _WIRE.search(line):
                served.wire_port = int(m.group(2))
            if m := _SERVING.search(line):
                served.endpoint = f"127.0.0.1:{m.group(2)}"
            if served.endpoint and served.wire_port:
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        if not ready.wait(START_TIMEOUT_S) or not served.wire_port:
            raise RuntimeError("the broker did not start: " + "".join(served.output)[-800:])
        yield served
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def stored_copies(store: Path, topic: str) -> collections.Counter[str]:
    """Copies of each message id in `topic`, read from a stopped broker's commitlog."""
    import struct

    from broker.store.codec import BLANK_MAGIC_CODE, decode_message

    copies: collections.Counter[str] = collections.Counter()
    for path in sorted((store / "commitlog").iterdir()):
        if not path.name.isdigit():
            continue
        buf = path.read_bytes()
        pos = 0
        while pos + 8 <= len(buf):
            total, magic = struct.unpack_from(">ii", buf, pos)
            if total <= 0 or magic == BLANK_MAGIC_CODE:
                break
            record = decode_message(buf, pos)
            if record.topic == topic:
                copies[record.msg_id] += 1
            pos += total
    return copies


async def _nats_stream(address: str, topic: str, fresh: bool) -> int:
    """Make (fresh) the stream of `topic` with a 2-minute de-duplication window, or count
    its messages and delete it."""
    import nats
    from nats.js.api import StorageType

    nc = await nats.connect(f"nats://{address}", connect_timeout=5, allow_reconnect=False)
    try:
        js = nc.jetstream()
        name = f"BURST_{topic.upper()}"
        if fresh:
            with contextlib.suppress(Exception):  # not there
                await js.delete_stream(name)
            await js.add_stream(
                name=name, subjects=[topic], storage=StorageType.FILE, duplicate_window=120.0
            )
            return 0
        info = await js.stream_info(name)
        await js.delete_stream(name)
        return int(info.state.messages)
    finally:
        await nc.close()


def _record(result: SuiteResult, target: str, outcome: Outcome, plan: Plan, copies: Any) -> None:
    total = plan.producers * plan.per_producer
    if isinstance(copies, int):  # NATS: the stream's count (de-duplicated by message id)
        once, duplicates = min(copies, total), max(0, copies - total)
    else:
        once = sum(1 for n in copies.values() if n == 1)
        duplicates = sum(1 for n in copies.values() if n > 1)
    first_ms = None if outcome.first_answer_s is None else round(outcome.first_answer_s * 1000, 1)
    prefix = f"burst_{target}"
    result.metrics.update(
        {
            f"{prefix}_first_answer_ms": first_ms,
            f"{prefix}_p99_ms": outcome.p99_ms(),
            f"{prefix}_refused": outcome.refused,
            f"{prefix}_abandoned": outcome.abandoned,
            f"{prefix}_stored_once": once,
            f"{prefix}_duplicates": duplicates,
            f"{prefix}_seconds": round(outcome.seconds, 2),
        }
    )
    rate = len(outcome.acknowledged) / outcome.seconds if outcome.seconds else 0.0
    note = (
        f"first answer {first_ms} ms, p99 {outcome.p99_ms()} ms, refused {outcome.refused}, "
        f"abandoned {outcome.abandoned}, stored once {once}/{total}, duplicates {duplicates}"
    )
    result.rows.append(Row(f"burst_{target}", rate, rate * plan.body_bytes / 1e6, note))
    if duplicates or once != total:
        result.errors.append(f"burst_{target}: {once}/{total} stored once, {duplicates} twice")


METRIC_NAMES = tuple(
    f"burst_{t}_{m}"
    for t in TARGETS
    for m in (
        "first_answer_ms",
        "p99_ms",
        "refused",
        "abandoned",
        "stored_once",
        "duplicates",
        "seconds",
    )
)


def run(opts: Options) -> SuiteResult:
    result = SuiteResult()
    result.metrics.update(dict.fromkeys(METRIC_NAMES))
    plan = Plan(per_producer=500 if opts.quick else 1000)
    result.notes.append(
        f"{plan.producers} producer processes x {plan.per_producer} sends issued at once, "
        f"{plan.deadline_s:g} s deadline, resent by message id until acknowledged "
        "(refusals backed off, the rest at once); the broker with --flush sync"
    )
    with tempfile.TemporaryDirectory(dir=opts.workdir) as tmp:
        work = Path(tmp)
        for target in ("grpc", "wire"):
            if opts.only and not re.search(opts.only, f"burst_{target}"):
                continue
            store = work / f"store-{target}"
            progress(f"burst over {target}: {plan.producers} x {plan.per_producer} sends")
            try:
                with broker(store) as served:
                    outcome = run_burst(target, served.endpoint, plan, served.wire_port)
            except Exception as exc:
                result.errors.append(f"burst_{target}: {exc}")
                continue
            _record(result, target, outcome, plan, stored_copies(store, plan.topic))
        if not opts.only or re.search(opts.only, "burst_nats"):
            progress(f"burst against NATS JetStream: {plan.producers} x {plan.per_producer}")
            try:
                with peers.running(peers.NATS, work) as how:
                    address = f"{peers.NATS.host}:{peers.NATS.port}"
                    topic = f"burst{uuid.uuid4().hex[:8]}"
                    nats_plan = Plan(per_producer=plan.per_producer, topic=topic)
                    asyncio.run(_nats_stream(address, topic, fresh=True))
                    outcome = run_burst("nats", address, nats_plan)
                    count = asyncio.run(_nats_stream(address, topic, fresh=False))
                    result.notes.append(f"NATS JetStream: {how}")
                _record(result, "nats", outcome, nats_plan, count)
            except (peers.PeerUnavailable, OSError) as exc:
                result.metrics["nats_error"] = str(exc)
                result.notes.append(f"NATS JetStream not measured: {exc}")
    return result


if __name__ == "__main__":
    _producer_main()
