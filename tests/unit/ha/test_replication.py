"""Replication between two stores in one process, over a real loopback socket."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.ha import HaConfig, HaMaster, HaRole, HaSlave
from broker.store.codec import reseal
from broker.store.errors import ReplicaRejected
from broker.store.message import Message
from broker.store.store import MessageStore
from tests.unit.store._helpers import small_config

FILE = 8 * 1024


def _store(path: Path) -> MessageStore:
    store = MessageStore(small_config(path))
    store.start()
    return store


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[MessageStore, MessageStore]]:
    master, slave = _store(tmp_path / "m"), _store(tmp_path / "s")
    yield master, slave
    master.shutdown()
    slave.shutdown()


def _put(store: MessageStore, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        res = store.put_message(
            Message("ha-t", f"body-{i}".encode() * 12, queue_id=i % 3, properties={"KEYS": f"k{i}"})
        )
        assert res.append is not None


def _log_bytes(store: MessageStore) -> bytes:
    cl = store.commitlog
    low, high = cl.get_min_offset(), cl.get_max_offset()
    out = bytearray()
    at = low
    while at < high:
        n = min(FILE - at % FILE, high - at)
        chunk = cl.get_message(at, n)
        assert chunk is not None
        out += chunk
        at += n
    return bytes(out)


def _wait(cond: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_slave_catches_up_byte_for_byte_and_builds_its_queues(
    pair: tuple[MessageStore, MessageStore],
) -> None:
    master, slave = pair
    _put(master, 100)  # several commitlog files, with blank records at their ends
    assert master.commitlog.get_max_offset() > 2 * FILE
    ha = HaMaster(master, HaConfig(HaRole.SYNC_MASTER, port=0))
    ha.start()
    client = HaSlave(slave, HaConfig(HaRole.SLAVE, broker_id=1, master=("127.0.0.1", ha.port)))
    client.start()
    try:
        _put(master, 200, start=100)  # while streaming
        end = master.commitlog.get_max_offset()
        _wait(lambda: ha.acked_offset() == end)
        assert slave.commitlog.get_max_offset() == end
        assert _log_bytes(slave) == _log_bytes(master)
        slave.wait_dispatched()
        for q in range(3):
            assert slave.get_max_offset_in_queue("ha-t", q) == master.get_max_offset_in_queue(
                "ha-t", q
            )
        found = slave.query_message_by_key("ha-t", "k217")
        assert [m.body for m in found] == [b"body-217" * 12]
        assert ha.wait_acked(end, 0.1)
        assert not ha.wait_acked(end + 1, 0.1)
        [state] = ha.slaves()
        assert state.acked_offset == end and state.start_offset == 0
    finally:
        client.stop()
        ha.stop()


def test_a_restarted_slave_resumes_from_its_own_end(tmp_path: Path) -> None:
    master = _store(tmp_path / "m")
    slave = _store(tmp_path / "s")
    ha = HaMaster(master, HaConfig(HaRole.ASYNC_MASTER, port=0))
    ha.start()
    cfg = HaConfig(HaRole.SLAVE, broker_id=1, master=("127.0.0.1", ha.port), reconnect_ms=100)
    try:
        _put(master, 50)
        client = HaSlave(slave, cfg)
        client.start()
        _wait(lambda: slave.commitlog.get_max_offset() == master.commitlog.get_max_offset())
        client.stop()
        slave.shutdown()
        _put(master, 150, start=50)
        slave = _store(tmp_path / "s")
        client = HaSlave(slave, cfg)
        client.start()
        end = master.commitlog.get_max_offset()
        _wait(lambda: ha.acked_offset() == end)
        assert [s.start_offset for s in ha.slaves()] != [0]
        assert _log_bytes(slave) == _log_bytes(master)
        client.stop()
    finally:
        ha.stop()
        master.shutdown()
        slave.shutdown()


def test_append_raw_refuses_damaged_or_misplaced_records(
    pair: tuple[MessageStore, MessageStore],
) -> None:
    master, slave = pair
    _put(master, 3)
    data = bytearray(master.read_replica(0, 1 << 20))
    assert len(data) == master.commitlog.get_max_offset()
    size = int.from_bytes(data[:4], "big")
    with pytest.raises(ReplicaRejected, match="ends at 0"):
        slave.append_replica(size, data[size:])  # not at the slave's end
    with pytest.raises(ReplicaRejected, match="cut short"):
        slave.append_replica(0, data[:-1])
    bad = bytearray(data)
    bad[size + 100] ^= 0xFF  # a body byte of the second record
    with pytest.raises(ReplicaRejected, match=f"at commitlog offset {size}"):
        slave.append_replica(0, bad)
    resealed = bytearray(data)
    resealed[size + 28 : size + 36] = (size + 1).to_bytes(8, "big")  # PHYSICALOFFSET moved
    reseal(resealed, size)
    with pytest.raises(ReplicaRejected):
        slave.append_replica(0, resealed)
    assert slave.commitlog.get_max_offset() == 0  # nothing written by any refusal
    assert slave.append_replica(0, data) == len(data)
    assert _log_bytes(slave) == _log_bytes(master)
    assert slave.commitlog.topic_queue_table == master.commitlog.topic_queue_table


def test_a_slave_ahead_of_its_master_is_refused(pair: tuple[MessageStore, MessageStore]) -> None:
    master, slave = pair
    _put(slave, 5)  # records the master never had
    ha = HaMaster(master, HaConfig(HaRole.ASYNC_MASTER, port=0))
    ha.start()
    client = HaSlave(
        slave, HaConfig(HaRole.SLAVE, broker_id=1, master=("127.0.0.1", ha.port), reconnect_ms=100)
    )
    client.start()
    try:
        time.sleep(0.5)
        assert ha.slaves() == []
        assert ha.acked_offset() == -1
    finally:
        client.stop()
        ha.stop()


def test_sync_waits_end_acked_unavailable_or_timed_out(
    pair: tuple[MessageStore, MessageStore],
) -> None:
    import socket

    from broker.errors import ResponseCode
    from broker.ha import AckOutcome
    from broker.ha.errors import NotReplicated
    from broker.ha.protocol import pack_hello

    master, slave = pair
    ha = HaMaster(master, HaConfig(HaRole.SYNC_MASTER, port=0, sync_timeout_ms=300))
    ha.start()
    got: list[object] = []
    try:
        ha.when_acked(0, 1000, got.append)  # nobody connected: at once
        assert got == [AckOutcome.SLAVE_NOT_AVAILABLE]
        errors: list[BaseException | None] = []
        ha.when_replicated(0, errors.append)
        assert isinstance(errors[0], NotReplicated)
        assert errors[0].code is ResponseCode.SLAVE_NOT_AVAILABLE
        # a slave that connects and never reports: the wait times out
        with socket.create_connection(("127.0.0.1", ha.port)) as mute:
            mute.sendall(pack_hello(0))
            _wait(lambda: len(ha.slaves()) == 1)
            _put(master, 3)
            end = master.commitlog.get_max_offset()
            started = time.monotonic()
            ha.when_replicated(end, errors.append)
            _wait(lambda: len(errors) == 2)
            assert 0.25 < time.monotonic() - started < 2.0
            assert isinstance(errors[1], NotReplicated)
            assert errors[1].code is ResponseCode.FLUSH_SLAVE_TIMEOUT
        # a real slave: the wait ends when it has the bytes
        _wait(lambda: ha.slaves() == [])  # the mute one is gone
        client = HaSlave(slave, HaConfig(HaRole.SLAVE, broker_id=1, master=("127.0.0.1", ha.port)))
        client.start()
        try:
            _wait(lambda: len(ha.slaves()) == 1)
            _put(master, 3, start=3)
            end = master.commitlog.get_max_offset()
            ha.when_replicated(end, errors.append)
            _wait(lambda: len(errors) == 3)
            assert errors[2] is None
            assert slave.commitlog.get_max_offset() >= end
        finally:
            client.stop()
    finally:
        ha.stop()


def test_only_a_slave_takes_a_masters_configuration(tmp_path: Path) -> None:
    from broker.broker import Broker
    from broker.config import BrokerConfig
    from broker.errors import InvalidArgument

    master = Broker(small_config(tmp_path / "m"), BrokerConfig())
    slave = Broker(small_config(tmp_path / "s"), BrokerConfig(replica=True))
    master.start()
    slave.start()
    try:
        master.create_topic("t-conf", queues=2)
        master.create_group("g-conf", retry_max_times=3)
        master.commit_offset("g-conf", "t-conf", 1, 7)
        snapshot = master.config_snapshot()
        with pytest.raises(InvalidArgument):
            master.apply_config_snapshot(snapshot)
        slave.apply_config_snapshot(snapshot)
        topic = slave.get_topic("t-conf")
        assert topic is not None and topic.read_queue_nums == 2
        group = slave.get_group("g-conf")
        assert group is not None and group.retry_max_times == 3
        assert slave.offsets_of("g-conf", "t-conf") == {1: 7}
    finally:
        master.shutdown()
        slave.shutdown()


def test_refusals_that_cannot_pass_are_dialled_slowly_others_with_a_backoff(
    pair: tuple[MessageStore, MessageStore],
) -> None:
    from broker.ha.slave import REFUSED_BACKOFF

    assert [REFUSED_BACKOFF.delay(n) for n in range(8)] == [
        0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0
    ]  # fmt: skip
    master, slave = pair
    ha = HaMaster(master, HaConfig(HaRole.ASYNC_MASTER, port=0, broker_name="a"))
    ha.start()
    client = HaSlave(
        slave,
        HaConfig(
            HaRole.SLAVE,
            broker_id=1,
            broker_name="b",
            master=("127.0.0.1", ha.port),
            reconnect_ms=50,
        ),
    )
    client.start()
    try:
        _wait(lambda: ha.refusals.count >= 1)
        time.sleep(1.0)  # a wrong group does not pass by itself: no redial every 50 ms
        assert ha.refusals.count == 1
        assert "broker group" in client.status()["refused"]
    finally:
        client.stop()
        ha.stop()
