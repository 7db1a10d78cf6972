"""The reput service: every commitlog record reaches the consume queues and the index, in
order, exactly once; transactions' half records stay out of the queues; nothing is skipped."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.store.codec import DispatchRequest
from broker.store.commitlog import CommitLog
from broker.store.config import StoreConfig
from broker.store.consume_queue_store import ConsumeQueueStore
from broker.store.dispatcher import ReputService
from broker.store.index_service import IndexService
from broker.store.message import Message, SysFlag
from protocol.props import Prop

T0 = 1_763_790_000_000


class Parts:
    def __init__(self, tmp_path: Path, commitlog_size: int = 4096) -> None:
        self.config = StoreConfig(
            store_dir=tmp_path,
            mapped_file_size_commitlog=commitlog_size,
            mapped_file_size_consume_queue=20 * 8,
            max_hash_slot_num=16,
            max_index_num=64,
            warm_mapped_file=False,
        )
        ticks = itertools.count(T0, 7)
        self.commitlog = CommitLog(self.config, clock=lambda: next(ticks))
        self.commitlog.load()
        self.cqs = ConsumeQueueStore(self.config)
        self.cqs.load()
        self.index = IndexService(self.config, clock=lambda: T0)
        self.index.load(last_exit_ok=True)
        self.reput = ReputService(self.commitlog, [self.cqs, self.index])

    def put(
        self, topic: str, qid: int, body: bytes, keys: str = "", **props: str
    ) -> tuple[int, int]:
        properties = dict(props)
        if keys:
            properties[Prop.KEYS] = keys
        sys_flag = int(properties.pop("sys_flag", "0"))
        result = self.commitlog.append(
            Message(topic, body, queue_id=qid, sys_flag=sys_flag, properties=properties)
        )
        assert result.ok and result.append is not None
        return result.append.wrote_offset, result.append.wrote_bytes

    def close(self) -> None:
        self.cqs.shutdown()
        self.index.shutdown()
        self.commitlog.close()


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[Parts]:
    p = Parts(tmp_path)
    yield p
    p.close()


def test_every_record_reaches_queues_and_index_across_files(parts: Parts, seed: int) -> None:
    rng = random.Random(seed)
    placed: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for i in range(120):
        topic, qid = rng.choice(["a", "b"]), rng.randrange(3)
        where = parts.put(topic, qid, rng.randbytes(rng.randrange(1, 300)), keys=f"k{i} all")
        placed.setdefault((topic, qid), []).append(where)
    assert len(parts.commitlog.queue.mapped_files) > 5  # several roll-overs with blanks
    assert parts.reput.do_reput() == 120
    assert parts.reput.behind() == 0
    assert parts.reput.reput_from_offset == parts.commitlog.get_max_offset()
    for (topic, qid), wheres in placed.items():
        cq = parts.cqs.get(topic, qid)
        assert cq is not None
        assert [(phy, size) for _, phy, size, _ in cq.iter_units(0, 1000)] == wheres
    offsets = {phy: i for i, phy in enumerate(sorted(w[0] for ws in placed.values() for w in ws))}
    for (topic, _), wheres in placed.items():
        for phy, _ in wheres:
            assert list(parts.index.iter_offsets(topic, f"k{offsets[phy]}", 0, 2**62)) == [phy]
    assert parts.reput.do_reput() == 0  # nothing new


def test_half_and_rolled_back_transactions_are_indexed_but_not_queued(parts: Parts) -> None:
    parts.put("t", 0, b"normal", keys="n")
    half = parts.put("t", 0, b"half", keys="h", sys_flag=str(int(SysFlag.TRANSACTION_PREPARED)))
    parts.put("t", 0, b"rolled back", keys="r", sys_flag=str(int(SysFlag.TRANSACTION_ROLLBACK)))
    commit = parts.put("t", 0, b"commit", keys="c", sys_flag=str(int(SysFlag.TRANSACTION_COMMIT)))
    parts.reput.do_reput()
    cq = parts.cqs.get("t", 0)
    assert cq is not None
    assert [u[1] for u in cq.iter_units(0, 10)] == [0, commit[0]]
    assert list(parts.index.iter_offsets("t", "h", 0, 2**62)) == [half[0]]


class Flaky:
    def __init__(self, fail_on: int) -> None:
        self.fail_on = fail_on
        self.seen: list[int] = []

    def dispatch(self, request: DispatchRequest) -> None:
        if request.queue_offset == self.fail_on:
            self.fail_on = -1
            raise OSError("disk hiccup")
        self.seen.append(request.queue_offset)


def test_failing_core_dispatcher_is_retried_without_skipping(parts: Parts) -> None:
    flaky = Flaky(fail_on=3)
    reput = ReputService(parts.commitlog, [parts.cqs, flaky])
    for i in range(6):
        parts.put("t", 0, b"x" * 10, keys=f"k{i}")
    assert reput.do_reput() == 3
    assert reput.behind() > 0
    assert reput.do_reput() == 3
    assert flaky.seen == [0, 1, 2, 3, 4, 5]
    cq = parts.cqs.get("t", 0)
    assert cq is not None and cq.get_max_offset_in_queue() == 6  # re-dispatch: no duplicate


def test_failing_extra_dispatcher_does_not_hold_back(parts: Parts) -> None:
    flaky = Flaky(fail_on=1)
    parts.reput.add_dispatcher(flaky)
    for _ in range(3):
        parts.put("t", 0, b"x")
    assert parts.reput.do_reput() == 3
    assert flaky.seen == [0, 2]


def test_invalid_record_stops_dispatch_there(parts: Parts) -> None:
    wheres = [parts.put("t", 0, b"y" * 50) for _ in range(4)]
    mf = parts.commitlog.queue.mapped_files[0]
    mf.write_at(wheres[2][0] + 4, b"\0\0\0\0")  # break the third record's magic code
    assert parts.reput.do_reput() == 2
    assert parts.reput.reput_from_offset == wheres[2][0]
    assert parts.reput.behind() > 0
    assert parts.reput.do_reput() == 0  # stays there, logs once


def test_reput_from_an_earlier_offset_adds_no_duplicates(parts: Parts) -> None:
    for i in range(10):
        parts.put("t", 0, b"z" * 100, keys=f"k{i}")
    parts.reput.do_reput()
    again = ReputService(parts.commitlog, [parts.cqs, parts.index], reput_from_offset=0)
    assert again.do_reput() == 10
    cq = parts.cqs.get("t", 0)
    assert cq is not None and cq.get_max_offset_in_queue() == 10
    assert list(parts.index.iter_offsets("t", "k3", 0, 2**62)) == [
        u[1] for u in cq.iter_units(3, 1)
    ]


def test_background_thread_and_wait_dispatched(parts: Parts) -> None:
    parts.reput.start()
    try:
        for i in range(50):
            parts.put("t", i % 2, b"w" * 200, keys=f"k{i}")
            if i % 10 == 0:
                assert parts.reput.wait_dispatched(parts.commitlog.get_max_offset(), 10.0)
        assert parts.reput.wait_dispatched(parts.commitlog.get_max_offset(), 10.0)
        assert parts.reput.behind() == 0
    finally:
        parts.reput.shutdown()
    total = sum(cq.get_max_offset_in_queue() for cq in parts.cqs.queues())
    assert total == 50
    assert not parts.reput.wait_dispatched(parts.commitlog.get_max_offset() + 1, 0.01)


def test_a_round_tried_elsewhere_while_one_runs_hands_the_records_to_the_thread(
    parts: Parts,
) -> None:
    """`try_reput` never waits for a running round: it wakes the service thread, which
    dispatches the caller's records in a round of its own."""
    for _ in range(3):
        parts.put("t", 0, b"v")
    assert parts.reput.try_reput() == 3  # no round running: on the caller's thread
    parts.reput.start()
    try:
        with parts.reput._round_lock:  # a round in progress elsewhere
            parts.put("t", 0, b"v")  # (these parts wake nobody on an append)
            assert parts.reput.try_reput() == -1
            assert parts.reput.behind() > 0
        assert parts.reput.wait_dispatched(parts.commitlog.get_max_offset(), 10.0)
    finally:
        parts.reput.shutdown()
    assert [cq.get_max_offset_in_queue() for cq in parts.cqs.queues()] == [4]


