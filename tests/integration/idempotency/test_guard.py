"""The idempotency guard against the real Redis and real databases (docs/outbox.md)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from idempotency import (
    BodyMismatch,
    DedupWindowTooShort,
    EventKind,
    GuardConfig,
    GuardEvent,
    IdempotencyGuard,
    InvalidGuardConfig,
    MismatchPolicy,
)
from outbox import Outbox, OutboxTables, StubStatus, declare_groups
from reliable import ConsumeResult, Message, ReceivedMessage, SendReceipt
from reliable.outcomes import Discard, RetryLater

SUCCESS, LATER = ConsumeResult.SUCCESS, ConsumeResult.RECONSUME_LATER
GROUP = "inventory"


def received(mid: str | None = None, body: bytes = b'{"order": 1}') -> ReceivedMessage:
    return ReceivedMessage(
        message_id=mid or uuid.uuid4().hex.upper(),
        topic="OrderCreated",
        body=body,
        queue_id=0,
        queue_offset=7,
    )


def make_guard(engine, tables, redis_client, key_prefix, events=None, **cfg):  # type: ignore[no-untyped-def]
    config = GuardConfig(key_prefix=key_prefix, **cfg)
    return IdempotencyGuard(
        engine,
        tables,
        redis_client,
        config=config,
        on_event=events.append if events is not None else None,
    )


def writer(business: sa.Table, runs: list[str]) -> Callable[..., object]:
    """A handler writing one business row per run, through the guard's session."""

    def invoke(*, session: Session) -> None:
        run = uuid.uuid4().hex
        runs.append(run)
        session.execute(sa.insert(business).values(run=run, message_id="m"))

    return invoke


class HeldInHandler:
    """`guard.process(message)` in a thread of its own, stopped inside the handler (the message
    is in progress) until `finish()`; the handler then writes one business row like `writer`."""

    def __init__(
        self, guard: IdempotencyGuard, message: ReceivedMessage, business: sa.Table, runs: list[str]
    ) -> None:
        self.result: list[ConsumeResult] = []
        inside, self._finish = threading.Event(), threading.Event()

        def slow(*, session: Session) -> None:
            inside.set()
            assert self._finish.wait(30)
            writer(business, runs)(session=session)

        self._thread = threading.Thread(
            target=lambda: self.result.append(guard.process(message, GROUP, slow))
        )
        self._thread.start()
        assert inside.wait(30)

    def finish(self) -> None:
        self._finish.set()

    def join(self) -> None:
        self._thread.join(30)


def rows(engine: sa.Engine, table: sa.Table) -> list[sa.Row]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(table)))


class Direct:
    """A sender whose every send is acknowledged at once."""

    def send(self, message: Message) -> SendReceipt:
        return SendReceipt(message.message_id, message.topic, 0, 7)


def published(engine: sa.Engine, tables: OutboxTables, groups: list[str]) -> str:
    """The id of an outbox message on "OrderCreated", its stub committed expecting
    `groups` and its send acknowledged."""
    declare_groups(engine, tables, "OrderCreated", groups)
    with Session(engine) as session, session.begin():
        return Outbox(tables, Direct()).publish(
            session, Message(topic="OrderCreated", body=b'{"order": 1}')
        )


def test_duplicate_delivery_runs_the_handler_once_and_confirms_the_stub(
    engine, tables, business, redis_client, key_prefix
) -> None:
    mid = published(engine, tables, [GROUP])
    events: list[GuardEvent] = []
    guard = make_guard(engine, tables, redis_client, key_prefix, events)
    runs: list[str] = []
    message = received(mid)
    assert guard.process(message, GROUP, writer(business, runs)) is SUCCESS
    assert guard.process(message, GROUP, writer(business, runs)) is SUCCESS
    assert len(runs) == 1 and len(rows(engine, business)) == 1
    assert [e.kind for e in events] == [EventKind.PROCESSED, EventKind.DUPLICATE]
    with engine.connect() as conn:
        conf = conn.execute(sa.select(tables.confirmation)).mappings().one()
        assert (conf["message_id"], conf["consumer_group"], conf["outcome"]) == (
            mid,
            GROUP,
            "SUCCESS",
        )
        assert (
            conn.execute(sa.select(sa.func.count()).select_from(tables.consumption_log)).scalar()
            == 0
        )
        assert conn.execute(sa.select(tables.stub.c.status)).scalar() == StubStatus.CONFIRMED.value
    assert guard.flush(5)  # the done mark is written off the handler's thread
    assert redis_client.get(f"{key_prefix}{GROUP}:{mid}").startswith(b"D:")


