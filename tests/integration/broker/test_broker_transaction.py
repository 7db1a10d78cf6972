"""Transactional messages: a half message is never delivered before commit nor after
rollback; the check-back resolves unknown transactions; state survives a restart."""

from __future__ import annotations

import threading
import time

import pytest
from broker_kit import BrokerFactory, ManualClock, drain, msg, settle

from broker.broker import Broker
from broker.errors import TransactionAlreadyResolved, TransactionNotFound
from broker.store.message import MessageExt, SysFlag
from protocol.props import Prop


def _half(broker: Broker, body: bytes, group: str = "pg") -> tuple[str, int]:
    sent = broker.send_message(msg("t", body, **{Prop.TRAN_MSG: "true"}), producer_group=group)
    assert sent.transaction_id is not None and sent.queue_offset == -1
    return sent.transaction_id, sent.commitlog_offset


def _nothing_visible(broker: Broker) -> None:
    settle(broker)
    assert drain(broker, "g", "t") == []
    assert broker.receive("pop", "t", 10, invisible_ms=1_000) == []


def test_half_message_is_invisible_until_commit_and_forever_after_rollback(broker: Broker) -> None:
    broker.create_topic("t", queues=1, message_type="TRANSACTION")
    commit_id, commit_off = _half(broker, b"commit-me")
    rollback_id, rollback_off = _half(broker, b"roll-me-back")
    _nothing_visible(broker)

    broker.end_transaction("pg", rollback_id, rollback_off, commit=False)
    _nothing_visible(broker)
    broker.end_transaction("pg", commit_id, commit_off, commit=True)
    got = drain(broker, "g", "t")
    assert [m.body for m in got] == [b"commit-me"]
    assert got[0].msg_id == commit_id
    assert SysFlag.transaction_value(got[0].sys_flag) == SysFlag.TRANSACTION_COMMIT
    assert Prop.REAL_TOPIC not in got[0].properties
    assert Prop.TRAN_MSG not in got[0].properties  # sending it on is a plain send
    [e] = broker.receive("pop", "t", 10, invisible_ms=1_000)
    assert e.message.body == b"commit-me"

    # the same decision again is harmless; the opposite one is refused; nothing new appears
    broker.end_transaction("pg", commit_id, commit_off, commit=True)
    with pytest.raises(TransactionAlreadyResolved):
        broker.end_transaction("pg", commit_id, commit_off, commit=False)
    with pytest.raises(TransactionAlreadyResolved):
        broker.end_transaction("pg", rollback_id, rollback_off, commit=True)
    assert drain(broker, "g", "t") == []


def test_end_transaction_checks_what_it_resolves(broker: Broker) -> None:
    broker.create_topic("t", queues=1)
    tx, off = _half(broker, b"x")
    with pytest.raises(TransactionNotFound):
        broker.end_transaction("other-group", tx, off, commit=True)
    with pytest.raises(TransactionNotFound):
        broker.end_transaction("pg", "not-the-id", off, commit=True)
    for bad_offset in (off + 1, off + 7, off + 10**9):  # mid-record and past the end
        with pytest.raises(TransactionNotFound):
            broker.end_transaction("pg", tx, bad_offset, commit=True)
    plain = broker.send_message(msg("t"))
    with pytest.raises(TransactionNotFound):
        broker.end_transaction("pg", plain.msg_id, plain.commitlog_offset, commit=True)
    _ = drain(broker, "g", "t")
    broker.end_transaction("pg", tx, off, commit=True)
    assert [m.body for m in drain(broker, "g", "t")] == [b"x"]


def test_check_back_resolves_an_unknown_transaction(broker: Broker, clock: ManualClock) -> None:
    broker.create_topic("t", queues=1)
    calls: list[MessageExt] = []
    done = threading.Event()

    def checker(half: MessageExt) -> None:
        calls.append(half)
        broker.end_transaction(
            "pg",
            broker.transaction_id_of(half),
            half.commitlog_offset,
            commit=half.body == b"yes",
            from_check=True,
        )
        if len(calls) == 2:
            done.set()

    broker.register_transaction_checker("pg", checker)
    _half(broker, b"yes")
    _half(broker, b"no")
    settle(broker)
    assert broker.check_transactions() == 0  # younger than the transaction timeout
    clock.advance(1_000)
    assert broker.check_transactions() == 2
    assert done.wait(10)
    assert {c.topic for c in calls} == {"t"}  # shown with the real topic
    assert [m.body for m in drain(broker, "g", "t")] == [b"yes"]
    clock.advance(10_000)
    assert broker.check_transactions() == 0  # resolved: never asked again


