"""`reliable broker start` and `reliable admin` as users run them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.e2e.grpc.server_process import REPO, ServerProcess


def cli(*args: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if home is not None:
        env["HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "reliable_cli", *args],
        env=env,
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=60,
    )


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_broker_start_help_documents_every_option() -> None:
    done = cli("broker", "start", "--help")
    assert done.returncode == 0
    for option in (
        "--store",
        "--host",
        "--port",
        "--advertise",
        "--flush",
        "--tls-cert",
        "--tls-key",
        "--credentials-file",
        "--no-auto-create-topics",
        "--no-auto-create-groups",
        "--queues",
        "--delay-levels",
        "--min-invisible-ms",
        "--long-polling-ms",
        "--min-long-polling-ms",
        "--default-invisible-ms",
        "--transaction-timeout-ms",
        "--transaction-check-interval-ms",
        "--commitlog-file-size",
        "--max-body-size",
        "--disk-clean-ratio",
        "--disk-full-ratio",
        "SIGTERM",
    ):
        assert option in done.stdout, option


def test_bad_command_lines_fail_clearly(tmp_path: Path) -> None:
    done = cli("broker", "start", "--store", str(tmp_path / "s"), "--tls-cert", "x.pem")
    assert done.returncode == 2 and "--tls-key" in done.stderr
    done = cli("broker", "start", "--store", str(tmp_path / "s"), "--disk-full-ratio", "1.5")
    assert done.returncode == 2 and "--disk-full-ratio must be in (0, 1]" in done.stderr
    done = cli("broker", "start", "--store", str(tmp_path / "s"), "--disk-clean-ratio", "0.95")
    assert done.returncode == 2, done.stderr  # above the default full ratio, 0.90
    assert "--disk-clean-ratio must not exceed --disk-full-ratio" in done.stderr
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"team/a": "secret"}))  # a credential's scope begins at "/"
    done = cli("broker", "start", "--store", str(tmp_path / "s"), "--credentials-file", str(keys))
    assert done.returncode == 2 and "may not be empty or contain '/'" in done.stderr, done.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli(
            "broker",
            "start",
            "--store",
            str(tmp_path / "s"),
            "--port",
            str(port),
            "--commitlog-file-size",
            str(8 << 20),
            home=tmp_path,
        )
    assert done.returncode == 4, done.stdout + done.stderr
    assert f"127.0.0.1:{port}" in done.stderr


def test_admin_against_running_and_stopped_broker(
    tmp_path: Path, make_server: Callable[..., ServerProcess]
) -> None:
    store = tmp_path / "admin-store"
    server = make_server(store=store)
    ep = ("--endpoint", server.endpoint)
    assert (
        cli("admin", "topic", "create", "orders", "--queues", "8", "--type", "FIFO", *ep).returncode
        == 0
    )
    assert (
        cli("admin", "group", "create", "billing", "--fifo", "--max-retries", "3", *ep).returncode
        == 0
    )
    topic = as_json(cli("admin", "topic", "show", "orders", "--json", *ep))
    assert (topic["read_queues"], topic["write_queues"], topic["type"]) == (8, 8, "FIFO")
    assert len(topic["queues"]) == 8
    group = as_json(cli("admin", "group", "show", "billing", "--topic", "orders", "--json", *ep))
    assert (group["fifo"], group["max_retries"], group["max_delivery_attempts"]) == (True, 3, 4)
    assert len(group["progress"]["queues"]) == 8
    names = [t["name"] for t in as_json(cli("admin", "topic", "list", "--json", *ep))["topics"]]
    assert "orders" in names
    bad = cli("admin", "topic", "create", "no spaces", *ep)
    assert bad.returncode == 2 and "ILLEGAL_TOPIC" in bad.stderr  # a usage error
    missing = cli("admin", "group", "show", "nobody", *ep)
    assert missing.returncode == 1 and "CONSUMER_GROUP_NOT_FOUND" in missing.stderr
    refused = cli("admin", "topic", "list", "--store", str(store))
    assert refused.returncode == 1 and "abort file" in refused.stderr  # a broker runs on it

    assert server.terminate() == 0  # SIGTERM: clean shutdown
    offline = ("--store", str(store))
    assert cli("admin", "topic", "create", "payments", "--queues", "2", *offline).returncode == 0
    names = [
        t["name"] for t in as_json(cli("admin", "topic", "list", "--json", *offline))["topics"]
    ]
    assert {"orders", "payments"} <= set(names)
    groups = as_json(cli("admin", "group", "list", "--json", *offline))["groups"]
    assert next(g for g in groups if g["name"] == "billing")["fifo"] is True

    server = make_server(store=store)
    topic = as_json(
        cli("admin", "topic", "show", "payments", "--json", "--endpoint", server.endpoint)
    )
    assert topic["read_queues"] == 2
    unreachable = cli("admin", "topic", "list", "--endpoint", "127.0.0.1:1")
    assert unreachable.returncode == 4


def test_no_auto_create_topics(make_server: Callable[..., ServerProcess]) -> None:
    import grpc

    from broker.server.codes import Code
    from protocol.pb import service_pb2, service_pb2_grpc

    server = make_server("--no-auto-create-topics")
    channel = grpc.insecure_channel(server.endpoint)
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    request = service_pb2.QueryRouteRequest()
    request.topic.name = "declared-later"
    md = [("x-mq-client-id", "cli-test")]
    try:
        assert stub.QueryRoute(request, metadata=md, timeout=5).status.code == Code.TOPIC_NOT_FOUND
        assert (
            cli(
                "admin",
                "topic",
                "create",
                "declared-later",
                "--queues",
                "3",
                "--endpoint",
                server.endpoint,
            ).returncode
            == 0
        )
        reply = stub.QueryRoute(request, metadata=md, timeout=5)
        assert reply.status.code == Code.OK
        assert sorted(q.id for q in reply.message_queues) == [0, 1, 2]
        assert {q.broker.endpoints.addresses[0].port for q in reply.message_queues} == {server.port}
    finally:
        channel.close()
