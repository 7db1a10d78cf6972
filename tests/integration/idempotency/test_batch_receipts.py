"""`IdempotencyGuard.prepare`: a received batch's leases and receipts taken together
(PostgreSQL: one statement; elsewhere one transaction), then each message processed from
them; the guarantees of `process` alone. On every database and driver."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import sqlalchemy as sa

from idempotency import EventKind, GuardEvent, IdempotencyGuard
from outbox import OutboxTables, StubStatus
from reliable import ReceivedMessage
from tests.integration.idempotency.test_guard import (
    GROUP,
    LATER,
    SUCCESS,
    HeldInHandler,
    make_guard,
    published,
    received,
    rows,
    writer,
)


def receipts_counted(guard: IdempotencyGuard) -> list[str]:
    """Every per-message receipt `process` writes from now on (one id each)."""
    calls: list[str] = []
    receive = guard.store.receive

    def counting(message: ReceivedMessage, *args: object, **kw: object):  # type: ignore[no-untyped-def]
        calls.append(message.message_id)
        return receive(message, *args, **kw)  # type: ignore[arg-type]

    guard.store.receive = counting  # type: ignore[method-assign]
    return calls


def log_rows(engine: sa.Engine, tables: OutboxTables) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(sa.select(sa.func.count()).select_from(tables.consumption_log)).scalar()
        )


def test_a_prepared_batch_is_processed_once_each_without_a_receipt_a_message(
    engine, tables, business, redis_client, key_prefix
) -> None:
    events: list[GuardEvent] = []
    guard = make_guard(engine, tables, redis_client, key_prefix, events)
    stubbed = published(engine, tables, [GROUP])
    batch = [received(stubbed), received(), received(), received()]
    guard.prepare(batch, GROUP)
    # the batch's receipts are written, each carrying its lease, before any handler runs
    assert log_rows(engine, tables) == 4
    per_message = receipts_counted(guard)
    runs: list[str] = []
    for m in batch:
        assert guard.process(m, GROUP, writer(business, runs)) is SUCCESS
    assert per_message == [] and len(runs) == 4 and len(rows(engine, business)) == 4
    assert [e.kind for e in events] == [EventKind.PROCESSED] * 4
    assert log_rows(engine, tables) == 0
    with engine.connect() as conn:
        assert conn.execute(sa.select(tables.stub.c.status)).scalar() == StubStatus.CONFIRMED.value
    # delivered again in a batch: duplicates, the handler never runs
    guard.prepare(batch, GROUP)
    for m in batch:
        assert guard.process(m, GROUP, writer(business, runs)) is SUCCESS
    assert len(runs) == 4 and per_message == []
    assert [e.kind for e in events[4:]] == [EventKind.DUPLICATE] * 4
    assert log_rows(engine, tables) == 0


def test_a_batch_message_held_by_another_worker_is_left_to_it(
    engine, tables, business, redis_client, key_prefix
) -> None:
    guard = make_guard(engine, tables, redis_client, key_prefix)
    other = make_guard(engine, tables, redis_client, key_prefix)
    busy, free = received(), received()
    runs: list[str] = []
    held = HeldInHandler(other, busy, business, runs)  # in its handler, both leases held
    guard.prepare([busy, free], GROUP)
    assert guard.process(busy, GROUP, writer(business, runs)) is LATER
    assert guard.process(free, GROUP, writer(business, runs)) is SUCCESS
    held.finish()
    held.join()
    assert held.result == [SUCCESS]
    assert len(runs) == 2 and len(rows(engine, business)) == 2


def test_a_message_started_after_half_a_lease_takes_its_lease_again(
    engine, tables, business, redis_client, key_prefix
) -> None:
    lease = timedelta(milliseconds=400)
    guard = make_guard(engine, tables, redis_client, key_prefix, lease=lease)
    late, other = received(), received()
    guard.prepare([late, other], GROUP)
    per_message = receipts_counted(guard)
    time.sleep(lease.total_seconds() / 2 + 0.05)
    runs: list[str] = []
    assert guard.process(late, GROUP, writer(business, runs)) is SUCCESS
    # the prepared lease was released and taken again through the one-message path
    assert per_message == [late.message_id]
    assert guard.process(other, GROUP, writer(business, runs)) is SUCCESS
    assert len(runs) == 2 and len(rows(engine, business)) == 2


def test_two_consumers_preparing_the_same_batch_run_each_handler_once(
    engine, tables, business, redis_client, key_prefix
) -> None:
    guards = [make_guard(engine, tables, redis_client, key_prefix) for _ in range(2)]
    batch = [received() for _ in range(8)]
    runs: list[str] = []
    results: list[list[object]] = [[], []]

    def consume(k: int) -> None:
        guards[k].prepare(batch, GROUP)
        for m in batch:
            results[k].append(guards[k].process(m, GROUP, writer(business, runs)))

    threads = [threading.Thread(target=consume, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # each message ran once; the loser of each race was told to come back later
    assert len(runs) == 8 and len(rows(engine, business)) == 8
    for m in batch:  # redelivered later to either: a duplicate
        assert guards[1].process(m, GROUP, writer(business, runs)) is SUCCESS
    assert len(runs) == 8


def test_with_redis_stopped_a_batch_falls_back_to_the_database(
    engine, tables, business, private_redis, key_prefix
) -> None:
    events: list[GuardEvent] = []
    guard = make_guard(engine, tables, private_redis.client, key_prefix, events)
    private_redis.stop()
    batch = [received() for _ in range(3)]
    guard.prepare(batch, GROUP)
    per_message = receipts_counted(guard)
    runs: list[str] = []
    for m in batch:
        assert guard.process(m, GROUP, writer(business, runs)) is SUCCESS
    assert per_message == [] and len(runs) == 3
    assert guard.stats[EventKind.REDIS_UNAVAILABLE] == 3
    # without Redis the database lease still stops a second worker on a prepared message
    racing = received()
    guard.prepare([racing, received()], GROUP)
    other = make_guard(engine, tables, private_redis.client, key_prefix)
    assert other.process(racing, GROUP, writer(business, runs)) is LATER
    assert guard.process(racing, GROUP, writer(business, runs)) is SUCCESS
    assert len(runs) == 4
