"""Rebalance strategies and process queues: pure parts of the consumer."""

from __future__ import annotations

import pytest

from reliable.consumer.process_queue import ProcessQueue
from reliable.consumer.rebalance import (
    ConsistentHashAllocator,
    allocate_averagely,
    allocate_by_circle,
)
from reliable.message import ReceivedMessage
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