def test_shutdown_drains_what_is_left(parts: Parts) -> None:
    for _ in range(5):
        parts.put("t", 0, b"v")
    parts.reput.shutdown()  # never started: the final round still dispatches everything
    assert parts.reput.behind() == 0


def test_concurrent_producers_and_readers_see_only_complete_units(parts: Parts) -> None:
    """Readers racing the dispatcher see every message once, in queue order, never a unit
    pointing at anything but its own record."""
    import threading
    import time

    per_producer = 1500
    parts.reput.start()
    seen: dict[int, list[bytes]] = {0: [], 1: []}
    errors: list[str] = []

    def produce(qid: int) -> None:
        for i in range(per_producer):
            parts.put("t", qid, b"%d:%d" % (qid, i), keys=f"q{qid}-{i}")

    def read() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for qid in (0, 1):
                cq = parts.cqs.get("t", qid)
                if cq is None:
                    continue
                for index, phy, size, _ in cq.iter_units(len(seen[qid]), 64):
                    msg = parts.commitlog.look_message(phy)
                    if (
                        msg is None
                        or msg.queue_offset != index
                        or msg.queue_id != qid
                        or msg.store_size != size
                    ):
                        errors.append(f"unit {qid}/{index} -> {phy}: {msg!r}")
                        return
                    seen[qid].append(msg.body)
            if all(len(v) == per_producer for v in seen.values()):
                break

    threads = [threading.Thread(target=produce, args=(q,)) for q in (0, 1)]
    reader = threading.Thread(target=read)
    reader.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reader.join()
    parts.reput.shutdown()
    assert not errors, errors[:3]
    for qid in (0, 1):
        assert seen[qid] == [b"%d:%d" % (qid, i) for i in range(per_producer)]
