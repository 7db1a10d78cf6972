"""gRPC suite: our RocketMQ 5 gRPC server, driven by the official client and by the
framework's `grpc` transport, beside the embedded transport as the in-process peer.

The server runs as a real subprocess (`reliable broker start`, async flush) on a loopback
port. Cases, 1 KiB bodies, one process and thread per client unless noted:

- official_send: `rocketmq.Producer.send`, one request-response per message;
- official_send_async: `send_async`, 256 in flight;
- official_receive_ack: `SimpleConsumer.receive(32)` + one `ack` per message;
- framework_send: `reliable.Producer` over the grpc transport;
- framework_send_batch: batches of 32 in one SendMessage (the protocol's repeated field);
- framework_receive_ack: `reliable.SimpleConsumer` receive(32) + ack;
- sync_flush_*: the framework cases against a server started with `--flush sync` (a send is
  acknowledged after fsync; a batch shares one group commit);
- embedded_send / embedded_receive_ack: the same framework code, in-process broker.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._common import Measured, Options, Row, SuiteResult, format_table, progress, timed

NAME = "grpc"
DESCRIPTION = "RocketMQ 5 gRPC server: official client and grpc transport vs embedded"
BODY = b"x" * 1024
WINDOW = 256
REPO = Path(__file__).resolve().parents[1]


def _start_server(store: Path, home: Path, flush: str = "async"
                  ) -> tuple[subprocess.Popen[str], str]:
    env = dict(os.environ, HOME=str(home), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "reliable.cli", "broker", "start", "--store", str(store),
         "--port", "0", "--min-long-polling-ms", "1000", "--min-invisible-ms", "1000",
         "--flush", flush],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        m = re.search(r"serving on ([\w.]+):(\d+)", line)
        if m:
            return proc, f"127.0.0.1:{m.group(2)}"
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError("the server did not start")


def _drain(receive: Callable[[], list[Any]], ack: Callable[[Any], None], n: int) -> int:
    got = 0
    deadline = time.monotonic() + 300
    while got < n and time.monotonic() < deadline:
        for m in receive():
            ack(m)
            got += 1
    return got


def _official(endpoint: str, n: int, rows: list[Row], metrics: dict[str, Any]) -> None:
    from rocketmq import (
        ClientConfiguration,
        Credentials,
        FilterExpression,
        Message,
        Producer,
        SimpleConsumer,
    )

    config = ClientConfiguration(endpoint, Credentials())
    consumer = SimpleConsumer(config, "bench-official", {"bench-official":
                                                          FilterExpression("*")},
                              await_duration=2)
    consumer.startup()
    producer = Producer(config, ["bench-official"])
    producer.startup()

    def message() -> Any:
        m = Message()
        m.topic, m.body = "bench-official", BODY
        return m

    try:
        producer.send(message())  # warm-up: route, channel, topic creation
        _drain(lambda: consumer.receive(32, 30), consumer.ack, 1)
        sync = timed(lambda: (sum(1 for _ in range(n) if producer.send(message())),
                              n * len(BODY)))
        def send_async() -> tuple[int, int]:
            # a window of WINDOW in flight: more only queues up past the client's 3 s deadline
            for start in range(0, n, WINDOW):
                futures = [producer.send_async(message())
                           for _ in range(min(WINDOW, n - start))]
                for f in futures:
                    f.result(timeout=120)
            return n, n * len(BODY)

        concurrent = timed(send_async)
        recv = timed(lambda: (_drain(lambda: consumer.receive(32, 30), consumer.ack, 2 * n),
                              2 * n * len(BODY)))
    finally:
        producer.shutdown()
        consumer.shutdown()
    _add(rows, metrics, "official_send", sync, "sync, one at a time")
    _add(rows, metrics, "official_send_async", concurrent, f"{WINDOW} in flight")
    _add(rows, metrics, "official_receive_ack", recv, "batch 32, ack each")


def _framework(transport: Any, prefix: str, n: int, rows: list[Row],
               metrics: dict[str, Any], batch: bool) -> None:
    from reliable import Message, Producer, SimpleConsumer

    topic = f"bench-{prefix}"
    with SimpleConsumer(f"{topic}-g", {topic: "*"}, transport=transport, await_duration_s=1,
                        invisible_duration_s=30) as consumer, Producer(transport) as producer:
        producer.send(Message(topic, BODY))
        _drain(lambda: consumer.receive(max_messages=32), consumer.ack, 1)
        def send_each() -> tuple[int, int]:
            for _ in range(n):
                producer.send(Message(topic, BODY))
            return n, n * len(BODY)

        sync = timed(send_each)
        total = n
        if batch:
            def send_batches() -> tuple[int, int]:
                for _ in range(n // 32):
                    producer.send_batch([Message(topic, BODY) for _ in range(32)])
                return (n // 32) * 32, (n // 32) * 32 * len(BODY)

            batched = timed(send_batches)
            total += batched.count
        recv = timed(lambda: (_drain(lambda: consumer.receive(max_messages=32), consumer.ack,
                                     total), total * len(BODY)))
    _add(rows, metrics, f"{prefix}_send", sync, "sync, one at a time")
    if batch:
        _add(rows, metrics, f"{prefix}_send_batch", batched, "32 per SendMessage")
    _add(rows, metrics, f"{prefix}_receive_ack", recv, "batch 32, ack each")


def _add(rows: list[Row], metrics: dict[str, Any], name: str, m: Measured, note: str) -> None:
    rows.append(Row(name, m.msgs_s, m.mb_s, note))
    metrics[f"{name}_msgs_s"] = round(m.msgs_s)
    progress(f"{name}: {m.msgs_s:,.0f} msg/s")


def run(opts: Options) -> SuiteResult:
    import reliable

    workdir = opts.workdir or Path.cwd()
    home = workdir / "home"
    home.mkdir(exist_ok=True)
    os.environ["HOME"] = str(home)  # the official client logs under $HOME from its import
    n = 500 if opts.quick else 3000
    result = SuiteResult()
    proc, endpoint = _start_server(workdir / "server-store", home)
    try:
        _official(endpoint, n, result.rows, result.metrics)
        t = reliable.connect("grpc", endpoint=endpoint)
        t.start()
        try:
            _framework(t, "framework", n, result.rows, result.metrics, batch=True)
        finally:
            t.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    proc, endpoint = _start_server(workdir / "sync-store", home, flush="sync")
    try:
        t = reliable.connect("grpc", endpoint=endpoint)
        t.start()
        try:
            _framework(t, "sync_flush", n, result.rows, result.metrics, batch=True)
        finally:
            t.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    from broker.config import BrokerConfig
    from broker.store.config import StoreConfig

    embedded = reliable.connect("embedded", store_config=StoreConfig(
        store_dir=workdir / "embedded-store", mapped_file_size_commitlog=256 << 20),
        broker_config=BrokerConfig())
    embedded.start()
    try:
        _framework(embedded, "embedded", n, result.rows, result.metrics, batch=False)
    finally:
        embedded.close()
    result.metrics["messages"] = n
    result.notes.append(f"{n} messages of {len(BODY)} B per case; server: a separate process "
                        "on loopback, async flush unless the case says sync_flush")
    return result


if __name__ == "__main__":
    print(format_table(DESCRIPTION, run(Options(quick="--quick" in sys.argv))))
