"""Master/slave replication with real broker processes on loopback (docs/ha.md)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from protocol.ports import free_port
from tests.e2e.grpc import official
from tests.e2e.grpc.server_process import ServerProcess


def _digest(store: Path) -> list[tuple[str, str]]:
    """Every commitlog file that holds a record, by name and SHA-256. The files are
    preallocated with zeros, so equal digests mean the same records at the same offsets
    and nothing beyond. A file of zeros only is left out: the master's next file,
    allocated ahead once the one being written is half full; a slave creates each file
    as its first record arrives (docs/ha.md)."""
    out = []
    for p in sorted((store / "commitlog").iterdir()):
        if p.name.isdigit():
            data = p.read_bytes()
            if data.count(0) != len(data):
                out.append((p.name, hashlib.sha256(data).hexdigest()))
    return out


def _ha_status(endpoint: str) -> dict[str, Any]:
    """`reliable admin broker status --json` of a running broker."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "reliable_cli",
            "admin",
            "broker",
            "status",
            "--endpoint",
            endpoint,
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    value: dict[str, Any] = json.loads(out.stdout)
    return value


def _send(endpoint: str, topic: str, first: int, count: int) -> set[str]:
    producer = official.producer(endpoint, [topic])
    try:
        return {
            producer.send(official.message(topic, f"m{i}".encode() * 50, keys=[f"k{i}"])).message_id
            for i in range(first, first + count)
        }
    finally:
        producer.shutdown()


def _master(
    make_server: Callable[..., ServerProcess], tmp_path: Path, role: str = "async-master"
) -> tuple[ServerProcess, int]:
    ha_port = free_port()
    master = make_server("--role", role, "--ha-port", str(ha_port), store=tmp_path / "m")
    return master, ha_port


def _slave(
    make_server: Callable[..., ServerProcess], tmp_path: Path, ha_port: int
) -> ServerProcess:
    return make_server(
        "--role",
        "slave",
        "--broker-id",
        "1",
        "--master",
        f"127.0.0.1:{ha_port}",
        "--ha-port",
        str(free_port()),
        store=tmp_path / "s",
    )