def test_unanswered_checks_end_in_rollback_after_the_maximum(
    broker: Broker, clock: ManualClock
) -> None:
    broker.create_topic("t", queues=1)
    calls: list[int] = []
    broker.register_transaction_checker("pg", lambda half: calls.append(1))
    tx, off = _half(broker, b"limbo")
    settle(broker)
    clock.advance(1_000)
    for _ in range(3):  # transaction_check_max = 3
        assert broker.check_transactions() == 1
        assert broker.check_transactions() == 0  # not again within the check interval
        clock.advance(500)
    assert broker.check_transactions() == 0  # the 4th pass rolls it back
    deadline = time.monotonic() + 10
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(calls) == 3
    with pytest.raises(TransactionAlreadyResolved):
        broker.end_transaction("pg", tx, off, commit=True)
    _nothing_visible(broker)


def test_transaction_state_survives_restart(make_broker: BrokerFactory, clock: ManualClock) -> None:
    b1 = make_broker()
    b1.create_topic("t", queues=1)
    done_id, done_off = _half(b1, b"committed-before")
    open_id, open_off = _half(b1, b"open")
    back_id, back_off = _half(b1, b"rolled-back-before")
    b1.end_transaction("pg", done_id, done_off, commit=True)
    b1.end_transaction("pg", back_id, back_off, commit=False)
    assert [m.body for m in drain(b1, "g", "t")] == [b"committed-before"]
    b1.shutdown()

    b2 = make_broker()
    asked: list[bytes] = []
    b2.register_transaction_checker("pg", lambda half: asked.append(half.body))
    clock.advance(1_000)
    assert b2.check_transactions() == 1  # only the open one
    deadline = time.monotonic() + 10
    while not asked and time.monotonic() < deadline:
        time.sleep(0.01)
    assert asked == [b"open"]
    b2.end_transaction("pg", done_id, done_off, commit=True)  # no second copy
    with pytest.raises(TransactionAlreadyResolved):
        b2.end_transaction("pg", back_id, back_off, commit=True)
    b2.end_transaction("pg", open_id, open_off, commit=True)
    assert [m.body for m in drain(b2, "g", "t")] == [b"open"]


def test_crash_between_commit_and_op_record_is_healed_without_a_second_copy(
    make_broker: BrokerFactory, clock: ManualClock
) -> None:
    from broker.transaction import build_committed_message, look_checked

    b1 = make_broker()
    b1.create_topic("t", queues=1)
    tx, off = _half(b1, b"once")
    half = look_checked(b1.store, off)
    assert half is not None
    # the real message was written, then the broker died before the op record
    assert b1.store.put_message(build_committed_message(half)).ok
    b1.shutdown()

    b2 = make_broker()
    asked: list[MessageExt] = []
    b2.register_transaction_checker("pg", asked.append)
    clock.advance(1_000)
    assert b2.check_transactions() == 0
    assert asked == []  # the committed copy was found: nobody is asked
    b2.end_transaction("pg", tx, off, commit=True)  # idempotent, no second copy
    with pytest.raises(TransactionAlreadyResolved):
        b2.end_transaction("pg", tx, off, commit=False)
    assert [m.body for m in drain(b2, "g", "t")] == [b"once"]


def test_the_same_commit_again_at_once_waits_for_its_copy_to_be_indexed(broker: Broker) -> None:
    """A commit sent twice in a row (a client retrying): the second end finds the
    transaction settled and looks for its committed copy in the unique-key index, which the
    dispatcher fills after the append. With the dispatch held back, the copy is not indexed
    yet; the second end must wait for it, not read its absence as a rollback."""
    broker.create_topic("t", queues=1, message_type="TRANSACTION")
    tx, off = _half(broker, b"twice")
    settle(broker)
    outcome: list[BaseException | None] = []
    with broker.store.reput.paused():
        broker.end_transaction("pg", tx, off, commit=True)
        assert broker._tx.resolution(0) == "resolved"  # its op record already left memory
        again = threading.Thread(target=lambda: outcome.append(_end_quietly(broker, tx, off)))
        again.start()
        time.sleep(0.3)
        assert again.is_alive()  # waiting for the dispatch, not answered from a stale index
    again.join(10)
    assert outcome == [None]
    with pytest.raises(TransactionAlreadyResolved):
        broker.end_transaction("pg", tx, off, commit=False)
    assert [m.body for m in drain(broker, "g", "t")] == [b"twice"]


def _end_quietly(broker: Broker, tx: str, off: int) -> BaseException | None:
    try:
        broker.end_transaction("pg", tx, off, commit=True)
    except BaseException as exc:  # the test reports what the thread raised
        return exc
    return None
