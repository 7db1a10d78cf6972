"""The resend worker against real databases: watermark, groups, backoff, escalation."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from outbox import (
    Escalation,
    NotifyFailed,
    Outbox,
    OutboxConfig,
    OutboxTables,
    ResendPolicy,
    ResendWorker,
    StubNotOpen,
    StubStatus,
    declare_groups,
    requeue_stub,
    void_stub,
)
from reliable import Message

TOPIC = "OrderCreated"


class ListNotifier:
    def __init__(self) -> None:
        self.seen: list[Escalation] = []
        self.fail = False

    def notify(self, escalation: Escalation) -> None:
        if self.fail:
            raise NotifyFailed("list", escalation.message_id, "pager down")
        self.seen.append(escalation)


def _publish(engine, tables, sender, clock, n: int = 1, **kw) -> list[str]:  # type: ignore[no-untyped-def]
    outbox = Outbox(tables, sender, clock=clock)
    with Session(engine) as session, session.begin():
        return [
            outbox.publish(session, Message(topic=TOPIC, body=f"order {i}".encode()), **kw)
            for i in range(n)
        ]


def _stub(engine: sa.Engine, tables: OutboxTables, mid: str) -> sa.RowMapping:
    with engine.connect() as conn:
        return (
            conn.execute(sa.select(tables.stub).where(tables.stub.c.message_id == mid))
            .mappings()
            .one()
        )


def _confirm(engine: sa.Engine, tables: OutboxTables, mid: str, group: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.insert(tables.confirmation).values(
                message_id=mid, consumer_group=group, topic=TOPIC, confirmed_at=datetime(2026, 1, 1)
            )
        )


def _worker(engine, tables, sender, clock, offsets=None, **kw) -> ResendWorker:  # type: ignore[no-untyped-def]
    return ResendWorker(engine, tables, sender, offsets=offsets, clock=clock, **kw)


def test_send_failure_after_commit_is_recovered_by_the_worker(
    engine, tables, sender, clock, offsets
) -> None:
    declare_groups(engine, tables, TOPIC, ["inventory"])
    sender.fail_all = True
    [mid] = _publish(engine, tables, sender, clock)
    sender.fail_all = False
    worker = _worker(engine, tables, sender, clock, offsets)
    assert worker.run_once().selected == 0  # not due yet
    clock.advance(seconds=10)  # next_resend_at == now is due (the seed's '>' fixed)
    result = worker.run_once()
    assert (result.selected, result.resent, result.errors) == (1, 1, 0)
    assert sender.counts() == {mid: 1}
    stub = _stub(engine, tables, mid)
    assert stub["send_count"] == 2 and stub["queue_offset"] is not None
    assert stub["last_error"] is None and stub["claimed_by"] is None
    assert stub["next_resend_at"] == clock.now + timedelta(seconds=120)  # 60 s * 2^(2-1)
    assert worker.run_once().selected == 0


def test_backlogged_consumer_triggers_no_resend_then_passing_it_does(
    engine, tables, sender, clock, offsets
) -> None:
    declare_groups(engine, tables, TOPIC, ["inventory"])
    [mid] = _publish(engine, tables, sender, clock)
    offset = _stub(engine, tables, mid)["queue_offset"]
    worker = _worker(engine, tables, sender, clock, offsets)
    clock.advance(minutes=6)
    offsets.committed[("inventory", TOPIC, 0)] = offset  # next to consume is this one
    result = worker.run_once()
    assert (result.selected, result.backlogged, result.resent) == (1, 1, 0)
    assert sender.counts() == {mid: 1}
    assert _stub(engine, tables, mid)["next_resend_at"] == clock.now + timedelta(minutes=1)
    # the consumption log is empty (rows are deleted on success), and the group's committed
    # offset has now passed the message without a confirmation: it was lost, resend it
    offsets.committed[("inventory", TOPIC, 0)] = offset + 1
    clock.advance(minutes=1)
    result = worker.run_once()
    assert (result.resent, result.backlogged) == (1, 0)
    assert sender.counts() == {mid: 2}


def test_empty_consumption_log_does_not_stop_resends(
    engine, tables, sender, clock, offsets
) -> None:
    """The seed's watermark (the log's max offset) never resends once the log is empty."""
    declare_groups(engine, tables, TOPIC, ["inventory"])
    ids = _publish(engine, tables, sender, clock, n=3)
    top = max(_stub(engine, tables, mid)["queue_offset"] for mid in ids)
    with engine.connect() as conn:
        assert (
            conn.execute(sa.select(sa.func.count()).select_from(tables.consumption_log)).scalar()
            == 0
        )
    offsets.committed[("inventory", TOPIC, 0)] = top + 1  # consumed past all, none confirmed
    clock.advance(minutes=6)
    result = _worker(engine, tables, sender, clock, offsets).run_once()
    assert (result.selected, result.resent) == (3, 3)
    assert sender.counts() == dict.fromkeys(ids, 2)


def test_message_in_the_consumption_log_is_not_resent_until_the_row_is_stale(
    engine, tables, sender, clock, offsets
) -> None:
    declare_groups(engine, tables, TOPIC, ["inventory"])
    [mid] = _publish(engine, tables, sender, clock)
    offsets.committed[("inventory", TOPIC, 0)] = 10**9
    with engine.begin() as conn:
        conn.execute(
            sa.insert(tables.consumption_log).values(
                message_id=mid,
                consumer_group="inventory",
                topic=TOPIC,
                queue_id=0,
                queue_offset=1,
                created_at=clock.now,
            )
        )
    clock.advance(minutes=6)
    worker = _worker(engine, tables, sender, clock, offsets)
    result = worker.run_once()
    assert (result.backlogged, result.resent) == (1, 0)
    # hours later the row is stale (no live lease, the retry ladder is over): resend it
    clock.advance(hours=6)
    result = worker.run_once()
    assert (result.backlogged, result.resent) == (0, 1)


def test_two_groups_one_lost_is_resent_to_that_group_only(
    engine, tables, sender, clock, offsets
) -> None:
    declare_groups(engine, tables, TOPIC, ["inventory", "billing"])
    [mid] = _publish(engine, tables, sender, clock)
    offset = _stub(engine, tables, mid)["queue_offset"]
    _confirm(engine, tables, mid, "inventory")
    offsets.committed[("inventory", TOPIC, 0)] = offset + 1
    offsets.committed[("billing", TOPIC, 0)] = offset + 1  # passed without confirming: lost
    worker = _worker(engine, tables, sender, clock, offsets)
    clock.advance(minutes=6)
    assert worker.run_once().resent == 1
    assert sender.sends() == [(mid, TOPIC), (mid, "%RETRY%billing")]
    with engine.connect() as conn:
        retry_prop = conn.execute(
            sa.select(sender.table.c.retry_topic).where(sender.table.c.topic == "%RETRY%billing")
        ).scalar()
    assert retry_prop == TOPIC
    stub = _stub(engine, tables, mid)
    retry_pos = json.loads(stub["group_positions"])["billing"]
    assert retry_pos[0] == "%RETRY%billing" and stub["queue_offset"] == offset
    # next round: the watermark is billing's offset on its retry topic, not on the topic
    clock.advance(hours=2)
    result = worker.run_once()
    assert (result.backlogged, result.resent) == (1, 0)
    offsets.committed[("billing", "%RETRY%billing", 0)] = retry_pos[2] + 1
    clock.advance(hours=2)
    assert worker.run_once().resent == 1
    assert [t for _, t in sender.sends()] == [TOPIC, "%RETRY%billing", "%RETRY%billing"]
    # billing confirms: the stub is CONFIRMED and never looked at again
    _confirm(engine, tables, mid, "billing")
    clock.advance(hours=2)
    assert worker.run_once().confirmed == 1
    assert _stub(engine, tables, mid)["status"] == StubStatus.CONFIRMED.value
    clock.advance(hours=2)
    assert worker.run_once().selected == 0


def test_never_sent_and_offset_not_held_are_due_by_age(
    engine, tables, sender, clock, offsets
) -> None:
    declare_groups(engine, tables, TOPIC, ["inventory"])
    [held, gone] = _publish(engine, tables, sender, clock, n=2)
    outbox = Outbox(tables, sender, clock=clock)
    with engine.connect() as conn, outbox.begin(conn) as tx:
        never = tx.publish(Message(topic=TOPIC, body=b"x"))
        sender.fail_all = True  # the process "dies" before the send: nothing recorded
    sender.fail_all = False
    with engine.begin() as conn:  # undo the failure record: as if it was never attempted
        conn.execute(
            sa.update(tables.stub)
            .where(tables.stub.c.message_id == never)
            .values(send_count=0, last_error=None)
        )
    gone_offset = _stub(engine, tables, gone)["queue_offset"]
    offsets.max[(TOPIC, 0)] = gone_offset  # the broker lost the tail after a crash
    worker = _worker(engine, tables, sender, clock, offsets, bounds=offsets)
    clock.advance(minutes=6)
    result = worker.run_once()
    assert (result.selected, result.resent, result.backlogged) == (3, 2, 1)
    counts = sender.counts()
    assert counts[never] == 1 and counts[gone] == 2 and counts[held] == 1


def test_all_groups_confirmed_marks_the_stub_confirmed_without_sending(
    engine, tables, sender, clock, offsets
) -> None:
    declare_groups(engine, tables, TOPIC, ["inventory", "billing"])
    [mid] = _publish(engine, tables, sender, clock)
    _confirm(engine, tables, mid, "inventory")
    _confirm(engine, tables, mid, "billing")
    clock.advance(minutes=6)
    result = _worker(engine, tables, sender, clock, offsets).run_once()
    assert (result.confirmed, result.resent) == (1, 0)
    assert _stub(engine, tables, mid)["status"] == StubStatus.CONFIRMED.value
    assert sender.counts() == {mid: 1}


def test_exhausted_stub_notifies_exactly_once(engine, tables, sender, clock, offsets) -> None:
    declare_groups(engine, tables, TOPIC, ["inventory"])
    [mid] = _publish(engine, tables, sender, clock, max_sends=2)
    offsets.committed[("inventory", TOPIC, 0)] = 10**9  # always passed, never confirmed
    notifier = ListNotifier()
    workers = [_worker(engine, tables, sender, clock, offsets, notifier=notifier) for _ in range(2)]
    clock.advance(minutes=6)
    assert workers[0].run_once().resent == 1  # send 2 of 2
    notifier.fail = True
    clock.advance(hours=2)
    failed = workers[1].run_once()
    assert (failed.escalated, failed.errors) == (0, 1)  # not lost: tried again later
    notifier.fail = False
    for _ in range(5):
        clock.advance(hours=2)
        for worker in workers:
            worker.run_once()
    assert [e.message_id for e in notifier.seen] == [mid]
    assert notifier.seen[0].missing_groups == ("inventory",)
    assert sender.counts() == {mid: 2}
    stub = _stub(engine, tables, mid)
    assert stub["escalated_at"] is not None and stub["status"] == StubStatus.UNCONFIRMED.value
    assert sum(w.metrics.escalated for w in workers) == 1


def test_policy_waits_are_tenacity_values(engine, tables, sender, clock, offsets) -> None:
    import tenacity

    declare_groups(engine, tables, TOPIC, ["inventory"])
    [mid] = _publish(engine, tables, sender, clock)
    offsets.committed[("inventory", TOPIC, 0)] = 10**9
    policy = ResendPolicy(backoff=tenacity.wait_fixed(7) + tenacity.wait_fixed(3))
    clock.advance(minutes=6)
    _worker(engine, tables, sender, clock, offsets, policy=policy).run_once()
    assert _stub(engine, tables, mid)["next_resend_at"] == clock.now + timedelta(seconds=10)


def test_one_failing_stub_does_not_hold_back_the_batch(
    engine, tables, sender, clock, offsets
) -> None:
    class FlakyOffsets:
        def committed_offset(self, group: str, topic: str, queue_id: int) -> int | None:
            if topic == "Broken":
                raise ConnectionError("name server unreachable")
            return 10**9

    declare_groups(engine, tables, TOPIC, ["inventory"])
    declare_groups(engine, tables, "Broken", ["inventory"])
    [good] = _publish(engine, tables, sender, clock)
    outbox = Outbox(tables, sender, clock=clock)
    with Session(engine) as session, session.begin():
        bad = outbox.publish(session, Message(topic="Broken", body=b"x"))
    clock.advance(minutes=6)
    result = _worker(engine, tables, sender, clock, FlakyOffsets()).run_once()
    assert (result.selected, result.resent, result.errors) == (2, 1, 1)
    assert sender.counts() == {good: 2, bad: 1}
    stub = _stub(engine, tables, bad)
    assert stub["claimed_by"] is None and "ConnectionError" in stub["last_error"]
    assert stub["next_resend_at"] == clock.now + timedelta(seconds=10)


def test_operator_requeues_an_escalated_stub_or_voids_it(
    engine, tables, sender, clock, offsets
) -> None:
    declare_groups(engine, tables, TOPIC, ["inventory"])
    [fixed, dropped] = _publish(engine, tables, sender, clock, n=2, max_sends=1)
    offsets.committed[("inventory", TOPIC, 0)] = 10**9
    notifier = ListNotifier()
    worker = _worker(engine, tables, sender, clock, offsets, notifier=notifier)
    clock.advance(minutes=6)
    assert worker.run_once().escalated == 2
    # the cause was fixed
    requeued = requeue_stub(engine, tables, fixed, operator="oncall", now=clock.now)
    assert (requeued.before["send_count"], requeued.after["send_count"]) == (1, 0)
    void_stub(engine, tables, dropped, operator="oncall", now=clock.now)  # never sent again
    with pytest.raises(StubNotOpen):
        void_stub(engine, tables, dropped, operator="oncall", now=clock.now)
    result = worker.run_once()
    assert (result.selected, result.resent) == (1, 1)
    assert sender.counts() == {fixed: 2, dropped: 1}
    assert _stub(engine, tables, dropped)["status"] == StubStatus.VOID.value
    clock.advance(days=1)
    assert worker.run_once().escalated == 1 and len(notifier.seen) == 3


def test_polling_outbox_leaves_every_send_to_the_worker(
    engine, tables, sender, clock, offsets
) -> None:
    declare_groups(engine, tables, TOPIC, ["inventory"])
    outbox = Outbox(tables, sender, clock=clock, config=OutboxConfig(send_after_commit=False))
    with Session(engine) as session, session.begin():
        ids = [outbox.publish(session, Message(topic=TOPIC, body=b"x")) for _ in range(3)]
    with engine.connect() as conn, outbox.begin(conn) as tx:
        ids.append(tx.publish(Message(topic=TOPIC, body=b"y")))
    assert sender.counts() == {}  # the commits did not wait for the broker
    result = _worker(engine, tables, sender, clock, offsets).run_once()  # due at once
    assert result.resent == 4 and sender.counts() == dict.fromkeys(ids, 1)


class PipelinedSender:
    """A sender offering `send_async` (as `reliable.Producer` does): the worker sends a
    batch's whole-topic resends together, then settles each. Ids in `refuse` fail."""

    def __init__(self, inner, refuse: set[str]) -> None:  # type: ignore[no-untyped-def]
        self.inner, self.refuse = inner, refuse
        self.waited = 0

    def send(self, message: Message):  # type: ignore[no-untyped-def]
        self.waited += 1
        return self.inner.send(message)

    def send_async(self, message: Message):  # type: ignore[no-untyped-def]
        from concurrent.futures import Future

        future: Future[object] = Future()
        if message.message_id in self.refuse:
            future.set_exception(ConnectionError("broker unreachable"))
        else:
            future.set_result(self.inner.send(message))
        return future


def test_pipelined_resends_settle_each_stub_like_a_waited_send(
    engine, tables, sender, clock, offsets
) -> None:
    declare_groups(engine, tables, TOPIC, ["inventory"])
    sender.fail_all = True
    ok, failing = _publish(engine, tables, sender, clock, n=2)
    sender.fail_all = False
    pipelined = PipelinedSender(sender, refuse={failing})
    worker = _worker(engine, tables, pipelined, clock, offsets)
    clock.advance(seconds=10)
    result = worker.run_once()
    assert (result.selected, result.resent, result.errors) == (2, 1, 1)
    assert pipelined.waited == 0  # both went through send_async
    assert sender.counts() == {ok: 1}
    sent, failed = _stub(engine, tables, ok), _stub(engine, tables, failing)
    assert sent["send_count"] == 2 and sent["queue_offset"] is not None
    assert sent["last_error"] is None and sent["claimed_by"] is None
    assert sent["next_resend_at"] == clock.now + timedelta(seconds=120)
    assert failed["send_count"] == 2 and failed["queue_offset"] is None
    assert "broker unreachable" in failed["last_error"] and failed["claimed_by"] is None
    assert failed["next_resend_at"] == clock.now + timedelta(seconds=20)  # error backoff
