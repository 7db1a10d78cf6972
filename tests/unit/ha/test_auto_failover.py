"""Automatic failover's decisions (`broker.ha.failover`), against an in-memory stand-in
for etcd's KV and leases with the same compare-and-set semantics; a virtual clock.
The real etcd and real brokers: `tests/chaos/test_ha_auto_failover.py`."""

from __future__ import annotations

import json
from unittest import mock

import pytest

from broker.ha.etcd import Compare, KeyValue, Put
from broker.ha.failover import Failover, FailoverConfig, LeaseGate
from broker.ha.master import HaMaster
from broker.ha.slave import HaSlave

ROOT = b"/reliable/ha/broker-a/"


class FakeEtcd:
    """etcd's KV with mod revisions, leases that expire only when told to."""

    host, port = "127.0.0.1", 2379

    def __init__(self) -> None:
        self.revision = 1
        self.kvs: dict[bytes, KeyValue] = {}
        self.leases: set[int] = set()
        self.txns = 0

    def grant(self, ttl_s: int) -> tuple[int, int]:
        lease = 100 + len(self.leases)
        self.leases.add(lease)
        return lease, ttl_s

    def keepalive(self, lease: int) -> int:
        return 2 if lease in self.leases else 0

    def revoke(self, lease: int) -> None:
        self.expire(lease)

    def expire(self, lease: int) -> None:
        self.leases.discard(lease)
        self.kvs = {k: kv for k, kv in self.kvs.items() if kv.lease != lease}

    def get(self, key: bytes) -> KeyValue | None:
        return self.kvs.get(key)

    def get_prefix(self, prefix: bytes) -> list[KeyValue]:
        return [kv for k, kv in sorted(self.kvs.items()) if k.startswith(prefix)]

    def put(self, key: bytes, value: bytes, *, lease: int = 0) -> None:
        self.revision += 1
        old = self.kvs.get(key)
        version = old.version + 1 if old else 1
        self.kvs[key] = KeyValue(key, value, self.revision, version, lease)

    def txn(self, compare: list[Compare], success: list[Put]) -> bool:
        self.txns += 1
        for c in compare:
            kv = self.kvs.get(c.key)
            if (kv.mod_revision if kv else 0) != c.mod_revision:
                return False
        for p in success:
            self.put(p.key, p.value, lease=p.lease)
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _node(end: int = 500, last_epoch: int = 3) -> mock.Mock:
    node = mock.Mock()
    node.replication = mock.Mock(spec=HaSlave)
    node.broker.store.get_commitlog_max_offset.return_value = end
    node.epochs.last = (last_epoch, 100)

    def promote(*, sync: bool, force: bool, epoch: int) -> dict[str, object]:
        node.replication = mock.Mock(spec=HaMaster)
        return {}

    node.promote.side_effect = promote
    return node


def _failover(etcd: FakeEtcd, member: int, node: mock.Mock, clock: Clock) -> Failover:
    config = FailoverConfig(
        group="broker-a",
        member=member,
        ha_address=f"127.0.0.1:{10910 + member}",
        sync=True,
        ttl_s=2,
        poll_ms=10,
        campaign_wait_ms=20,
    )
    f = Failover(etcd, config, clock=clock)
    f.endpoint = f"127.0.0.1:{8080 + member}"
    f.bind(node)
    return f


def test_a_lone_candidate_takes_the_next_epoch_and_is_promoted() -> None:
    etcd, clock, node = FakeEtcd(), Clock(), _node()
    etcd.put(ROOT + b"epoch", b"3")
    f = _failover(etcd, 1, node, clock)
    f.poll()
    node.promote.assert_called_once_with(sync=True, force=True, epoch=4)
    leader = etcd.get(ROOT + b"leader")
    assert leader is not None and leader.lease == f.status()["lease"]
    assert json.loads(leader.value)["member"] == 1
    assert etcd.get(ROOT + b"epoch").value == b"4"  # type: ignore[union-attr]
    assert f.fence()