def test_a_late_slave_catches_up_byte_for_byte(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    master, ha_port = _master(make_server, tmp_path)
    assert "async-master broker-a, replication on" in "".join(master.output)
    _send(master.endpoint, "t-ha-late", 0, 300)
    slave = _slave(make_server, tmp_path, ha_port)
    assert official.wait_for(lambda: _digest(tmp_path / "s") == _digest(tmp_path / "m"))
    _send(master.endpoint, "t-ha-late", 300, 100)  # and keeps up while connected
    assert official.wait_for(lambda: _digest(tmp_path / "s") == _digest(tmp_path / "m"))
    # the lag, as an operator sees it: none once caught up
    assert official.wait_for(lambda: _ha_status(master.endpoint)["lag_bytes"] == 0)
    status = _ha_status(master.endpoint)
    assert status["role"] == "async-master" and len(status["slaves"]) == 1
    assert status["slaves"][0]["acked_offset"] == status["max_offset"] > 0
    mine = _ha_status(slave.endpoint)
    assert mine["role"] == "slave" and mine["connected"] is True
    assert mine["max_offset"] == status["max_offset"]
    assert slave.terminate() == 0, "".join(slave.output)
    assert master.terminate() == 0, "".join(master.output)
    assert _digest(tmp_path / "s") == _digest(tmp_path / "m")


def test_a_killed_slave_restarts_and_catches_up_byte_for_byte(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    master, ha_port = _master(make_server, tmp_path)
    slave = _slave(make_server, tmp_path, ha_port)
    _send(master.endpoint, "t-ha-kill", 0, 200)
    slave.kill()  # SIGKILL, maybe mid-stream: no shutdown hook runs
    _send(master.endpoint, "t-ha-kill", 200, 200)
    slave = _slave(make_server, tmp_path, ha_port)  # recovers, then resumes from its end
    assert official.wait_for(lambda: _digest(tmp_path / "s") == _digest(tmp_path / "m"))
    assert slave.terminate() == 0, "".join(slave.output)
    assert master.terminate() == 0, "".join(master.output)
    assert _digest(tmp_path / "s") == _digest(tmp_path / "m")


def test_a_slave_refuses_sends_and_its_store_serves_as_a_broker(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    master, ha_port = _master(make_server, tmp_path)
    slave = _slave(make_server, tmp_path, ha_port)
    sent = _send(master.endpoint, "t-ha-ro", 0, 50)
    with pytest.raises(Exception, match=r"(?i)slave|forbidden"):
        _send(slave.endpoint, "t-ha-ro", 50, 1)
    assert official.wait_for(lambda: _digest(tmp_path / "s") == _digest(tmp_path / "m"))
    slave.kill()
    master.kill()
    # the slave's store, started as a broker of its own, serves every message it copied
    alone = make_server(store=tmp_path / "s")
    consumer = official.simple_consumer(alone.endpoint, "g-ha-ro", "t-ha-ro")
    try:
        got = official.receive_until(consumer, lambda g: len(g) >= 50, timeout_s=60)
        assert {m.message_id for m in got} == sent
    finally:
        consumer.shutdown()


def test_sync_master_without_a_slave_answers_a_retryable_error_in_time(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    master, _ = _master(make_server, tmp_path, "sync-master")
    producer = official.producer(master.endpoint, ["t-ha-none"])
    try:
        started = time.monotonic()
        with pytest.raises(Exception, match=r"HA_NOT_AVAILABLE|no slave"):
            producer.send(official.message("t-ha-none", b"m"))
        assert time.monotonic() - started < 10  # each attempt answered at once
    finally:
        producer.shutdown()


def test_a_resend_of_a_send_stored_without_a_slave_is_stored_once(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A sync-master with no slave stores a send and answers "not replicated"; every
    resend of it (the same message id) is answered from that copy, never stored again:
    "not replicated" while no slave has it, then SEND_OK with the first copy's offset once
    a slave does (docs/ha.md, "Riding through a failover")."""
    from reliable import Message, Producer, SendFailed, SendStatus
    from tests.e2e.helpers import read_group

    master, ha_port = _master(make_server, tmp_path, "sync-master")
    topic = "t-ha-resend-once"
    message = Message(topic, b"once")
    with Producer(transport="grpc", endpoint=master.endpoint, failover_wait_s=0) as producer:
        for _ in range(2):  # 3 attempts each, every one answered "not replicated"
            with pytest.raises(SendFailed) as failed:
                producer.send(message)
            assert all("HA_NOT_AVAILABLE" in str(e) for _q, e in failed.value.attempts)
        _slave(make_server, tmp_path, ha_port)
        deadline = time.monotonic() + 30
        while True:
            try:
                done = producer.send(message)
                break
            except SendFailed:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert done.status is SendStatus.SEND_OK and done.message_id == message.message_id
        later = producer.send(Message(topic, b"later"))
        assert later.status is SendStatus.SEND_OK
    got = read_group(
        master.endpoint, topic, "g-ha-resend-once", lambda r: b"later" in {m.body for m in r}
    )
    assert sorted(m.body for m in got) == [b"later", b"once"]  # one copy, however many resends


def test_sync_master_sync_flush_sigkill_loses_no_acknowledged_message(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    ha_port = free_port()
    master = make_server(
        "--role",
        "sync-master",
        "--ha-port",
        str(ha_port),
        "--flush",
        "sync",
        "--ha-sync-timeout-ms",
        "2000",
        store=tmp_path / "m",
    )
    slave = make_server(
        "--role",
        "slave",
        "--broker-id",
        "1",
        "--master",
        f"127.0.0.1:{ha_port}",
        "--ha-port",
        str(free_port()),
        "--flush",
        "sync",
        store=tmp_path / "s",
    )
    acked: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        producer = official.producer(master.endpoint, ["t-ha-sync"])
        try:
            i = 0
            while not stop.is_set():
                try:
                    receipt = producer.send(official.message("t-ha-sync", f"m{i}".encode()))
                except Exception:
                    return  # the master is gone
                acked.append(receipt.message_id)
                i += 1
        finally:
            producer.shutdown()

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    assert official.wait_for(lambda: len(acked) >= 150, timeout_s=60)
    master.kill()  # SIGKILL while the producer sends
    stop.set()
    thread.join(60)
    slave.kill()
    # the slave's store, started as a broker, has every acknowledged message
    alone = make_server(store=tmp_path / "s")
    consumer = official.simple_consumer(alone.endpoint, "g-ha-sync", "t-ha-sync")
    try:
        got = official.receive_until(
            consumer, lambda g: set(acked) <= {m.message_id for m in g}, timeout_s=60
        )
        assert set(acked) <= {m.message_id for m in got}
    finally:
        consumer.shutdown()


def _admin(endpoint: str, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "reliable_cli", "admin", *args, "--endpoint", endpoint, "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    value: dict[str, Any] = json.loads(out.stdout)
    return value


def test_a_slave_keeps_its_masters_topics_groups_and_offsets(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    master, ha_port = _master(make_server, tmp_path)
    slave = _slave(make_server, tmp_path, ha_port)
    sent = _send(master.endpoint, "t-ha-conf", 0, 30)
    consumer = official.simple_consumer(master.endpoint, "g-ha-conf", "t-ha-conf")
    try:
        got = official.receive_until(consumer, lambda g: len(g) >= 30, timeout_s=60)
        assert {m.message_id for m in got} == sent  # receive_until acks each
    finally:
        consumer.shutdown()

    def progress(endpoint: str) -> list[Any] | None:
        try:
            shown = _admin(endpoint, "group", "show", "g-ha-conf", "--topic", "t-ha-conf")
        except subprocess.CalledProcessError as exc:
            assert "CONSUMER_GROUP_NOT_FOUND" in exc.stderr, exc.stderr  # not synced yet
            return None
        return [(q["queue_id"], q["consumer_offset"]) for q in shown["progress"]["queues"]]

    on_master = progress(master.endpoint)
    assert on_master is not None and sum(offset for _, offset in on_master) == 30
    # the master sends its configuration every 5 s: the slave has the topic, the group and
    # the committed offsets
    assert official.wait_for(lambda: progress(slave.endpoint) == on_master, timeout_s=30)
    topics = {t["name"] for t in _admin(slave.endpoint, "topic", "list")["topics"]}
    assert "t-ha-conf" in topics
    assert _ha_status(slave.endpoint)["config_synced_ms"] > 0
    # the slave's store, started as a broker: the group resumes where it was, nothing again
    slave.kill()
    master.kill()
    alone = make_server(store=tmp_path / "s")
    again = official.simple_consumer(alone.endpoint, "g-ha-conf", "t-ha-conf")
    try:
        assert again.receive(32, 15) == []
    finally:
        again.shutdown()


def _promote(endpoint: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """`reliable admin broker promote --json` (not checked: a refusal exits 1)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "reliable_cli",
            "admin",
            "broker",
            "promote",
            "--endpoint",
            endpoint,
            "--json",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _sync_pair(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> tuple[ServerProcess, int, ServerProcess, int]:
    """A sync-master and its slave, both under sync flush: (master, its HA port, slave,
    its HA port)."""
    m_ha, s_ha = free_port(), free_port()
    master = make_server(
        "--role",
        "sync-master",
        "--ha-port",
        str(m_ha),
        "--flush",
        "sync",
        "--ha-sync-timeout-ms",
        "2000",
        store=tmp_path / "m",
    )
    slave = make_server(
        "--role",
        "slave",
        "--broker-id",
        "1",
        "--master",
        f"127.0.0.1:{m_ha}",
        "--ha-port",
        str(s_ha),
        "--flush",
        "sync",
        store=tmp_path / "s",
    )
    return master, m_ha, slave, s_ha


def test_promotion_is_refused_while_the_master_lives_or_on_a_master(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    master, _, slave, _ = _sync_pair(make_server, tmp_path)
    _send(master.endpoint, "t-ha-refuse", 0, 20)
    assert official.wait_for(lambda: _ha_status(slave.endpoint)["lag_bytes"] == 0, timeout_s=60)
    refused = _promote(slave.endpoint)
    assert refused.returncode == 1, refused.stdout
    assert "master-alive" in refused.stderr and "FORBIDDEN" in refused.stderr
    refused = _promote(master.endpoint)
    assert refused.returncode == 1 and "not-a-slave" in refused.stderr, refused.stderr
    # the typed error of the client library
    from reliable.admin import AdminClient, PromotionRefused

    client = AdminClient(slave.endpoint)
    try:
        with pytest.raises(PromotionRefused) as info:
            client.promote()
        assert info.value.reason == "master-alive"
    finally:
        client.close()
    assert _ha_status(slave.endpoint)["role"] == "slave"  # nothing changed
    with pytest.raises(Exception, match=r"(?i)slave|forbidden"):
        _send(slave.endpoint, "t-ha-refuse", 20, 1)


def _bodies(path: Path) -> bytes:
    return path.read_bytes()


def test_failover_promote_then_the_old_master_rejoins_byte_for_byte(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """sync-master + slave; the master SIGKILLed, the slave promoted by the operator, sends
    go on to it; the old master restarted as a slave of the new one cuts the tail it alone
    had (never acknowledged: kept aside) and ends byte-identical to the new master."""
    master, m_ha, slave, s_ha = _sync_pair(make_server, tmp_path)
    acked = _send(master.endpoint, "t-ha-fo", 0, 120)  # each acknowledged: the slave has it
    assert official.wait_for(lambda: _ha_status(slave.endpoint)["lag_bytes"] == 0, timeout_s=60)
    before_kill = _ha_status(slave.endpoint)["max_offset"]
    # the master goes on storing while its slave is gone: stored, never acknowledged
    slave.kill()
    producer = official.producer(master.endpoint, ["t-ha-fo"])
    unacked = [f"unacked-{i}".encode() for i in range(10)]
    try:
        for body in unacked:
            with pytest.raises(Exception, match=r"HA_NOT_AVAILABLE|no slave"):
                producer.send(official.message("t-ha-fo", body))
    finally:
        producer.shutdown()
    master_status = _ha_status(master.endpoint)
    assert master_status["max_offset"] > before_kill
    assert master_status["acked_checkpoint"] == before_kill
    master.kill()
    # the slave again, its master dead: it has not heard from it, so promotion needs --force
    slave = make_server(
        "--role",
        "slave",
        "--broker-id",
        "1",
        "--master",
        f"127.0.0.1:{m_ha}",
        "--ha-port",
        str(s_ha),
        "--flush",
        "sync",
        store=tmp_path / "s",
    )
    refused = _promote(slave.endpoint)
    assert refused.returncode == 1 and "not-caught-up" in refused.stderr, refused.stderr
    done = _promote(slave.endpoint, "--force")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["before"]["role"] == "slave" and result["after"]["role"] == "async-master"
    assert result["before"]["max_offset"] == result["after"]["max_offset"] == before_kill
    assert result["epoch"] == [2, before_kill]
    assert "promoted to async-master" in "".join(slave.output)
    # the promoted slave takes sends at once, no restart
    acked |= _send(slave.endpoint, "t-ha-fo", 200, 60)
    new_end = _ha_status(slave.endpoint)["max_offset"]
    assert new_end > before_kill
    # the old master rejoins as a slave of the new one
    old = make_server(
        "--role",
        "slave",
        "--broker-id",
        "1",
        "--master",
        f"127.0.0.1:{s_ha}",
        "--ha-port",
        str(free_port()),
        "--flush",
        "sync",
        store=tmp_path / "m",
    )
    said = "".join(old.output)
    assert f"beyond offset {before_kill}" in said, said
    saved = tmp_path / "m" / "ha" / f"truncated-{before_kill}.bin"
    tail = saved.read_bytes()
    assert len(tail) == master_status["max_offset"] - before_kill
    assert all(body in tail for body in unacked)  # what was cut is kept
    assert official.wait_for(
        lambda: _digest(tmp_path / "m") == _digest(tmp_path / "s"), timeout_s=120
    )
    status = _ha_status(slave.endpoint)
    assert official.wait_for(
        lambda: (s := _ha_status(slave.endpoint))["slaves"] and s["lag_messages"] == 0,
        timeout_s=60,
    ), status
    # every acknowledged message is on the new master, none of the cut ones
    consumer = official.simple_consumer(slave.endpoint, "g-ha-fo", "t-ha-fo")
    try:
        got = official.receive_until(
            consumer, lambda g: acked <= {m.message_id for m in g}, timeout_s=120
        )
        assert acked <= {m.message_id for m in got}
        assert not any(m.body in unacked for m in got)
    finally:
        consumer.shutdown()
    # the consumer's acks are records too: replicated as they are written, not at the next
    # heartbeat
    assert official.wait_for(
        lambda: _digest(tmp_path / "m") == _digest(tmp_path / "s"), timeout_s=10
    )
    assert old.terminate() == 0, "".join(old.output)
    assert slave.terminate() == 0, "".join(slave.output)
    assert _digest(tmp_path / "m") == _digest(tmp_path / "s")


def test_config_sync_deletes_what_the_master_deleted_at_the_set_interval(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    ha_port = free_port()
    master = make_server(
        "--role",
        "async-master",
        "--ha-port",
        str(ha_port),
        "--ha-config-sync-ms",
        "300",
        store=tmp_path / "m",
    )
    slave = _slave(make_server, tmp_path, ha_port)
    for name in ("t-ha-keep", "t-ha-del"):
        _admin(master.endpoint, "topic", "create", name, "--queues", "2")
    _admin(master.endpoint, "group", "create", "g-ha-del")

    from reliable.admin import AdminClient

    client = AdminClient(slave.endpoint)

    def on_slave() -> set[str]:
        topics = {t["name"] for t in client.call("ListTopics")["topics"]}
        return topics | {g["name"] for g in client.call("ListGroups")["groups"]}

    try:
        assert official.wait_for(
            lambda: {"t-ha-keep", "t-ha-del", "g-ha-del"} <= on_slave(), timeout_s=60
        )
        _admin(master.endpoint, "topic", "delete", "t-ha-del", "--yes")
        _admin(master.endpoint, "group", "delete", "g-ha-del", "--yes")
        assert official.wait_for(lambda: not {"t-ha-del", "g-ha-del"} & on_slave(), timeout_s=60)
        assert "t-ha-keep" in on_slave()
        status = client.ha_status()
        assert status["lag_messages"] == 0 and status["lag_bytes"] == 0
    finally:
        client.close()


def test_a_stopped_stores_status_says_the_role_it_ran_with(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    from tests.e2e.grpc.server_process import admin_json

    master, _ = _master(make_server, tmp_path, "sync-master")
    assert master.terminate() == 0, "".join(master.output)
    status = admin_json("broker", "status", "--store", str(tmp_path / "m"))
    assert status["role"] == "sync-master" and status["running"] is False
    assert status["broker_name"] == "broker-a" and status["broker_id"] == 0
    assert status["max_offset"] == 0
