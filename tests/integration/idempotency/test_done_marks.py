"""The Redis done marks, written after the handler's thread has returned: together, only
where the lease is still the confirming worker's, and never needed for exactly once."""

from __future__ import annotations

from typing import Any

from idempotency import EventKind, GuardEvent
from idempotency.done_marks import DoneMarks
from idempotency.leases import Leases
from tests.integration.idempotency.test_guard import (
    GROUP,
    SUCCESS,
    make_guard,
    received,
    rows,
    writer,
)


class CountedPipelines:
    """The real client, counting the pipelines run through it."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.pipelines = 0

    def pipeline(self, transaction: bool = True) -> Any:
        self.pipelines += 1
        return self.client.pipeline(transaction=transaction)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def write_now(marks: DoneMarks) -> None:
    """End the writer's linger now (it may still be on its way to it: asked again until
    every mark is written)."""
    while not marks.flush(0.05):
        with marks._work:
            marks._work.notify()


def test_marks_go_together_and_only_where_the_lease_is_still_ours(redis_client, key_prefix) -> None:
    import redis

    counted = CountedPipelines(redis_client)
    leases = Leases(counted, key_prefix, lease_ms=30_000, ttl_ms=60_000)
    marks = DoneMarks(leases, (redis.RedisError, OSError), linger=60.0)
    ours = [f"{key_prefix}m{i}" for i in range(5)]
    for i, key in enumerate(ours):
        redis_client.set(key, f"L:t{i}")
    taken_over = f"{key_prefix}taken"
    redis_client.set(taken_over, "L:new-holder")
    unleased, occupied = f"{key_prefix}unleased", f"{key_prefix}occupied"
    redis_client.set(occupied, "L:someone")

    for i, key in enumerate(ours):
        marks.add(key, f"t{i}", True)
    marks.add(taken_over, "stale", True)
    marks.add(unleased, "t9", False)
    marks.add(occupied, "t8", False)
    write_now(marks)

    assert [redis_client.get(k) for k in ours] == [f"D:t{i}".encode() for i in range(5)]
    assert 0 < redis_client.pttl(ours[0]) <= 60_000
    assert redis_client.get(taken_over) == b"L:new-holder"  # the new holder's lease stands
    assert redis_client.get(unleased) == b"D:t9"
    assert redis_client.get(occupied) == b"L:someone"
    assert counted.pipelines == 1 and marks.dropped == 0


def test_a_copy_arriving_before_the_mark_is_a_duplicate(
    engine, tables, business, redis_client, key_prefix
) -> None:
    events: list[GuardEvent] = []
    guard = make_guard(engine, tables, redis_client, key_prefix, events)
    assert guard._marks is not None
    guard._marks.linger = 60.0  # the mark is still waiting when the copy comes
    other = make_guard(engine, tables, redis_client, key_prefix, events)
    message = received()
    key = f"{key_prefix}{GROUP}:{message.message_id}"
    runs: list[str] = []

    assert guard.process(message, GROUP, writer(business, runs)) is SUCCESS
    assert redis_client.get(key).startswith(b"L:")  # confirmed; the mark not written yet
    assert other.process(message, GROUP, writer(business, runs)) is SUCCESS
    assert len(runs) == 1 and len(rows(engine, business)) == 1
    assert [e.kind for e in events] == [EventKind.PROCESSED, EventKind.DUPLICATE]
    write_now(guard._marks)
    assert redis_client.get(key).startswith(b"D:")


def test_with_redis_stopped_marks_are_dropped_and_counted(
    engine, tables, business, private_redis, key_prefix
) -> None:
    guard = make_guard(engine, tables, private_redis.client, key_prefix)
    assert guard._marks is not None
    guard._marks.linger = 60.0  # Redis stops before the marks are written
    first, second = received(), received()
    runs: list[str] = []
    assert guard.process(first, GROUP, writer(business, runs)) is SUCCESS
    assert guard.process(second, GROUP, writer(business, runs)) is SUCCESS
    private_redis.stop()
    write_now(guard._marks)
    assert guard._marks.dropped == 2
    # the confirmations still decide: both copies are duplicates, on the database alone
    assert guard.process(first, GROUP, writer(business, runs)) is SUCCESS
    assert guard.process(second, GROUP, writer(business, runs)) is SUCCESS
    assert len(runs) == 2 and len(rows(engine, business)) == 2