def test_a_candidate_further_along_keeps_this_one_from_campaigning() -> None:
    etcd, clock, node = FakeEtcd(), Clock(), _node(end=500)
    etcd.put(ROOT + b"epoch", b"3")
    lease, _ = etcd.grant(2)
    better = {"epoch": 3, "end": 900, "ha": "127.0.0.1:10912"}
    etcd.put(ROOT + b"candidates/2", json.dumps(better).encode(), lease=lease)
    f = _failover(etcd, 1, node, clock)
    f.poll()
    node.promote.assert_not_called()
    assert etcd.txns == 0 and etcd.get(ROOT + b"leader") is None
    etcd.expire(lease)  # the better one died before it campaigned: this one goes on
    f.poll()
    node.promote.assert_called_once_with(sync=True, force=True, epoch=4)


def test_of_two_campaigns_for_one_epoch_only_one_succeeds_and_the_other_follows() -> None:
    etcd, clock = FakeEtcd(), Clock()
    a, b = _node(), _node()
    fa, fb = _failover(etcd, 1, a, clock), _failover(etcd, 2, b, clock)
    # b read the epoch key, then a's transaction landed first
    stale = etcd.get(ROOT + b"epoch")
    fa.poll()
    lost = fb.client.txn(
        [Compare(ROOT + b"epoch", stale.mod_revision if stale else 0)],
        [Put(ROOT + b"epoch", b"4")],
    )
    assert not lost
    fb.poll()  # the leader key names a: b follows it
    b.promote.assert_not_called()
    b.replication.follow.assert_called_once_with(("127.0.0.1", 10911), fa.epoch)


def test_a_master_acknowledges_only_within_three_quarters_of_a_ttl_of_a_renewal() -> None:
    etcd, clock, node = FakeEtcd(), Clock(), _node()
    f = _failover(etcd, 1, node, clock)
    f.poll()
    gate = LeaseGate(f.fence)
    answers: list[object] = []
    clock.now += 1.49
    gate.when_replicated(1, answers.append)
    clock.now += 0.02  # 1.51 s after the renewal: etcd could expire the lease at 2 s
    gate.when_replicated(2, answers.append)
    assert answers[0] is None and answers[1] is not None
    f.poll()  # renewed (due after a quarter of a TTL): acknowledging again
    assert f.fence() and not f.deposed.is_set()


def test_a_master_no_longer_named_is_deposed_and_acknowledges_nothing() -> None:
    etcd, clock, node = FakeEtcd(), Clock(), _node()
    f = _failover(etcd, 1, node, clock)
    f.poll()
    f.poll()
    assert not f.deposed.is_set() and f.fence()
    etcd.expire(f.status()["lease"])  # it could not renew in time
    clock.now += 0.5
    f.poll()
    assert f.deposed.is_set() and not f.fence()


def test_a_lost_answer_to_a_won_campaign_is_taken_at_the_next_poll() -> None:
    etcd, clock, node = FakeEtcd(), Clock(), _node()
    f = _failover(etcd, 1, node, clock)
    lease = 100  # the fake's first lease: this broker's, granted at its first poll
    value = {"epoch": 7, "member": 1, "ha": "127.0.0.1:10911", "endpoint": "", "lease": lease}
    etcd.put(ROOT + b"leader", json.dumps(value).encode(), lease=lease)
    f.poll()
    assert f.status()["lease"] == lease
    node.promote.assert_called_once_with(sync=True, force=True, epoch=7)


def test_failover_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="broker-id"):
        FailoverConfig("g", 0, "127.0.0.1:1", True).validate()
    with pytest.raises(ValueError, match="HOST:PORT"):
        FailoverConfig("g", 1, "127.0.0.1:0", True).validate()
    with pytest.raises(ValueError, match="TTL"):
        FailoverConfig("g", 1, "127.0.0.1:1", True, ttl_s=1).validate()
