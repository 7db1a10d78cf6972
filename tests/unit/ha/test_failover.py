"""Epochs, the rejoin's cut or refusal, config sync of delay offsets and deletions, lag
in messages: stores and brokers in one process, replication over loopback sockets."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from broker.broker import Broker
from broker.config import BrokerConfig
from broker.ha import HaConfig, HaMaster, HaRole, HaSlave
from broker.ha.errors import PromotionRefused, RejoinRefused
from broker.ha.metrics import HA_METRICS, ReplicationCollector
from broker.ha.node import HaNode
from broker.ha.rejoin import plan_rejoin
from broker.ha.state import AckedCheckpoint, EpochHistory, branch_point, read_acked
from broker.store.message import Message
from broker.store.store import MessageStore
from tests.unit.store._helpers import small_config


def _wait(cond: Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError("timed out")


def _put(store: MessageStore, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        assert store.put_message(Message("fo-t", f"b{i}".encode() * 20, queue_id=i % 2)).append


def test_branch_point_is_the_end_of_the_last_shared_epoch() -> None:
    one = [(1, 0)]
    two = [(1, 0), (2, 900)]
    assert branch_point(one, 1000, two, 1500) == 900  # old master ahead in epoch 1
    assert branch_point(one, 800, two, 1500) == 800  # a slave behind: nothing to cut
    assert branch_point(one, 1000, one, 700) == 700  # ahead of its master, same epoch
    assert branch_point(two, 1500, two, 1500) == 1500
    with pytest.raises(RejoinRefused, match="share no epoch"):
        branch_point([(2, 0)], 10, one, 10)


def test_acked_checkpoint_survives_and_detects_damage(tmp_path: Path) -> None:
    assert read_acked(tmp_path) == -1
    cp = AckedCheckpoint(tmp_path)
    cp.advance(100)
    cp.advance(50)  # never backwards
    cp.close()
    assert read_acked(tmp_path) == 100
    path = tmp_path / "ha" / "acked"
    raw = bytearray(path.read_bytes())
    raw[3] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(RejoinRefused, match="checksum"):
        read_acked(tmp_path)


def _master_of(store: MessageStore, path: Path, epochs: EpochHistory) -> HaMaster:
    ha = HaMaster(store, HaConfig(HaRole.ASYNC_MASTER, port=0), epochs=epochs)
    ha.start()
    return ha


def test_a_rejoin_cuts_an_unacknowledged_tail_and_refuses_an_acknowledged_one(
    tmp_path: Path,
) -> None:
    old = MessageStore(small_config(tmp_path / "old"))
    new = MessageStore(small_config(tmp_path / "new"))
    old.start()
    new.start()
    try:
        _put(old, 30)
        shared = old.commitlog.get_max_offset()
        at = 0
        while at < shared:  # the slave's copy, as replication makes it
            at = new.append_replica(at, old.read_replica(at, 1 << 20))
        _put(old, 7, start=30)  # the old master's tail, never replicated
        epochs = EpochHistory(tmp_path / "new")
        epochs.begin(shared)  # the promotion
        _put(new, 5, start=100)
        ha = _master_of(new, tmp_path / "new", epochs)
        cfg = HaConfig(HaRole.SLAVE, broker_id=1, master=("127.0.0.1", ha.port))
        try:
            # a slave acknowledged the old master's log beyond the shared part: refused
            AckedCheckpoint(tmp_path / "old").advance(shared + 1)
            with pytest.raises(RejoinRefused, match=f"{shared}.*{shared + 1}"):
                plan_rejoin(old, cfg, EpochHistory(tmp_path / "old"))
            (tmp_path / "old" / "ha" / "acked").unlink()
            AckedCheckpoint(tmp_path / "old").advance(shared)  # acknowledged up to there
            plan = plan_rejoin(old, cfg, EpochHistory(tmp_path / "old"))
            assert plan is not None
            assert (plan.offset, plan.end, plan.messages) == (
                shared,
                old.commitlog.get_max_offset(),
                7,
            )
            assert plan.saved.read_bytes() == old.read_replica(shared, 1 << 20)
        finally:
            ha.stop()
    finally:
        new.shutdown()
        old.shutdown()
    # started again with the cut: log, queues and topic-queue table end where it was shared
    again = MessageStore(small_config(tmp_path / "old"))
    again.truncate_to = shared
    again.start()
    try:
        assert again.commitlog.get_max_offset() == shared
        assert (
            again.get_max_offset_in_queue("fo-t", 0) + again.get_max_offset_in_queue("fo-t", 1)
            == 30
        )
        _put(again, 1, start=200)  # queue offsets follow on from the cut
        assert again.wait_dispatched()
        assert again.get_max_offset_in_queue("fo-t", 0) == 16
    finally:
        again.shutdown()


def _brokers(tmp_path: Path) -> tuple[Broker, Broker]:
    master = Broker(small_config(tmp_path / "m"), BrokerConfig())
    slave = Broker(small_config(tmp_path / "s"), BrokerConfig(replica=True))
    master.start()
    slave.start()
    return master, slave


def test_config_sync_takes_delay_offsets_and_deletions(tmp_path: Path) -> None:
    master, slave = _brokers(tmp_path)
    try:
        master.create_topic("t-keep", queues=1)
        master.create_topic("t-gone", queues=1)
        master.create_group("g-keep")
        master.create_group("g-gone")
        master.commit_offset("g-gone", "t-gone", 0, 3)
        master._schedule.replace({"offsetTable": {"3": 12}, "timer": {"low": 4}})
        slave.apply_config_snapshot(master.config_snapshot())
        assert slave.get_topic("t-gone") is not None and slave.get_group("g-gone") is not None
        assert master.delete_topic("t-gone") and master.delete_group("g-gone")
        slave.apply_config_snapshot(master.config_snapshot())
        assert slave.get_topic("t-gone") is None and slave.get_group("g-gone") is None
        assert slave.get_topic("t-keep") is not None and slave.get_group("g-keep") is not None
        assert slave.offsets_of("g-gone", "t-gone") == {}
        assert slave._schedule.offsets() == {3: 12} == master._schedule.offsets()
        assert slave._schedule.snapshot()["timer"]["low"] == 4
    finally:
        master.shutdown()
        slave.shutdown()
    # the slave's store, started as a broker: its delay progress is the master's
    alone = Broker(small_config(tmp_path / "s"), BrokerConfig())
    alone.start()
    try:
        assert alone._schedule.offsets() == {3: 12}
    finally:
        alone.shutdown()


def test_lag_in_messages_promotion_and_metrics(tmp_path: Path) -> None:
    master, slave = _brokers(tmp_path)
    m_node = HaNode(master, HaConfig(HaRole.SYNC_MASTER, port=0, sync_timeout_ms=5000))
    m_node.start()
    assert isinstance(m_node.replication, HaMaster)
    port = m_node.replication.port
    s_node = HaNode(
        slave,
        HaConfig(HaRole.SLAVE, broker_id=1, port=0, master=("127.0.0.1", port), config_sync_ms=200),
    )
    try:
        for i in range(40):  # before the slave: counted by walking the log
            master.send_message(Message("lag-t", f"x{i}".encode(), queue_id=0))
        assert m_node.replication.lag_messages(0) == (40, True)
        s_node.start()
        _wait(lambda: m_node.status()["lag_messages"] == 0)
        slave_side = s_node.replication
        assert isinstance(slave_side, HaSlave)
        before = slave_side.master_max_offset
        mid = master.store.get_commitlog_max_offset()
        for i in range(25):  # counted from the remembered appends
            master.store.put_message(Message("lag-t", f"y{i}".encode(), queue_id=1))
        assert m_node.replication.lag_messages(mid) == (25, True)
        assert m_node.replication.lag_messages(0) == (65, True)
        _wait(lambda: s_node.status()["lag_bytes"] == 0 and s_node.status()["lag_messages"] == 0)
        assert before >= 0
        # metrics: every declared family, the slave's lag and the master's sync waits
        done: list[object] = []
        m_node.replication.when_replicated(master.store.get_commitlog_max_offset(), done.append)
        _wait(lambda: done == [None])
        for node in (m_node, s_node):
            registry = CollectorRegistry()
            registry.register(ReplicationCollector(node))
            names = {
                f.name + ("_total" if f.type == "counter" else ""): f.type
                for f in registry.collect()
            }
            assert names == HA_METRICS
        registry = CollectorRegistry()
        registry.register(ReplicationCollector(m_node))
        assert (
            registry.get_sample_value("reliable_broker_ha_sync_waits_total", {"outcome": "acked"})
            == 1.0
        )
        assert registry.get_sample_value("reliable_broker_ha_lag_messages", {"slave": "1"}) == 0
        assert registry.get_sample_value("reliable_broker_ha_role", {"role": "sync-master"}) == 1
        # promotion: refused while the master lives, on a master, then forced
        with pytest.raises(PromotionRefused) as info:
            s_node.promote()
        assert info.value.reason == "master-alive"
        with pytest.raises(PromotionRefused) as info:
            m_node.promote()
        assert info.value.reason == "not-a-slave"
        m_node.stop()
        _wait(lambda: not slave_side.connected)
        result = s_node.promote(sync=False)
        assert result["after"]["role"] == "async-master"
        assert s_node.epochs.entries == [(1, 0), (2, result["after"]["max_offset"])]
        assert not slave.config.replica
        assert slave.send_message(Message("lag-t", b"after", queue_id=0)).queue_offset == 40
    finally:
        s_node.stop()
        m_node.stop()
        master.shutdown()
        slave.shutdown()


def test_a_running_slave_refused_for_its_history_rejoins_without_a_restart(
    tmp_path: Path,
) -> None:
    """The slave's master is replaced by one promoted with a shorter log (it never had
    the last 7 records), which went on in an epoch of its own: the slave saves them,
    cuts its running store back, and replicates the new master's log byte for byte; its
    queues hold the shared records and the new ones."""
    old = MessageStore(small_config(tmp_path / "old"))
    new = MessageStore(small_config(tmp_path / "new"))
    old.start()
    new.start()
    slave = Broker(small_config(tmp_path / "s"), BrokerConfig(replica=True))
    slave.start()
    old_ha = _master_of(old, tmp_path / "old", EpochHistory(tmp_path / "old"))
    node = HaNode(
        slave,
        HaConfig(HaRole.SLAVE, broker_id=1, master=("127.0.0.1", old_ha.port), reconnect_ms=100),
    )
    cut: list[int] = []
    node.on_rejoined.append(lambda plan: cut.append(plan.offset))
    new_ha: HaMaster | None = None
    try:
        _put(old, 20)
        shared = old.commitlog.get_max_offset()
        at = 0
        while at < shared:  # the new master's copy of the first 20
            at = new.append_replica(at, old.read_replica(at, 1 << 20))
        _put(old, 7, start=20)  # only the old master and its slave have these
        node.start()
        _wait(lambda: slave.store.get_commitlog_max_offset() == old.commitlog.get_max_offset())
        assert slave.store.wait_dispatched()
        old_ha.stop()
        epochs = EpochHistory(tmp_path / "new")
        epochs.begin(shared)  # its promotion
        new_ha = _master_of(new, tmp_path / "new", epochs)
        _put(new, 5, start=100)
        replication = node.replication
        assert isinstance(replication, HaSlave)
        replication.follow(("127.0.0.1", new_ha.port), 0)
        _wait(lambda: slave.store.get_commitlog_max_offset() == new.commitlog.get_max_offset())
        assert cut == [shared]
        assert node.status()["rejoined"]["offset"] == shared
        _wait(lambda: node.epochs.entries == [(1, 0), (2, shared)])  # the master's, synced
        saved = tmp_path / "s" / "ha" / f"truncated-{shared}.bin"
        assert saved.read_bytes() == old.read_replica(shared, 1 << 20)
        end = new.commitlog.get_max_offset()
        assert slave.store.read_replica(0, end) == new.read_replica(0, end)
        assert slave.store.wait_dispatched()
        assert (
            slave.store.get_max_offset_in_queue("fo-t", 0)
            + slave.store.get_max_offset_in_queue("fo-t", 1)
            == 25
        )
        bodies = []
        for qid in (0, 1):
            got = slave.store.get_messages("g", "fo-t", qid, 0, 64)
            bodies += [m.body for m in got.messages]
        assert sorted(bodies) == sorted(
            [f"b{i}".encode() * 20 for i in [*range(20), *range(100, 105)]]
        )
    finally:
        node.stop()
        if new_ha is not None:
            new_ha.stop()
        slave.shutdown()
        new.shutdown()
        old.shutdown()