def test_two_consumers_racing_on_one_message_run_the_handler_once(
    engine, tables, business, redis_client, key_prefix
) -> None:
    guard = make_guard(engine, tables, redis_client, key_prefix)
    message = received()
    runs: list[str] = []
    first = HeldInHandler(guard, message, business, runs)
    # the second consumer sees it in progress: RECONSUME_LATER (the seed acked here)
    assert guard.process(message, GROUP, writer(business, runs)) is LATER
    first.finish()
    first.join()
    assert first.result == [SUCCESS]
    assert guard.process(message, GROUP, writer(business, runs)) is SUCCESS
    assert len(runs) == 1 and len(rows(engine, business)) == 1


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_many_threads_racing_process_exactly_once(
    engine, tables, business, redis_client, key_prefix
) -> None:
    messages = [received() for _ in range(5)]
    runs: list[str] = []
    barrier = threading.Barrier(4)

    def consumer() -> None:
        guard = make_guard(engine, tables, redis_client, key_prefix)
        barrier.wait()
        pending = list(messages)
        for _ in range(200):
            pending = [
                m for m in pending if guard.process(m, GROUP, writer(business, runs)) is not SUCCESS
            ]
            if not pending:
                return
        raise AssertionError(f"never processed: {pending}")

    threads = [threading.Thread(target=consumer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(runs) == 5 and len(rows(engine, business)) == 5


def test_redis_flushed_mid_flow_still_runs_the_handler_once(
    engine, tables, business, private_redis, key_prefix
) -> None:
    guard = make_guard(engine, tables, private_redis.client, key_prefix)
    message = received()
    runs: list[str] = []

    racing: list[ConsumeResult] = []

    def flushing(*, session: Session) -> None:
        private_redis.client.flushall()  # the lease vanishes while the handler runs
        # a redelivery now takes the Redis key, but the database lease still stops it
        racing.append(guard.process(message, GROUP, writer(business, runs)))
        writer(business, runs)(session=session)

    assert guard.process(message, GROUP, flushing) is SUCCESS
    assert racing == [LATER]
    assert guard.process(message, GROUP, writer(business, runs)) is SUCCESS
    private_redis.client.flushall()  # and the done marker vanishes after it
    assert guard.process(message, GROUP, writer(business, runs)) is SUCCESS
    assert len(runs) == 1 and len(rows(engine, business)) == 1


def test_redis_stopped_falls_back_to_the_database_without_error(
    engine, tables, business, private_redis, key_prefix
) -> None:
    events: list[GuardEvent] = []
    guard = make_guard(engine, tables, private_redis.client, key_prefix, events)
    before, during = received(), received()
    runs: list[str] = []
    assert guard.process(before, GROUP, writer(business, runs)) is SUCCESS
    private_redis.stop()
    assert guard.process(before, GROUP, writer(business, runs)) is SUCCESS  # duplicate
    assert guard.process(during, GROUP, writer(business, runs)) is SUCCESS
    assert guard.process(during, GROUP, writer(business, runs)) is SUCCESS  # duplicate
    assert len(runs) == 2 and len(rows(engine, business)) == 2
    assert guard.stats[EventKind.REDIS_UNAVAILABLE] == 3
    # without Redis, the database lease still tells "in progress" to a racing consumer
    racing = received()
    held = HeldInHandler(guard, racing, business, runs)
    assert guard.process(racing, GROUP, writer(business, runs)) is LATER
    held.finish()
    held.join()
    assert guard.process(racing, GROUP, writer(business, runs)) is SUCCESS
    assert len(runs) == 3


def test_expired_lease_cannot_confirm_over_the_worker_that_took_over(
    engine, tables, business, redis_client, key_prefix
) -> None:
    lease = timedelta(milliseconds=300)
    # a stalled process does not renew (renew_lease=False stands for that stall)
    slow_guard = make_guard(
        engine, tables, redis_client, key_prefix, lease=lease, renew_lease=False
    )
    fast_events: list[GuardEvent] = []
    # the worker that takes over keeps its own lease long: its done mark, written after its
    # commit, must find its lease still there on a loaded machine (with 300 ms it ran out
    # first once, and the mark rightly left the key alone)
    fast_guard = make_guard(
        engine, tables, redis_client, key_prefix, fast_events, lease=timedelta(seconds=30)
    )
    message = received()
    key = f"{key_prefix}{GROUP}:{message.message_id}"
    slow_runs: list[str] = []
    fast_runs: list[str] = []
    # stalls past its lease (before writing: SQLite has one writer)
    stalled = HeldInHandler(slow_guard, message, business, slow_runs)
    for _ in range(300):  # the lease expires (real Redis PX): poll, with a deadline
        if redis_client.get(key) is None:
            break
        threading.Event().wait(0.02)
    else:
        raise AssertionError("lease never expired")
    taken = LATER
    for _ in range(100):  # the DB lease ends with the same deadline
        taken = fast_guard.process(message, GROUP, writer(business, fast_runs))
        if taken is SUCCESS:
            break
        threading.Event().wait(0.02)
    assert taken is SUCCESS and len(fast_runs) == 1
    stalled.finish()
    stalled.join()
    assert stalled.result == [LATER]  # fenced: its writes rolled back, nothing confirmed
    assert slow_guard.stats[EventKind.FENCED] == 1
    assert [r.run for r in rows(engine, business)] == fast_runs
    with engine.connect() as conn:
        token = conn.execute(sa.select(tables.confirmation.c.fencing_token)).scalar_one()
    assert fast_guard.flush(5) and slow_guard.flush(5)
    assert redis_client.get(key) == f"D:{token}".encode()  # the stale worker did not touch it


def test_handler_failure_propagates_releases_and_allows_a_retry(
    engine, tables, business, redis_client, key_prefix
) -> None:
    guard = make_guard(engine, tables, redis_client, key_prefix)
    message = received()
    runs: list[str] = []

    class Boom(Exception):
        pass

    def failing(*, session: Session) -> None:
        writer(business, runs)(session=session)
        raise Boom("stock service down")

    with pytest.raises(Boom):
        guard.process(message, GROUP, failing)
    with pytest.raises(RetryLater):
        guard.process(message, GROUP, lambda **_: (_ for _ in ()).throw(RetryLater(delay_level=5)))
    assert rows(engine, business) == []  # rolled back
    assert redis_client.get(f"{key_prefix}{GROUP}:{message.message_id}") is None
    with engine.connect() as conn:
        log_row = conn.execute(sa.select(tables.consumption_log)).mappings().one()
    assert log_row["lease_token"] is None  # released; the row stays: received, not done
    assert guard.process(message, GROUP, writer(business, runs)) is SUCCESS
    assert len(rows(engine, business)) == 1


def test_discard_is_recorded_as_done_and_reraised(
    engine, tables, business, redis_client, key_prefix
) -> None:
    guard = make_guard(engine, tables, redis_client, key_prefix)
    message = received()
    runs: list[str] = []

    def discarding(*, session: Session) -> None:
        writer(business, runs)(session=session)
        raise Discard("order cancelled")

    with pytest.raises(Discard):
        guard.process(message, GROUP, discarding)
    assert guard.process(message, GROUP, writer(business, runs)) is SUCCESS  # duplicate
    assert len(runs) == 1 and rows(engine, business) == []
    with engine.connect() as conn:
        assert conn.execute(sa.select(tables.confirmation.c.outcome)).scalar() == "DISCARDED"
    assert guard.consume(received(), GROUP, lambda m: (_ for _ in ()).throw(Discard())) is SUCCESS


def test_same_id_with_another_body_is_reported_not_processed(
    engine, tables, business, redis_client, key_prefix
) -> None:
    events: list[GuardEvent] = []
    guard = make_guard(engine, tables, redis_client, key_prefix, events)
    runs: list[str] = []
    message = received(body=b"original")
    assert guard.process(message, GROUP, writer(business, runs)) is SUCCESS
    forged = received(message.message_id, body=b"something else")
    with pytest.raises(BodyMismatch) as info:
        guard.process(forged, GROUP, writer(business, runs))
    assert info.value.message_id == message.message_id and info.value.source == "confirmation"
    assert events[-1].kind is EventKind.BODY_MISMATCH
    lenient = make_guard(
        engine, tables, redis_client, key_prefix, on_body_mismatch=MismatchPolicy.ACKNOWLEDGE
    )
    assert lenient.process(forged, GROUP, writer(business, runs)) is SUCCESS
    assert len(runs) == 1


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_database_down_never_acknowledges(
    tables, business, redis_client, key_prefix, engine
) -> None:
    dead = sa.create_engine(
        "postgresql+psycopg2://postgres@127.0.0.1:1/test", connect_args={"connect_timeout": 2}
    )
    guard = IdempotencyGuard(dead, tables, redis_client, config=GuardConfig(key_prefix=key_prefix))
    runs: list[str] = []
    message = received()
    assert guard.process(message, GROUP, writer(business, runs)) is LATER
    assert runs == [] and guard.stats[EventKind.DB_UNAVAILABLE] == 1
    assert guard.consume(message, GROUP, lambda m: runs.append("x")) is LATER
    assert runs == []


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_database_connection_killed_before_commit_is_retried_not_acknowledged(
    engine, tables, business, redis_client, key_prefix
) -> None:
    guard = make_guard(engine, tables, redis_client, key_prefix)
    message = received()
    runs: list[str] = []

    def killed(*, session: Session) -> None:
        writer(business, runs)(session=session)
        pid = session.execute(sa.text("select pg_backend_pid()")).scalar()
        with engine.connect() as admin:  # the server ends this backend, as a crash would
            admin.execute(sa.text("select pg_terminate_backend(:p)"), {"p": pid})
            admin.commit()

    assert guard.process(message, GROUP, killed) is LATER
    assert rows(engine, business) == []
    assert guard.process(message, GROUP, writer(business, runs)) is SUCCESS
    assert len(rows(engine, business)) == 1


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_waiting_for_the_result_returns_the_other_workers_success(
    engine, tables, business, redis_client, key_prefix
) -> None:
    guard = make_guard(
        engine,
        tables,
        redis_client,
        key_prefix,
        wait_for_result=timedelta(seconds=30),
        poll_interval=timedelta(milliseconds=20),
    )
    message = received()
    runs: list[str] = []
    held = HeldInHandler(guard, message, business, runs)
    threading.Timer(0.2, held.finish).start()
    assert guard.process(message, GROUP, writer(business, runs)) is SUCCESS
    held.join()
    assert len(runs) == 1


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_start_up_refuses_a_dedup_window_shorter_than_the_retry_horizon(
    engine, tables, redis_client
) -> None:
    with pytest.raises(DedupWindowTooShort) as info:
        IdempotencyGuard(engine, tables, redis_client, config=GuardConfig(ttl=timedelta(hours=4)))
    assert info.value.setting == "Redis ttl"
    assert info.value.required == timedelta(hours=72, minutes=285, seconds=40)
    with pytest.raises(DedupWindowTooShort):
        IdempotencyGuard(
            engine, tables, redis_client, config=GuardConfig(db_retention=timedelta(days=1))
        )
    IdempotencyGuard(
        engine,
        tables,
        redis_client,
        config=GuardConfig(ttl=timedelta(hours=1), allow_short_window=True),
    )
    for bad in (
        GuardConfig(lease=timedelta(0)),
        GuardConfig(key_prefix=""),
        GuardConfig(poll_interval=timedelta(seconds=-1)),
    ):
        with pytest.raises(InvalidGuardConfig):
            IdempotencyGuard(engine, tables, redis_client, config=bad)


def test_standalone_consume_passes_the_session_when_asked(
    engine, tables, business, redis_client, key_prefix
) -> None:
    guard = make_guard(engine, tables, redis_client, key_prefix)
    seen: list[str] = []

    def handler(message: ReceivedMessage, session: Session) -> None:
        seen.append(message.message_id)
        session.execute(
            sa.insert(business).values(run=uuid.uuid4().hex, message_id=message.message_id)
        )

    listener = guard.listener(GROUP, handler)
    message = received()
    assert listener(message) is SUCCESS and listener(message) is SUCCESS
    assert guard.consume(received(), GROUP, lambda m: 1 / 0) is LATER
    assert seen == [message.message_id] and len(rows(engine, business)) == 1


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_purge_applies_the_db_retention(engine, tables, business, redis_client, key_prefix) -> None:
    from datetime import datetime

    now = [datetime(2026, 1, 1)]
    guard = IdempotencyGuard(
        engine,
        tables,
        redis_client,
        clock=lambda: now[0],
        config=GuardConfig(key_prefix=key_prefix, db_retention=timedelta(days=7)),
    )
    runs: list[str] = []
    old, recent = received(), received()
    assert guard.process(old, GROUP, writer(business, runs)) is SUCCESS
    now[0] += timedelta(days=6)
    assert guard.process(recent, GROUP, writer(business, runs)) is SUCCESS
    now[0] += timedelta(days=2)
    assert guard.purge() == 1
    with engine.connect() as conn:
        left = conn.execute(sa.select(tables.confirmation.c.message_id)).scalars().all()
    assert left == [recent.message_id]
    assert make_guard(engine, tables, redis_client, key_prefix).purge() == 0  # keep forever


def test_a_stub_expecting_two_groups_is_confirmed_by_the_second_only(
    engine, tables, business, redis_client, key_prefix
) -> None:
    def status() -> str:
        with engine.connect() as conn:
            return str(conn.execute(sa.select(tables.stub.c.status)).scalar())

    mid = published(engine, tables, ["billing", GROUP])
    guard = make_guard(engine, tables, redis_client, key_prefix)
    runs: list[str] = []
    assert guard.process(received(mid), GROUP, writer(business, runs)) is SUCCESS
    assert status() == StubStatus.UNCONFIRMED.value  # billing has not confirmed yet
    assert guard.process(received(mid), "billing", writer(business, runs)) is SUCCESS
    assert status() == StubStatus.CONFIRMED.value
    assert len(runs) == 2


def test_two_groups_confirming_at_once_both_count_and_the_stub_is_confirmed(
    engine, tables, business, redis_client, key_prefix
) -> None:
    mid = published(engine, tables, ["inventory", "billing"])
    message = received(mid)
    both_inside = threading.Barrier(2)
    results: dict[str, list[ConsumeResult]] = {"inventory": [], "billing": []}

    def consume(group: str) -> None:
        guard = make_guard(engine, tables, redis_client, key_prefix)
        first = [True]

        def handler(*, session: Session) -> None:
            if first[0]:
                first[0] = False
                both_inside.wait(30)  # both groups confirm at the same moment

        for _ in range(100):
            results[group].append(guard.process(message, group, handler))
            if results[group][-1] is SUCCESS:
                return

    threads = [threading.Thread(target=consume, args=(g,)) for g in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r and r[-1] is SUCCESS for r in results.values()), results
    with engine.connect() as conn:
        assert conn.execute(sa.select(tables.stub.c.status)).scalar() == StubStatus.CONFIRMED.value
        assert (
            conn.execute(sa.select(sa.func.count()).select_from(tables.confirmation)).scalar() == 2
        )


@pytest.mark.parametrize(
    "db_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_a_slow_handler_keeps_its_lease_by_renewing_it(
    engine, tables, business, redis_client, key_prefix
) -> None:
    lease = timedelta(milliseconds=300)
    guard = make_guard(engine, tables, redis_client, key_prefix, lease=lease)
    message = received()
    runs: list[str] = []
    held = HeldInHandler(guard, message, business, runs)
    deadline = time.monotonic() + 3 * lease.total_seconds()
    while time.monotonic() < deadline:  # three leases long, the handler still holds it
        assert guard.process(message, GROUP, writer(business, runs)) is LATER
        time.sleep(0.05)
    held.finish()
    held.join()
    assert held.result == [SUCCESS] and len(runs) == 1


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_the_handlers_commit_waits_for_the_wal_flush_though_the_receipts_does_not(
    engine, tables, redis_client, key_prefix
) -> None:
    # the receipt asks for an unflushed commit inside its own statement; the handler's
    # transaction then runs on the same pooled connection (one in the pool) and must not
    # inherit that: its writes and the confirmation are durable when the guard says SUCCESS
    one = sa.create_engine(engine.url, pool_size=1, max_overflow=0)
    try:
        guard = make_guard(one, tables, redis_client, key_prefix)
        seen: list[str] = []

        def handler(*, session: Session) -> None:
            seen.append(session.execute(sa.text("SHOW synchronous_commit")).scalar_one())

        assert guard.process(received(), GROUP, handler) is SUCCESS
        with one.connect() as conn:
            seen.append(conn.execute(sa.text("SHOW synchronous_commit")).scalar_one())
        assert seen == ["on", "on"]
    finally:
        one.dispose()
