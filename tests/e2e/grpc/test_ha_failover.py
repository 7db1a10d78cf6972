"""A failover with real processes (docs/ha.md, "Riding through a failover"): a master is
SIGKILLed and its slave promoted (`reliable admin broker promote`) while clients go on.

- a framework `Producer` with default settings, given both brokers' endpoints, keeps
  sending: every send is acknowledged or raises `SendFailed` after its bounded retries,
  and every acknowledged message is read exactly once from the new master;
- a message received (not acknowledged) on the old master stays invisible on the new one
  until its invisible time ends;
- a half message checked on the old master is not checked again on the new one before
  its next check time.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from protocol.ports import free_port
from reliable import (
    Message,
    Producer,
    ReceivedMessage,
    SendFailed,
    SimpleConsumer,
    TransactionState,
)
from tests.e2e.grpc import official
from tests.e2e.grpc.server_process import ServerProcess
from tests.e2e.grpc.test_ha import _ha_status, _promote
from tests.e2e.helpers import read_group


def _pair(
    make_server: Callable[..., ServerProcess], tmp_path: Path, role: str, *extra: str
) -> tuple[ServerProcess, ServerProcess]:
    m_ha = free_port()
    master = make_server("--role", role, "--ha-port", str(m_ha), *extra, store=tmp_path / "m")
    slave = make_server(
        "--role",
        "slave",
        "--broker-id",
        "1",
        "--master",
        f"127.0.0.1:{m_ha}",
        "--ha-port",
        str(free_port()),
        *extra,
        store=tmp_path / "s",
    )
    return master, slave


def _caught_up(master: ServerProcess) -> bool:
    status = _ha_status(master.endpoint)
    return status.get("lag_bytes") == 0


def _fail_over(master: ServerProcess, slave: ServerProcess) -> None:
    """SIGKILL the master, then promote the slave as soon as it sees its master gone."""
    master.kill()
    deadline = time.monotonic() + 30
    while True:
        done = _promote(slave.endpoint)
        if done.returncode == 0:
            assert json.loads(done.stdout)["after"]["role"] == "async-master"
            return
        assert time.monotonic() < deadline, done.stdout + done.stderr
        time.sleep(0.2)


def _read_all(
    endpoint: str, topic: str, group: str, stop: Callable[[Counter[str]], bool]
) -> Counter[str]:
    """Receive and acknowledge from `endpoint` until `stop(counts)` (message id -> times
    read); 30 s at most."""
    got = read_group(endpoint, topic, group, lambda r: stop(Counter(m.message_id for m in r)))
    return Counter(m.message_id for m in got)


def test_a_default_producer_rides_through_a_master_kill_and_a_promotion(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    master, slave = _pair(make_server, tmp_path, "sync-master", "--ha-sync-timeout-ms", "2000")
    topic = "t-ha-ride"
    acked: list[str] = []
    failed: list[SendFailed] = []
    promoted_at: list[int] = []
    stop = threading.Event()
    # the access point names both brokers: gRPC's pick-first finds the one that answers
    with Producer(transport="grpc", endpoint=f"{master.endpoint};{slave.endpoint}") as producer:

        def send_forever() -> None:
            i = 0
            while not stop.is_set():
                try:
                    acked.append(producer.send(Message(topic, f"r{i}".encode())).message_id)
                except SendFailed as exc:
                    failed.append(exc)
                i += 1

        sender = threading.Thread(target=send_forever, daemon=True)
        sender.start()
        assert official.wait_for(lambda: len(acked) >= 100, timeout_s=60)
        _fail_over(master, slave)
        promoted_at.append(len(acked))
        assert official.wait_for(lambda: len(acked) >= promoted_at[0] + 100, timeout_s=60)
        stop.set()
        sender.join(30)
    # no send failed: the one in flight at the kill waited out the gap (the master gone, the
    # slave answering FORBIDDEN until promoted) within its failover patience (docs/ha.md)
    assert not failed, failed[0]
    wanted = set(acked)
    assert len(wanted) == len(acked)
    counts = _read_all(slave.endpoint, topic, "g-ha-ride", lambda c: wanted <= set(c))
    missing = wanted - set(counts)
    assert not missing, f"{len(missing)} acknowledged messages not on the new master"
    twice = {i: n for i, n in counts.items() if i in wanted and n != 1}
    assert not twice, twice


def test_a_message_received_on_the_old_master_stays_invisible_on_the_new_one(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    master, slave = _pair(make_server, tmp_path, "async-master")
    topic, group = "t-ha-lease", "g-ha-lease"
    with Producer(transport="grpc", endpoint=master.endpoint) as producer:
        ids = [producer.send(Message(topic, f"l{i}".encode())).message_id for i in range(10)]
    received: list[ReceivedMessage] = []
    with SimpleConsumer(
        group,
        {topic: "*"},
        transport="grpc",
        endpoint=master.endpoint,
        await_duration_s=1.0,
        invisible_duration_s=20.0,
    ) as consumer:
        deadline = time.monotonic() + 30
        while len(received) < 10 and time.monotonic() < deadline:
            received.extend(consumer.receive(10))
        leased_at = time.monotonic()
        assert sorted(m.message_id for m in received) == sorted(ids)
        for m in received[:4]:
            consumer.ack(m)
    held = {m.message_id for m in received[4:]}
    assert official.wait_for(lambda: _caught_up(master), timeout_s=30)
    _fail_over(master, slave)
    # on the new master: the 6 still leased are not handed out while their lease lasts
    early = _read_all(slave.endpoint, topic, group, lambda c: time.monotonic() > leased_at + 12)
    assert not set(early) & held, "received again before the invisible time ended"
    assert not set(early) & {m.message_id for m in received[:4]}, "acknowledged, read again"
    # and are, once it ends
    late = _read_all(slave.endpoint, topic, group, lambda c: held <= set(c))
    assert held <= set(late)
    assert time.monotonic() >= leased_at + 20 - 1


def test_a_half_message_checked_on_the_old_master_is_not_checked_again_on_the_new_one(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    interval_s = 15
    master, slave = _pair(
        make_server,
        tmp_path,
        "async-master",
        "--transaction-check-interval-ms",
        str(interval_s * 1000),
    )
    topic = "t-ha-tx"
    checks: list[float] = []

    def checker(_message: ReceivedMessage) -> TransactionState:
        checks.append(time.monotonic())
        return TransactionState.UNKNOWN

    with Producer(
        transport="grpc",
        endpoint=f"{master.endpoint};{slave.endpoint}",
        group="pg-ha-tx",
        transaction_checker=checker,
    ) as producer:
        producer.send_in_transaction(
            Message(topic, b"half"), lambda _m, _a: TransactionState.UNKNOWN
        )
        assert official.wait_for(lambda: len(checks) >= 1, timeout_s=30)  # the old master's
        first = checks[0]
        sent_ms = int(time.time() * 1000)
        assert official.wait_for(lambda: _caught_up(master), timeout_s=30)
        # the slave knows the topic (config sync): the producer's Settings, arriving at
        # the new master, make it the topic's checker there
        assert official.wait_for(
            lambda: (_ha_status(slave.endpoint).get("config_synced_ms") or 0) > sent_ms,
            timeout_s=30,
        )
        _fail_over(master, slave)
        # the producer's stream reaches the new master; its next check is due at first +
        # the interval, not at once
        assert official.wait_for(lambda: len(checks) >= 2, timeout_s=60), "never checked again"
        assert checks[1] >= first + interval_s - 1, (
            f"checked again {checks[1] - first:.1f} s after the first check"
        )
