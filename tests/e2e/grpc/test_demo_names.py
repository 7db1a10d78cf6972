"""`reliable demo --endpoint` against a shared served broker uses a topic and a group of its
own, named per run, and says which; a user's `OrderCreated` topic and `inventory` group on
the same broker are never touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reliable import Message, Producer, SimpleConsumer, connect
from reliable_cli.demo.flow import run_names
from tests.e2e.grpc.server_process import REPO, ServerProcess, admin_json


def test_an_embedded_run_keeps_the_walk_through_names() -> None:
    assert run_names(None) == ("OrderCreated", "inventory")


def test_served_runs_get_names_of_their_own() -> None:
    (t1, g1), (t2, g2) = run_names("127.0.0.1:8081"), run_names("127.0.0.1:8081")
    assert t1.startswith("demo-OrderCreated-") and g1.startswith("demo-inventory-")
    assert t1 != t2 and g1 != g2


def _demo(endpoint: str, tmp_path: Path, n: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "reliable_cli",
            "demo",
            "--endpoint",
            endpoint,
            "--no-reconcile",
            "--orders",
            "5",
            "--fail-rate",
            "0",
            "--poison",
            "0",
            "--db",
            f"sqlite:///{tmp_path / f'shop{n}.db'}",
            "--table-prefix",
            f"names{os.getpid()}_{n}_",
            "--json",
        ],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.redis
@pytest.mark.slow
def test_the_demo_leaves_a_users_order_created_alone(server: ServerProcess, tmp_path: Path) -> None:
    transport = connect("grpc", endpoint=server.endpoint)
    transport.start()
    try:
        with SimpleConsumer(
            "inventory",
            {"OrderCreated": "*"},
            transport=transport,
            await_duration_s=1,
            invisible_duration_s=15,
        ) as user:
            user.receive(max_messages=1)  # the user's group exists before anything is sent
            with Producer(transport) as producer:
                mine = producer.send(Message("OrderCreated", b"the user's own order")).message_id
            runs = [_demo(server.endpoint, tmp_path, n) for n in (1, 2)]
            received = []
            for _ in range(5):
                for msg in user.receive(max_messages=16):
                    received.append(msg.message_id)
                    user.ack(msg)
                if received:
                    break
    finally:
        transport.close()
    summaries = []
    for done in runs:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        topic, group = summary["topic"], summary["group"]
        assert topic.startswith("demo-OrderCreated-") and group.startswith("demo-inventory-")
        assert f"demo: topic {topic}, group {group} (this run's own" in done.stderr + done.stdout
        summaries.append(summary)
    assert summaries[0]["topic"] != summaries[1]["topic"]
    assert summaries[0]["group"] != summaries[1]["group"]
    assert received == [mine]  # the user's group got the user's message, none of the demo's
    topics = json.dumps(admin_json("topic", "list", "--endpoint", server.endpoint))
    for summary in summaries:
        assert summary["topic"] in topics
