"""A master that loses its lease while alive (docs/ha.md, "Automatic failover"): the
master of a two-broker group under `--failover auto` is frozen (SIGSTOP) past its lease,
so etcd names its slave; thawed (SIGCONT), it finds itself deposed, stops serving and
starts again in the same process, and rejoins as the slave of the new master, with no
operator. etcd speaks TLS only and wants the brokers' client certificates.

- nothing is acknowledged by the frozen master after it thaws (its fence is long over);
- the process keeps its pid, says why it starts again, and comes back as a slave: the
  new sync-master acknowledges sends again (it needs a slave to), and the old master's
  store holds them (it replicates);
- every message acknowledged before the freeze and after the rejoin is read exactly
  once from the new master.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from bench._failover import TTL_S, Etcd, Member, etcd_binary, leader, stored_bodies
from bench._tls import mutual_tls
from reliable import Message, Producer, SendStatus
from tests.e2e.helpers import read_group

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

TOPIC = "t-deposed"


def _wait(what: str, predicate: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_master_frozen_past_its_lease_rejoins_as_a_slave_in_the_same_process(
    tmp_path: Path,
) -> None:
    assert etcd_binary(), "etcd is not installed: apt-get install etcd-server"
    etcd = Etcd(tmp_path / "etcd", mutual_tls(tmp_path / "tls"))
    etcd.start()
    members = {m: Member(m, tmp_path, etcd) for m in (1, 2)}
    client = etcd.client(timeout_s=1.0)
    try:
        for member in members.values():
            member.start()
        _wait("a master named by etcd", lambda: leader(client) is not None, 60)
        first = members[int(leader(client)["member"])]  # type: ignore[index]
        other = next(m for m in members.values() if m is not first)
        endpoints = f"{first.endpoint};{other.endpoint}"
        with Producer(transport="grpc", endpoint=endpoints) as producer:
            # a sync-master answers "not replicated" until its slave has connected
            _wait(
                "the slave to connect",
                lambda: producer.send(Message(TOPIC, b"probe")).status is SendStatus.SEND_OK,
                60,
            )
            before = [producer.send(Message(TOPIC, b"before-%d" % i)) for i in range(20)]
            assert first.proc is not None
            pid = first.proc.pid
            os.kill(pid, signal.SIGSTOP)  # frozen: no renewal, no answer
            try:
                _wait(
                    "etcd to name the other broker",
                    lambda: (leader(client) or {}).get("member") == other.member,
                    TTL_S * 10,
                )
            finally:
                os.kill(pid, signal.SIGCONT)
            _wait(
                "the old master to say it starts again as a slave",
                lambda: any("starting again to rejoin" in line for line in first.output),
                30,
            )
            # the new sync-master acknowledges only what a slave holds: these sends
            # succeeding means the old master came back as its slave
            after = [producer.send(Message(TOPIC, b"after-%d" % i)) for i in range(20)]
        assert first.alive() and first.proc.pid == pid  # the same process, restarted in place
        assert {r.status for r in before + after} == {SendStatus.SEND_OK}
        won = {m: members[m].epochs_won() for m in members}
        assert not set(won[first.member]) & set(won[other.member]), won
        assert max(won[other.member]) > max(won[first.member]), won
        wanted = {r.message_id for r in before + after}
        got = read_group(
            other.endpoint, TOPIC, "g-deposed", lambda r: wanted <= {m.message_id for m in r}
        )
        counts = Counter(m.message_id for m in got)
        assert wanted <= set(counts), f"{len(wanted - set(counts))} acknowledged messages lost"
        twice = {i: counts[i] for i in wanted if counts[i] != 1}
        stored = Counter(stored_bodies(other.store))
        assert not twice, (twice, {b: n for b, n in stored.items() if n > 1})
    finally:
        for member in members.values():
            member.stop()
        etcd.stop()
    # the old master's store (now a slave's) holds what the new master acknowledged
    copied = set(stored_bodies(first.store))
    assert {f"after-{i}" for i in range(20)} <= copied, "".join(first.output)
