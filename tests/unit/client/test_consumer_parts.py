"""Rebalance strategies and process queues: pure parts of the consumer."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from reliable.consumer.concurrent import ConcurrentConsumeService
from reliable.consumer.offset_store import OffsetStore
from reliable.consumer.process_queue import ProcessQueue
from reliable.consumer.rebalance import (
    ConsistentHashAllocator,
    allocate_averagely,
    allocate_by_circle,
)
from reliable.consumer.settings import ConsumerSettings
from reliable.message import ConsumeResult, ReceivedMessage
from reliable.transport.base import QueueRef

QUEUES = [QueueRef("t", "b", i) for i in range(8)]


@pytest.mark.parametrize(
    "strategy", [allocate_averagely, allocate_by_circle, ConsistentHashAllocator(10)]
)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 11])
def test_every_queue_goes_to_exactly_one_consumer(strategy, n) -> None:  # type: ignore[no-untyped-def]
    cids = [f"c{i}" for i in range(n)]
    owned = [q for c in cids for q in strategy(c, QUEUES, list(reversed(cids)))]
    assert sorted(owned) == sorted(QUEUES)


def test_averaging_gives_contiguous_blocks_larger_first() -> None:
    cids = ["a", "b", "c"]
    assert [[q.queue_id for q in allocate_averagely(c, QUEUES, cids)] for c in cids] == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7],
    ]
    assert allocate_averagely("z", QUEUES, cids) == []


def test_consistent_hash_moves_only_the_leavers_queues() -> None:
    alloc = ConsistentHashAllocator(10)
    before = {c: set(alloc(c, QUEUES, ["a", "b", "c"])) for c in "abc"}
    after = {c: set(alloc(c, QUEUES, ["a", "b"])) for c in "ab"}
    for c in "ab":
        assert before[c] <= after[c]  # nobody loses a queue when another leaves
    assert after["a"] | after["b"] == set(QUEUES)


def _m(offset: int, group: str | None = None) -> ReceivedMessage:
    return ReceivedMessage(
        message_id=f"m{offset}",
        topic="t",
        body=b"x",
        queue_id=0,
        queue_offset=offset,
        message_group=group,
    )


def test_commit_offset_is_the_smallest_in_flight() -> None:
    pq = ProcessQueue()
    msgs = [_m(o) for o in range(10, 15)]
    pq.put(msgs)
    assert pq.commit_offset() == 10
    assert pq.remove([msgs[1], msgs[2]]) == 10  # 10 is still in flight: hold the commit
    assert pq.remove([msgs[0]]) == 13
    assert pq.remove([msgs[4]]) == 13
    assert pq.remove([msgs[3]]) == 15  # empty: one past the largest seen
    assert pq.cached_count == 0


def test_duplicate_pulls_are_cached_once() -> None:
    pq = ProcessQueue()
    assert pq.put([_m(1), _m(2)]) == 2
    assert pq.put([_m(2), _m(3)]) == 1
    assert pq.cached_count == 3


def test_orderly_take_put_back_and_commit() -> None:
    pq = ProcessQueue()
    pq.put([_m(o) for o in range(5)])
    first = pq.take(2)
    assert [m.queue_offset for m in first] == [0, 1]
    assert pq.commit_offset() == 0
    pq.put_back(first)
    again = pq.take(3)
    assert [m.queue_offset for m in again] == [0, 1, 2]
    assert pq.commit_taken() == 3
    pq.discard_taken(pq.take(1))
    assert pq.commit_offset() == 4


# --- offsets of a queue rebalanced away


def _drop(pq: ProcessQueue, store: OffsetStore, q: QueueRef) -> None:
    """What the pull engine does when a rebalance takes a queue away."""
    pq.dropped = True
    store.remove(q)


def test_a_dropped_queue_gets_no_offset_back() -> None:
    """A consume that finishes as its queue is dropped must not put back the entry the
    drop removed: the consumer would commit it on every persist for a queue it no longer
    owns, behind the new owner's progress, and resume from it if the queue came back."""
    store, pq, q = OffsetStore(), ProcessQueue(), QUEUES[0]
    store.update(q, 5, of=pq)
    assert store.get(q) == 5
    _drop(pq, store, q)
    store.update(q, 9, of=pq)  # the late consume
    assert store.get(q) == -1
    assert store.snapshot() == {}
    store.update(q, 9)  # no process queue named: recorded (a start offset)
    assert store.get(q) == 9


def test_a_consume_finishing_after_its_queue_was_dropped_commits_nothing() -> None:
    store, pq, q = OffsetStore(), ProcessQueue(), QUEUES[1]
    msgs = [_m(o) for o in range(3)]
    pq.put(msgs)
    store.update(q, 0, of=pq)
    listening = threading.Event()
    go_on = threading.Event()

    def listener(batch: Any, ctx: Any) -> ConsumeResult:
        listening.set()
        assert go_on.wait(5)
        return ConsumeResult.SUCCESS

    service = ConcurrentConsumeService(
        None,  # type: ignore[arg-type]  # a success sends nothing back
        "g",
        listener,
        ConsumerSettings(consume_batch_size=3),
        store,
        None,  # type: ignore[arg-type]  # _consume is called directly
        threading.Event(),
    )
    worker = threading.Thread(target=service._consume, args=(pq, q, msgs))
    worker.start()
    assert listening.wait(5)
    _drop(pq, store, q)  # rebalanced away while the listener runs
    go_on.set()
    worker.join(5)
    assert not worker.is_alive()
    assert store.snapshot() == {}
