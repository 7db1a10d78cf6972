"""A slave serving receives while its master is down (broker.acting, docs/ha.md "Reading
from a slave"): it refuses them while its master is up, writes nothing to its commitlog
while it serves them, and what it acknowledged reaches the master, whose offsets never
move back."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.broker import Broker
from broker.config import BrokerConfig
from broker.errors import ReplicaNotServing
from broker.ha import HaConfig, HaRole, HaSlave
from broker.ha.node import HaNode
from broker.store.message import Message
from tests.unit.store._helpers import small_config

T, G = "sr-t", "sr-g"


def _wait(cond: Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def _offsets(broker: Broker, count: int = 8) -> list[int]:
    return [e.message.queue_offset for e in broker.receive(G, T, count, 30_000)]


def test_a_report_never_moves_the_master_s_offsets_back(tmp_path: Path) -> None:
    master = Broker(small_config(tmp_path / "m"), BrokerConfig())
    master.start()
    try:
        master.create_topic(T, queues=1)
        master.create_group(G)
        for i in range(12):
            master.send_message(Message(T, f"m{i}".encode(), queue_id=0))
        assert master.store.wait_dispatched()
        for e in master.receive(G, T, 5, 30_000):
            master.ack(G, T, e.receipt_handle)
        assert master.query_offset(G, T, 0) == 5
        behind = {"groups": {G: {T: {"0": [3, [4], [[2, 0, None]]]}}}}
        assert master.merge_acting_offsets(behind) == 0
        assert master.query_offset(G, T, 0) == 5  # never back
        dlq = master.dlq_topic(G)
        assert master.store.get_max_offset_in_queue(dlq, 0) == 0  # 2 was done here already
        ahead = {"groups": {G: {T: {"0": [8, [9]]}}}}
        assert master.merge_acting_offsets(ahead) == 4
        assert master.query_offset(G, T, 0) == 8
        assert _offsets(master) == [8, 10, 11]  # 5..7 and 9 are done
        assert master.merge_acting_offsets(ahead) == 0  # a report taken twice: no change
        assert master.query_offset(G, T, 0) == 8
        # a group that never received here: its offsets start where the slave's are
        assert master.merge_acting_offsets({"groups": {"sr-new": {T: {"0": [6, []]}}}}) == 6
        assert master.query_offset("sr-new", T, 0) == 6
    finally:
        master.shutdown()


def test_a_slave_serves_reads_only_while_its_master_is_down_and_hands_its_acks_back(
    tmp_path: Path,
) -> None:
    master = Broker(small_config(tmp_path / "m"), BrokerConfig())
    slave = Broker(small_config(tmp_path / "s"), BrokerConfig(replica=True))
    master.start()
    slave.start()
    m_node = HaNode(master, HaConfig(HaRole.ASYNC_MASTER, port=0, config_sync_ms=100))
    m_node.start()
    port = m_node.replication.port
    s_node = HaNode(
        slave,
        HaConfig(
            HaRole.SLAVE,
            broker_id=1,
            port=0,
            master=("127.0.0.1", port),
            config_sync_ms=100,
            reconnect_ms=100,
        ),
    )
    link = s_node.replication
    assert isinstance(link, HaSlave)
    master_down = [False]
    # what the server decides from its probes and the link (`MessagingServicer.acting`)
    slave.acting_gate = lambda: master_down[0] and not link.connected
    s_node.start()
    try:
        master.create_topic(T, queues=1)
        master.create_group(G)
        for i in range(10):
            master.send_message(Message(T, f"m{i}".encode(), queue_id=0))
        assert master.store.wait_dispatched()
        for e in master.receive(G, T, 3, 30_000):
            master.ack(G, T, e.receipt_handle)
        _wait(lambda: s_node.status()["lag_bytes"] == 0 and slave.query_offset(G, T, 0) == 3)
        # the master is up: the slave refuses reads (they go to the master)
        with pytest.raises(ReplicaNotServing):
            slave.receive(G, T, 1, 30_000)

        m_node.stop()  # the master's replication is gone: as if it were down
        master_down[0] = True
        _wait(lambda: not link.connected)
        end = slave.store.get_commitlog_max_offset()
        entries = slave.receive(G, T, 5, 30_000)
        assert [e.message.queue_offset for e in entries] == [3, 4, 5, 6, 7]
        assert slave.acting
        by_offset = {e.message.queue_offset: e.receipt_handle for e in entries}
        assert slave.ack_batch(G, T, [by_offset[o] for o in (3, 4, 5)]) == [None] * 3
        renewed = slave.change_invisible_duration(G, T, by_offset[6], 20_000)
        slave.forward_to_dlq(G, T, renewed)  # deferred: the master writes the copy
        with pytest.raises(ReplicaNotServing):  # parking is left to the master
            slave.forward_to_dlq(G, T, by_offset[7], park=True)
        assert slave.store.get_commitlog_max_offset() == end  # nothing written
        assert slave.query_offset(G, T, 0) == 7  # 7 is still leased
        # a stale configuration (the master's offset 3) does not move it back
        slave.apply_config_snapshot(master.config_snapshot())
        assert slave.query_offset(G, T, 0) == 7

        # the master is back: the slave stops serving, and its report reaches the master
        m_node = HaNode(master, HaConfig(HaRole.ASYNC_MASTER, port=port, config_sync_ms=100))
        m_node.start()
        _wait(lambda: link.connected and master.query_offset(G, T, 0) == 7)
        assert not slave.acting
        with pytest.raises(ReplicaNotServing):
            slave.receive(G, T, 1, 30_000)
        # the master wrote the dead-letter copy of 6 from its own store
        dlq = master.dlq_topic(G)
        assert master.store.wait_dispatched()
        assert master.store.get_max_offset_in_queue(dlq, 0) == 1
        copy = master.store.get_message_by_queue_offset(dlq, 0, 0)
        assert copy is not None and copy.body == b"m6"
        # 7 was leased on the slave, never acknowledged: it comes again; 3..6 do not
        again = master.receive(G, T, 8, 30_000)
        assert [e.message.queue_offset for e in again] == [7, 8, 9]
        # the master's offsets cover the report: the slave forgets it, and follows them
        _wait(lambda: slave._acting_report.document() is None)
        for e in again:
            master.ack(G, T, e.receipt_handle)
        _wait(lambda: slave.query_offset(G, T, 0) == 10)
    finally:
        s_node.stop()
        m_node.stop()
        slave.shutdown()
        master.shutdown()


def test_a_report_is_kept_until_the_master_s_offsets_pass_all_it_holds(tmp_path: Path) -> None:
    from broker.acting import ActingReport
    from broker.store.json_config import JsonConfigFile

    path = tmp_path / "actingOffsets.json"
    report = ActingReport(JsonConfigFile(path))
    key = (G, T, 0)
    report.add({key: (6, frozenset({8}))})
    report.note_dead(G, T, 0, 10, 2, None)  # on disk at once
    again = ActingReport(JsonConfigFile(path))
    again.load()
    assert again.document() == {"groups": {G: {T: {"0": [6, [8], [[10, 2, None]]]}}}}
    for offset in (5, 6, 9, 10):
        report.settle({key: offset})
        assert report.document() is not None, offset
    report.settle({key: 11})
    assert report.document() is None


def test_a_promoted_slave_keeps_what_it_acknowledged_while_acting(tmp_path: Path) -> None:
    master = Broker(small_config(tmp_path / "m"), BrokerConfig())
    slave = Broker(small_config(tmp_path / "s"), BrokerConfig(replica=True))
    master.start()
    slave.start()
    m_node = HaNode(master, HaConfig(HaRole.ASYNC_MASTER, port=0, config_sync_ms=100))
    m_node.start()
    s_node = HaNode(
        slave,
        HaConfig(
            HaRole.SLAVE,
            broker_id=1,
            port=0,
            master=("127.0.0.1", m_node.replication.port),
            config_sync_ms=100,
            reconnect_ms=100,
        ),
    )
    link = s_node.replication
    assert isinstance(link, HaSlave)
    slave.acting_gate = lambda: not link.connected
    s_node.start()
    try:
        master.create_topic(T, queues=1)
        master.create_group(G)
        for i in range(6):
            master.send_message(Message(T, f"m{i}".encode(), queue_id=0))
        assert master.store.wait_dispatched()
        _wait(lambda: s_node.status()["lag_bytes"] == 0 and slave.get_group(G) is not None)
        m_node.stop()
        _wait(lambda: not link.connected)
        entries = slave.receive(G, T, 3, 30_000)
        slave.ack(G, T, entries[0].receipt_handle)
        slave.ack(G, T, entries[2].receipt_handle)
        slave.forward_to_dlq(G, T, entries[1].receipt_handle)
        s_node.promote()
        assert not slave.acting
        # its own pop state now has what it did while acting: 0..2 are done, 1 dead-lettered
        assert _offsets(slave) == [3, 4, 5]
        assert slave.store.wait_dispatched()
        copy = slave.store.get_message_by_queue_offset(slave.dlq_topic(G), 0, 0)
        assert copy is not None and copy.body == b"m1"
        assert slave._acting_report.document() is None
    finally:
        s_node.stop()
        m_node.stop()
        slave.shutdown()
        master.shutdown()
