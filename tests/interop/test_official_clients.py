"""The official Java and Go clients receive our messages and find none corrupted.

Each client's scenario program (tests/interop/java, tests/interop/go; README.md) runs once
per client against a `reliable broker start` process: it sends the crafted bodies
(tests/interop/bodies.py, CRC32 hex with one to four leading zeros) and reports, one JSON
line per scenario, what its consumers saw. The clients verify each body's digest: a body
they find corrupted never reaches a push consumer's listener, is flagged on a simple
consumer, and is sent to the dead-letter queue by a FIFO push consumer.

The first run builds the programs (Maven and Go download the clients); later runs reuse
them (tests/interop/programs.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from reliable.admin import AdminClient
from tests.e2e.grpc.server_process import ServerProcess
from tests.interop.bodies import all_bodies, leading_zero_crc
from tests.interop.programs import go_program, java_program, say

pytestmark = [pytest.mark.interop, pytest.mark.slow]

SCENARIOS = ("push", "simple", "fifo-push")
BODIES = all_bodies()
# short long polls: a push consumer's shutdown waits for its parked receive
SERVER_OPTIONS = ("--long-polling-ms", "5000", "--min-long-polling-ms", "1000")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tmp_path_factory.mktemp("store"), tmp_path_factory.mktemp("home"), *SERVER_OPTIONS
    ).start()
    yield proc
    code = proc.terminate()
    assert code == 0, "".join(proc.output)


def dead_letters(endpoint: str, group: str) -> int:
    """How many messages `%DLQ%<group>` holds (none when it was never created)."""
    admin = AdminClient(endpoint)
    try:
        topics = {t["name"] for t in admin.call("ListTopics")["topics"]}
        if f"%DLQ%{group}" not in topics:
            return 0
        queues = admin.call("GetTopic", name=f"%DLQ%{group}")["queues"]
        return sum(q["max_offset"] - q["min_offset"] for q in queues)
    finally:
        admin.close()


@pytest.fixture(scope="module", params=["java", "go"])
def outcomes(
    request: pytest.FixtureRequest, server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Every scenario's outcome line of one client's program, by scenario name, plus the
    dead letters of its FIFO group (`dlq`)."""
    client: str = request.param
    logs = tmp_path_factory.mktemp(f"{client}-logs")
    command = java_program(logs) if client == "java" else go_program()
    prefix = f"digest-{client}-{uuid.uuid4().hex[:6]}"
    fifo_group = f"{prefix}-fifo-push"
    admin = AdminClient(server.endpoint)
    try:  # the program creates nothing: a FIFO group is the operator's to make
        admin.call("CreateGroup", name=fifo_group, fifo=True, max_retries=1)
    finally:
        admin.close()
    say(f"running the {client} program's scenarios against {server.endpoint}")
    env = dict(os.environ, HOME=str(logs))
    env["rocketmq.client.logRoot"] = str(logs)  # the Go client's log directory
    done = subprocess.run(
        [*command, server.endpoint, *SCENARIOS, "--prefix", prefix, "--timeout-s", "30"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    sys.stderr.write(done.stderr)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    by_name = {line["scenario"]: line for line in lines}
    assert sorted(by_name) == sorted(SCENARIOS), done.stdout
    by_name["dlq"] = dead_letters(server.endpoint, fifo_group)
    return by_name


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_crafted_body_arrives_uncorrupted(outcomes: dict[str, Any], scenario: str) -> None:
    seen = outcomes[scenario]
    assert seen["errors"] == []
    # the program sent the same bodies as ours (the rule is written three times)
    assert seen["sent"] == len(BODIES)
    assert seen["leading_zero_crc"] == leading_zero_crc(BODIES)
    assert (seen["missing"], seen["missing_bodies"]) == (0, [])
    assert seen["received"] == len(BODIES)
    assert seen["unexpected"] == 0
    if scenario == "simple":
        assert seen["corrupted"] == 0
        assert (seen["acked"], seen["ack_errors"]) == (len(BODIES), 0)
    else:  # the listener was called for every body (never for a corrupted one)
        assert seen["listener_calls"] >= len(BODIES)
    if scenario == "fifo-push":
        assert seen["out_of_order_groups"] == 0
        assert outcomes["dlq"] == 0  # a FIFO consumer dead-letters what it finds corrupted


def test_the_programs_name_their_client(outcomes: dict[str, Any]) -> None:
    versions = {outcomes[s]["client_version"] for s in SCENARIOS}
    assert len(versions) == 1 and "unknown" not in versions
