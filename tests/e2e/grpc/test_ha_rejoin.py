"""A running slave whose master is replaced by one with a shorter log rejoins without a
restart (docs/ha.md, "Rejoining"): real broker processes on loopback."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from protocol.ports import free_port
from tests.e2e.grpc import official
from tests.e2e.grpc.server_process import ServerProcess
from tests.e2e.grpc.test_ha import _digest, _ha_status, _promote

TOPIC = "t-ha-rejoin"


def _send(endpoint: str, first: int, count: int) -> dict[str, bytes]:
    """Send `count` messages; their ids and bodies."""
    producer = official.producer(endpoint, [TOPIC])
    try:
        sent = {}
        for i in range(first, first + count):
            body = f"r{i:04d}-".encode() * 40
            sent[producer.send(official.message(TOPIC, body)).message_id] = body
        return sent
    finally:
        producer.shutdown()


def test_a_running_slave_refused_by_its_new_master_rejoins_without_a_restart(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """An async-master with two slaves, A and B; B stops after 40 messages, A gets 20
    more; the master dies and B, behind, is promoted (--force) on the master's HA port.
    A, running all along, is refused by it (its log holds 20 messages B never had):
    it saves them in `truncated-*.bin`, cuts its running store back, and replicates B's
    log byte for byte, its process the same; promoted in turn, it delivers every
    message of the group's log exactly once and none of the cut ones."""
    m_ha = free_port()
    master = make_server("--role", "async-master", "--ha-port", str(m_ha), store=tmp_path / "m")

    def slave(name: str, broker_id: int, master_ha: int, ha_port: int) -> ServerProcess:
        return make_server(
            "--role",
            "slave",
            "--broker-id",
            str(broker_id),
            "--master",
            f"127.0.0.1:{master_ha}",
            "--ha-port",
            str(ha_port),
            store=tmp_path / name,
        )

    a = slave("a", 1, m_ha, free_port())
    b = slave("b", 2, m_ha, free_port())
    shared = _send(master.endpoint, 0, 40)
    for s in (a, b):
        assert official.wait_for(lambda s=s: _ha_status(s.endpoint)["lag_bytes"] == 0, 60)
    branch = _ha_status(b.endpoint)["max_offset"]
    assert b.terminate() == 0
    cut = _send(master.endpoint, 40, 20)  # A has them, B never will
    assert official.wait_for(lambda: _ha_status(a.endpoint)["lag_bytes"] == 0, 60)
    a_end = _ha_status(a.endpoint)["max_offset"]
    a_pid = a.proc.pid if a.proc else None
    master.kill()
    # B again, on the master's HA port, its master gone: promoted with what it has
    b = slave("b", 2, free_port(), m_ha)
    done = _promote(b.endpoint, "--force")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["epoch"] == [2, branch]
    # A finds its new master there and rejoins by itself
    assert official.wait_for(lambda: "rejoined" in _ha_status(a.endpoint), 60), "".join(a.output)
    status = _ha_status(a.endpoint)
    assert status["rejoined"]["offset"] == branch and status["rejoined"]["end"] == a_end
    assert status["rejoined"]["messages"] == 20
    assert a.alive() and a.proc is not None and a.proc.pid == a_pid  # no restart
    assert f"rejoined as a slave, running: cut {a_end - branch} bytes (20 messages)" in "".join(
        a.output
    )
    tail = (tmp_path / "a" / "ha" / f"truncated-{branch}.bin").read_bytes()
    assert len(tail) == a_end - branch
    assert all(body in tail for body in cut.values())
    after = _send(b.endpoint, 100, 30)
    assert official.wait_for(lambda: _digest(tmp_path / "a") == _digest(tmp_path / "b"), 60)
    assert _ha_status(a.endpoint)["epochs"] == [[1, 0], [2, branch]]
    # A, promoted once B is gone, delivers the group's log: each message once
    assert b.terminate() == 0
    assert official.wait_for(lambda: not _ha_status(a.endpoint)["connected"], 30)
    done = _promote(a.endpoint)
    assert done.returncode == 0, done.stderr
    expected = {**shared, **after}
    consumer = official.simple_consumer(a.endpoint, "g-ha-rejoin", TOPIC)
    try:
        got = official.receive_until(
            consumer, lambda g: set(expected) <= {m.message_id for m in g}, timeout_s=60
        )
        deadline = time.monotonic() + 3  # anything more would be a duplicate or a cut one
        while time.monotonic() < deadline:
            more = consumer.receive(32, 15)
            for m in more:
                consumer.ack(m)
            got += more
    finally:
        consumer.shutdown()
    counts = Counter(m.message_id for m in got)
    assert set(counts) == set(expected), set(counts) ^ set(expected)
    assert max(counts.values()) == 1
    assert not any(m.body in cut.values() for m in got)
    assert a.terminate() == 0, "".join(a.output)
