"""What a promoted slave keeps of its old master's decisions (docs/ha.md, "What a
failover keeps"): leases handed out there stay invisible until they end, and a half
message checked there waits for its next check time. Both travel in the commitlog (the
revive log, the transaction op log), so the slave replays them at promotion."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from broker.broker import Broker
from broker.config import BrokerConfig
from broker.ha import HaConfig, HaMaster, HaRole, HaSlave
from broker.ha.node import HaNode
from broker.store.message import Message, MessageExt
from protocol.props import Prop
from tests.unit.store._helpers import small_config

T, G, PG = "fs-t", "fs-g", "fs-pg"
START_MS = 1_700_000_000_000


def _wait(cond: Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def test_a_promoted_slave_keeps_the_old_masters_leases_and_transaction_checks(
    tmp_path: Path,
) -> None:
    now = [START_MS]
    config = BrokerConfig(transaction_timeout_ms=1_000, transaction_check_interval_ms=60_000)
    master = Broker(small_config(tmp_path / "m"), config, clock=lambda: now[0])
    slave = Broker(
        small_config(tmp_path / "s"),
        BrokerConfig(
            replica=True, transaction_timeout_ms=1_000, transaction_check_interval_ms=60_000
        ),
        clock=lambda: now[0],
    )
    master.start()
    slave.start()  # before anything happens on the master: all of it arrives by replication
    m_node = HaNode(master, HaConfig(HaRole.ASYNC_MASTER, port=0, config_sync_ms=100))
    m_node.start()
    assert isinstance(m_node.replication, HaMaster)
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
    s_node.start()
    checked: list[tuple[str, MessageExt]] = []
    try:
        master.create_topic(T, queues=1)
        master.create_group(G)
        for i in range(6):
            master.send_message(Message(T, f"m{i}".encode(), queue_id=0))
        half = Message(T, b"half", queue_id=0, properties={Prop.TRAN_MSG: "true"})
        master.send_message(half, producer_group=PG)
        assert master.store.wait_dispatched()
        # on the master: 0..2 received for 60 s, 0 acknowledged; the half message checked
        entries = master.receive(G, T, 3, 60_000)
        assert [e.message.queue_offset for e in entries] == [0, 1, 2]
        master.ack(G, T, entries[0].receipt_handle)
        master.register_transaction_checker(PG, lambda m: checked.append(("master", m)))
        now[0] += 2_000
        assert master.check_transactions() == 1
        _wait(lambda: len(checked) == 1)
        end = master.store.get_commitlog_max_offset()
        _wait(lambda: slave.store.get_commitlog_max_offset() == end)
        # a configuration taken after everything above: two applied after this point (the
        # first may have left the master before the changes)
        for _ in range(2):
            mark = int(time.time() * 1000)
            _wait(lambda mark=mark: s_node.status()["config_synced_ms"] > mark)
        m_node.stop()  # the master is gone
        _wait(lambda: not link.connected)
        now[0] += 1_000
        s_node.promote()
        # 1 and 2 are still invisible (their lease has 57 s to go), 0 is done
        got = [e.message.queue_offset for e in slave.receive(G, T, 8, 30_000)]
        assert got == [3, 4, 5]
        # the receipt handle the consumer holds from the old master acknowledges here
        slave.ack(G, T, entries[1].receipt_handle)
        # the half message was checked 1 s ago: not again before the check interval
        slave.register_transaction_checker(PG, lambda m: checked.append(("slave", m)))
        assert slave.check_transactions() == 0
        now[0] += 60_000  # the lease of 2 has ended, and the half's next check is due
        again = [e.message.queue_offset for e in slave.receive(G, T, 8, 30_000)]
        assert 2 in again and 1 not in again
        assert slave.check_transactions() == 1
        _wait(lambda: len(checked) == 2)
        assert checked[1][0] == "slave"
        assert checked[1][1].properties[Prop.TRANSACTION_CHECK_TIMES] == "2"
    finally:
        s_node.stop()
        m_node.stop()
        slave.shutdown()
        master.shutdown()
