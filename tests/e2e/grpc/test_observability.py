"""Metrics, health and logs of real processes: `reliable broker start --metrics-port` and
`reliable consume --metrics-port --log-format json`, scraped after a known workload."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

import reliable
from reliable import Message, Producer, SimpleConsumer
from tests.e2e.grpc.scrape import metrics_url, probe, scrape, wait_for
from tests.e2e.grpc.server_process import REPO, TEST_STORE, ServerProcess

SENT, ACKED = 20, 7


def _health(endpoint: str, service: str = "") -> int:
    with grpc.insecure_channel(endpoint) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
    return int(reply.status)


def test_broker_metrics_count_a_known_workload(make_server: Callable[..., ServerProcess]) -> None:
    server = make_server("--flush", "sync", "--metrics-port", "0")
    url = metrics_url(server.output)
    topic, group = "obs-broker", "obs-broker-g"
    transport = reliable.connect("grpc", endpoint=server.endpoint)
    transport.start()
    try:
        with Producer(transport) as producer:
            for i in range(SENT):
                producer.send(Message(topic=topic, body=f"m{i}".encode()))
        received: list[reliable.ReceivedMessage] = []
        with SimpleConsumer(
            group, {topic: "*"}, transport=transport, await_duration_s=1, invisible_duration_s=120
        ) as consumer:
            wait_for(
                lambda: (
                    bool(received.extend(consumer.receive(max_messages=32)))
                    or len(received) >= SENT
                ),
                30,
                "every message received",
            )
            assert len(received) == SENT
            for m in received[:ACKED]:
                consumer.ack(m)
            s = scrape(url)
    finally:
        transport.close()
    assert s.value("reliable_broker_messages_put_total", topic=topic) == SENT
    assert s.value("reliable_broker_messages_delivered_total", group=group, topic=topic) == SENT
    assert s.value("reliable_broker_messages_acked_total", group=group, topic=topic) == ACKED
    assert s.value("reliable_broker_in_flight_messages", group=group, topic=topic) == SENT - ACKED
    # the unacked messages hold each queue's offset: at least they are still lag
    assert (
        s.value("reliable_broker_consumer_lag_messages", group=group, topic=topic) >= SENT - ACKED
    )
    # one SendMessage request per send; every message reached the disk through a fsync
    assert s.value("reliable_broker_send_duration_seconds_count") == SENT
    assert s.value("reliable_broker_fsync_duration_seconds_count") >= 1
    assert s.value("reliable_broker_fsync_messages_sum") >= SENT
    assert s.value("reliable_broker_retry_depth_messages", group=group) == 0
    assert s.value("reliable_broker_dlq_depth_messages", group=group) == 0
    assert s.value("reliable_broker_disk_watermark_ratio", watermark="refuse") == 1.0
    assert s.value("reliable_broker_disk_full") == 0
    assert 0 < s.value("reliable_broker_disk_used_ratio") <= 1
    assert s.value("reliable_broker_commitlog_bytes") > 0
    assert s.value("reliable_broker_up") == 1
    assert s.has("process_resident_memory_bytes")

    assert probe(url, "/healthz") == (200, {"status": "alive"})
    code, body = probe(url, "/readyz")
    assert code == 200 and body["status"] == "ready", body
    assert body["checks"] == {"serving": {"ok": True}, "store_writable": {"ok": True}}
    serving = health_pb2.HealthCheckResponse.SERVING
    assert _health(server.endpoint) == serving
    assert _health(server.endpoint, "apache.rocketmq.v2.MessagingService") == serving
    assert probe(url, "/nothing")[0] == 404
    assert server.terminate() == 0


def test_broker_health_says_not_serving_when_its_disk_is_full(
    make_server: Callable[..., ServerProcess],
) -> None:
    # a refuse watermark below what the shared disk already uses: the store refuses puts
    server = make_server(
        "--disk-clean-ratio", "0.0001", "--disk-full-ratio", "0.0001", "--metrics-port", "0"
    )
    url = metrics_url(server.output)
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    wait_for(lambda: _health(server.endpoint) == not_serving, 10, "NOT_SERVING")
    code, body = probe(url, "/readyz")
    assert code == 503 and body["checks"]["store_writable"] == {"ok": False}, body
    assert scrape(url).value("reliable_broker_disk_full") == 1
    assert probe(url, "/healthz")[0] == 200  # alive, only not ready


def _consume(home: Path, *where: str) -> tuple[subprocess.Popen[str], list[str], list[str]]:
    env = dict(
        os.environ,
        HOME=str(home),
        PYTHONUNBUFFERED="1",
        PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reliable_cli",
            "consume",
            "tests.e2e.obs_handlers",
            *where,
            "--metrics-port",
            "0",
            "--log-format",
            "json",
        ],
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out: list[str] = []
    err: list[str] = []
    for stream, sink in ((proc.stdout, out), (proc.stderr, err)):

        def pump(stream=stream, sink=sink) -> None:  # type: ignore[no-untyped-def]
            for line in stream:
                sink.append(line)

        threading.Thread(target=pump, daemon=True).start()
    return proc, out, err


def test_consume_metrics_count_outcomes_and_readyz_follows_the_broker(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = make_server("--metrics-port", "0")
    broker_url = metrics_url(server.output)
    ok, retry, dead, discard = 5, 3, 2, 1
    with Producer("grpc", endpoint=server.endpoint) as producer:
        for kind, n in (("ok", ok), ("retry", retry), ("dead", dead), ("discard", discard)):
            for i in range(n):
                producer.send(Message(topic="obs-consume", body=f"{kind}-{i}".encode()))
    proc, out, err = _consume(tmp_path, "--endpoint", server.endpoint)
    try:
        url = metrics_url(out)
        group = "obs-consume-g"

        def outcome(name: str) -> float:
            return scrape(url).value("reliable_handler_messages_total", group=group, outcome=name)

        # every message settles: the retried ones succeed at their second attempt
        wait_for(lambda: outcome("success") == ok + retry, 60, "every success")
        s = scrape(url)
        assert {name: outcome(name) for name in ("success", "retry", "dead_letter", "discard")} == {
            "success": ok + retry,
            "retry": retry,
            "dead_letter": dead,
            "discard": discard,
        }
        assert (
            s.value("reliable_handler_duration_seconds_count", group=group)
            == ok + 2 * retry + dead + discard
        )
        assert s.value("reliable_guard_events_total", event="processed") == 0
        wait_for(
            lambda: (
                scrape(broker_url).value("reliable_broker_dlq_depth_messages", group=group) == dead
            ),
            10,
            "the DLQ depth",
        )
        code, body = probe(url, "/readyz")
        assert code == 200, body
        assert body["checks"] == {"consuming": {"ok": True}, "broker": {"ok": True}}

        # the broker stops for real: the consumer is alive but not ready
        assert server.terminate() == 0
        wait_for(lambda: probe(url, "/readyz")[0] == 503, 15, "readyz 503")
        assert probe(url, "/readyz")[1]["checks"]["broker"] == {"ok": False}
        assert probe(url, "/healthz")[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    # --log-format json: every stderr line is one JSON object; the expected retries are one
    # line each at WARNING without a traceback
    records = [json.loads(line) for line in err if line.strip()]
    assert records, "".join(err)
    for r in records:
        assert {"time", "level", "logger", "message"} <= set(r), r
    retries = [r for r in records if "will retry" in r["message"]]
    assert len(retries) == retry, records
    assert all(r["level"] == "WARNING" and "exception" not in r for r in retries), retries
    assert all("ConnectionError" in r["message"] for r in retries)


def test_embedded_consume_exports_its_broker_too(tmp_path: Path) -> None:
    store = tmp_path / "store"
    proc, out, err = _consume(tmp_path, "--store", str(store), *TEST_STORE)
    try:
        url = metrics_url(out)
        wait_for(lambda: any("consuming" in line for line in out), 30, "consuming")
        code, body = probe(url, "/readyz")
        assert code == 200, body
        assert body["checks"] == {"consuming": {"ok": True}, "broker": {"ok": True}}
        s = scrape(url)
        assert s.value("reliable_broker_up") == 1
        assert s.has("reliable_broker_consumer_lag_messages")
        assert s.value("reliable_guard_events_total", event="processed") == 0
        assert not s.has("reliable_broker_send_duration_seconds_count")  # no server here
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, "".join(err)


def test_json_logs_stay_json_while_waiting_for_a_broker(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc, out, err = _consume(tmp_path, "--endpoint", f"127.0.0.1:{port}")
    try:
        url = metrics_url(out)
        wait_for(lambda: sum("waiting for" in line for line in err) >= 2, 20, "two waits")
        code, body = probe(url, "/readyz")
        assert code == 503 and body["checks"]["consuming"] == {"ok": False}, body
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    records = [json.loads(line) for line in err if line.strip()]
    waits = [r for r in records if "waiting for" in r["message"]]
    assert len(waits) >= 2 and all(
        r["level"] == "WARNING" and r["logger"] == "reliable.consume" for r in waits
    )
