"""Invisible-time consumption: receive, ack, change invisible duration, redelivery with
attempt + 1, DLQ after the maximum attempts, FIFO groups, and state across restarts."""

from __future__ import annotations

from pathlib import Path

import pytest
from broker_kit import BrokerFactory, ManualClock, drain, msg, settle

from broker.broker import Broker
from broker.errors import InvalidArgument, InvalidReceiptHandle, ReceiptHandleExpired
from broker.pop import ReceivedEntry
from protocol.props import Prop


def _setup(broker: Broker, n: int, *, queues: int = 1, retries: int = 16) -> list[str]:
    broker.create_topic("t", queues=queues)
    broker.create_group("g", retry_max_times=retries)
    ids = [
        broker.send_message(msg("t", f"m{i}".encode(), queue_id=i % queues)).msg_id
        for i in range(n)
    ]
    settle(broker)
    return ids


def test_receive_hides_until_ack(broker: Broker, clock: ManualClock) -> None:
    ids = _setup(broker, 3)
    got = broker.receive("g", "t", 10, invisible_ms=1_000)
    assert [e.message.msg_id for e in got] == ids
    assert all(e.delivery_attempt == 1 and e.message.reconsume_times == 0 for e in got)
    assert broker.receive("g", "t", 10, invisible_ms=1_000) == []
    for e in got:
        broker.ack("g", "t", e.receipt_handle)
    broker.ack("g", "t", got[0].receipt_handle)  # acks are idempotent
    clock.advance(5_000)
    assert broker.receive("g", "t", 10, invisible_ms=1_000) == []
    assert broker.query_offset("g", "t", 0) == 3  # the window's low mark is the offset


def test_unacked_message_reappears_with_attempt_plus_one_then_dlq(
    broker: Broker, clock: ManualClock
) -> None:
    [mid] = _setup(broker, 1, retries=2)  # 3 attempts
    attempts = []
    handles = []
    for _ in range(3):
        [e] = broker.receive("g", "t", 1, invisible_ms=1_000)
        attempts.append((e.delivery_attempt, e.message.reconsume_times))
        handles.append(e.receipt_handle)
        clock.advance(999)
        assert broker.receive("g", "t", 1, invisible_ms=1_000) == []  # still invisible
        clock.advance(1)
    assert attempts == [(1, 0), (2, 1), (3, 2)]
    with pytest.raises(InvalidReceiptHandle):  # superseded by the redelivery
        broker.ack("g", "t", handles[0])
    with pytest.raises(ReceiptHandleExpired):
        broker.ack("g", "t", handles[-1])
    assert broker.receive("g", "t", 1, invisible_ms=1_000) == []  # the 4th goes to the DLQ
    dead = drain(broker, "g", broker.dlq_topic("g"))
    assert [d.msg_id for d in dead] == [mid]
    assert dead[0].properties[Prop.DLQ_ORIGIN_TOPIC] == "t"
    assert broker.in_flight("g", "t") == []


def test_a_window_held_back_by_one_lease_redelivers_it_first_and_reads_no_acked_offset(
    broker: Broker, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One slow message keeps the window open while 2,000 are acked behind it: when its
    invisible time ends it comes back first, before anything new, and no acked offset is
    read again."""
    ids = _setup(broker, 2_005)
    [slow] = broker.receive("g", "t", 1, invisible_ms=60_000)
    assert slow.message.msg_id == ids[0]
    acked = 0
    while acked < 2_000:
        batch = broker.receive("g", "t", min(100, 2_000 - acked), invisible_ms=60_000)
        assert batch
        for e in batch:
            broker.ack("g", "t", e.receipt_handle)
        acked += len(batch)
    assert broker.query_offset("g", "t", 0) == 0  # held back by the slow one
    reads: list[int] = []
    real = broker.store.get_message_by_queue_offset

    def counted(topic: str, qid: int, offset: int) -> object:
        reads.append(offset)
        return real(topic, qid, offset)

    monkeypatch.setattr(broker.store, "get_message_by_queue_offset", counted)
    clock.advance(60_000)
    got = broker.receive("g", "t", 3, invisible_ms=1_000)
    assert [e.message.msg_id for e in got] == [ids[0], ids[2_001], ids[2_002]]
    assert got[0].delivery_attempt == 2 and got[1].delivery_attempt == 1
    assert reads == [0]  # the expired lease only: none of the 2,000 acked offsets
    for e in got:
        broker.ack("g", "t", e.receipt_handle)
    assert broker.query_offset("g", "t", 0) == 2_003
    rest = broker.receive("g", "t", 10, invisible_ms=1_000)
    assert [e.message.msg_id for e in rest] == [ids[2_003], ids[2_004]]


class _CountedLeases(dict):  # type: ignore[type-arg]
    """A window's leases that count how often they are walked."""

    walks = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        type(self).walks += 1
        return super().__iter__()

    def items(self):  # type: ignore[no-untyped-def]
        type(self).walks += 1
        return super().items()


def test_a_receive_with_many_in_flight_walks_no_lease_until_one_can_be_due(
    make_broker: BrokerFactory, clock: ManualClock
) -> None:
    """301 messages in flight: receives and revive sweeps before any lease can end do not
    look at the leases (each used to walk all of them); a lease made to end sooner
    (change invisible duration), a restart and the end of the rest are each seen at once."""
    broker = make_broker()
    ids = _setup(broker, 301)
    held: list[ReceivedEntry] = []
    while batch := broker.receive("g", "t", 32, invisible_ms=60_000):
        held += batch
    assert [e.message.msg_id for e in held] == ids
    window = broker._pop._state[("g", "t")][0]
    window.leases = _CountedLeases(window.leases)
    for _ in range(5):
        clock.advance(1_000)
        assert broker.receive("g", "t", 10, invisible_ms=60_000) == []
        assert broker.revive() == 0
    assert _CountedLeases.walks == 0
    # one lease made to end 1 s from now: redelivered then, and only it
    broker.change_invisible_duration("g", "t", held[7].receipt_handle, 1_000)
    assert broker.receive("g", "t", 10, invisible_ms=60_000) == []
    clock.advance(1_000)
    [again] = broker.receive("g", "t", 10, invisible_ms=60_000)
    assert again.message.msg_id == ids[7] and again.delivery_attempt == 2
    assert broker.receive("g", "t", 10, invisible_ms=60_000) == []
    # the floor is derived, never stored: a restarted broker finds the due leases
    broker.shutdown()
    restarted = make_broker()
    assert restarted.receive("g", "t", 10, invisible_ms=60_000) == []
    clock.advance(54_000)  # at 60 s: the 300 others end, the redelivered one at 66 s
    got: list[ReceivedEntry] = []
    while batch := restarted.receive("g", "t", 32, invisible_ms=60_000):
        got += batch
    assert sorted(e.message.msg_id for e in got) == sorted(i for i in ids if i != ids[7])
    assert all(e.delivery_attempt == 2 for e in got)
    clock.advance(6_000)
    [last] = restarted.receive("g", "t", 32, invisible_ms=60_000)
    assert last.message.msg_id == ids[7] and last.delivery_attempt == 3


def test_a_small_receive_reads_no_more_records_than_it_can_take(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """receive(1) over 100 messages reads (and decodes) one record a call, not a batch of
    32 of which it hands out one; the messages still come once each, in order."""
    ids = _setup(broker, 100)
    asked: list[int] = []
    real = broker.store.get_messages

    def counted(*args: object, **kw: object) -> object:
        asked.append(int(args[4]))  # type: ignore[call-overload]
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(broker.store, "get_messages", counted)
    got = []
    for _ in range(100):
        [e] = broker.receive("g", "t", 1, invisible_ms=60_000)
        got.append(e.message.msg_id)
    assert got == ids
    assert set(asked) == {1}
    asked.clear()
    batch = broker.receive("g", "t", 5, invisible_ms=60_000)
    assert batch == [] and max(asked) <= 5


def test_revive_sweep_dead_letters_without_a_receiver(broker: Broker, clock: ManualClock) -> None:
    _setup(broker, 1, retries=0)  # a single attempt
    assert len(broker.receive("g", "t", 1, invisible_ms=100)) == 1
    assert broker.revive() == 0
    clock.advance(100)
    assert broker.revive() == 1
    assert len(drain(broker, "g", broker.dlq_topic("g"))) == 1


def test_change_invisible_duration_gives_a_new_handle_and_kills_the_old(
    broker: Broker, clock: ManualClock
) -> None:
    _setup(broker, 1)
    [e] = broker.receive("g", "t", 1, invisible_ms=1_000)
    clock.advance(500)
    new = broker.change_invisible_duration("g", "t", e.receipt_handle, 5_000)
    assert new != e.receipt_handle
    with pytest.raises(InvalidReceiptHandle):
        broker.ack("g", "t", e.receipt_handle)
    with pytest.raises(InvalidReceiptHandle):
        broker.change_invisible_duration("g", "t", e.receipt_handle, 1_000)
    clock.advance(1_000)  # past the first invisible time, inside the new one
    assert broker.receive("g", "t", 1, invisible_ms=1_000) == []
    [f] = broker.in_flight("g", "t")
    assert f.delivery_attempt == 1
    broker.ack("g", "t", new)
    clock.advance(10_000)
    assert broker.receive("g", "t", 1, invisible_ms=1_000) == []


def test_nack_by_short_invisible_time_redelivers(broker: Broker, clock: ManualClock) -> None:
    _setup(broker, 1)
    [e] = broker.receive("g", "t", 1, invisible_ms=60_000)
    broker.change_invisible_duration("g", "t", e.receipt_handle, 0)
    [again] = broker.receive("g", "t", 1, invisible_ms=60_000)
    assert again.delivery_attempt == 2 and again.message.msg_id == e.message.msg_id


def test_forward_to_dlq(broker: Broker) -> None:
    [mid] = _setup(broker, 1)
    [e] = broker.receive("g", "t", 1, invisible_ms=1_000)
    broker.forward_to_dlq("g", "t", e.receipt_handle)
    assert [d.msg_id for d in drain(broker, "g", broker.dlq_topic("g"))] == [mid]
    assert broker.in_flight("g", "t") == []


def test_bad_handles_and_arguments(broker: Broker) -> None:
    _setup(broker, 1)
    [e] = broker.receive("g", "t", 1, invisible_ms=1_000)
    # the last character changed (a handle ending in "0" already must not stay valid)
    other = "1" if e.receipt_handle.endswith("0") else "0"
    for bad in ("", "garbage", e.receipt_handle[:-1] + other):
        with pytest.raises(InvalidReceiptHandle):
            broker.ack("g", "t", bad)
    with pytest.raises(InvalidReceiptHandle):
        broker.ack("other-group", "t", e.receipt_handle)
    broker.create_topic("t2", queues=1)
    with pytest.raises(InvalidReceiptHandle):
        broker.ack("g", "t2", e.receipt_handle)
    with pytest.raises(InvalidArgument):
        broker.receive("g", "t", 0, invisible_ms=1_000)
    with pytest.raises(InvalidArgument):
        broker.receive("g", "t", 1, invisible_ms=0)
    broker.ack("g", "t", e.receipt_handle)  # still fine after all that


def test_tag_filter_skips_and_counts_as_consumed(broker: Broker) -> None:
    broker.create_topic("t", queues=1)
    for tag in ("a", "b", "a", "c"):
        broker.send_message(msg("t", tag.encode(), tags=tag))
    settle(broker)
    got = broker.receive("g", "t", 10, invisible_ms=1_000, tags={"a"})
    assert [e.message.body for e in got] == [b"a", b"a"]
    for e in got:
        broker.ack("g", "t", e.receipt_handle)
    assert broker.query_offset("g", "t", 0) == 4


def test_fifo_never_has_two_messages_of_a_group_in_flight(
    broker: Broker, clock: ManualClock
) -> None:
    broker.create_topic("t", queues=1, message_type="FIFO")
    broker.create_group("g", fifo=True)
    order = [("A", 1), ("A", 2), ("B", 1), ("A", 3), ("B", 2)]
    for grp, n in order:
        broker.send_message(msg("t", f"{grp}{n}".encode(), **{Prop.SHARDING_KEY: grp}))
    settle(broker)
    first = broker.receive("g", "t", 10, invisible_ms=1_000)
    assert [e.message.body for e in first] == [b"A1", b"B1"]
    assert broker.receive("g", "t", 10, invisible_ms=1_000) == []
    # A1 fails (not acked): it comes back before A2; B1 is acked
    broker.ack("g", "t", first[1].receipt_handle)
    [b2] = broker.receive("g", "t", 10, invisible_ms=1_000)
    assert b2.message.body == b"B2"
    broker.ack("g", "t", b2.receipt_handle)
    clock.advance(1_000)
    [a1] = broker.receive("g", "t", 10, invisible_ms=1_000)
    assert (a1.message.body, a1.delivery_attempt) == (b"A1", 2)
    broker.ack("g", "t", a1.receipt_handle)
    rest = []
    while True:
        batch = broker.receive("g", "t", 10, invisible_ms=1_000)
        if not batch:
            break
        assert len(batch) == 1
        rest.append(batch[0].message.body)
        broker.ack("g", "t", batch[0].receipt_handle)
    assert rest == [b"A2", b"A3"]
    assert broker.query_offset("g", "t", 0) == 5


def test_invisible_state_survives_restart(make_broker: BrokerFactory, clock: ManualClock) -> None:
    b1 = make_broker()
    ids = _setup(b1, 4, queues=2)
    got = b1.receive("g", "t", 4, invisible_ms=10_000)
    assert sorted(e.message.msg_id for e in got) == sorted(ids)
    b1.ack("g", "t", got[0].receipt_handle)
    changed = b1.change_invisible_duration("g", "t", got[1].receipt_handle, 60_000)
    b1.shutdown()

    b2 = make_broker()
    assert b2.receive("g", "t", 4, invisible_ms=10_000) == []  # all still invisible
    b2.ack("g", "t", got[2].receipt_handle)  # a handle from before the restart works
    with pytest.raises(InvalidReceiptHandle):
        b2.ack("g", "t", got[1].receipt_handle)  # superseded before the restart
    clock.advance(10_000)
    [again] = b2.receive("g", "t", 4, invisible_ms=10_000)
    assert again.message.msg_id == got[3].message.msg_id and again.delivery_attempt == 2
    b2.ack("g", "t", changed)
    b2.ack("g", "t", again.receipt_handle)
    b2.shutdown()

    b3 = make_broker()
    clock.advance(100_000)
    assert b3.receive("g", "t", 4, invisible_ms=1_000) == []
    assert sum(b3.query_offset("g", "t", q) for q in (0, 1)) == 4


def test_packed_leases_replay_from_the_revive_log(
    make_broker: BrokerFactory, clock: ManualClock, tmp_path: Path
) -> None:
    """A receive logs its run of leases as one packed op: replayed without the snapshot (as
    after a crash), every lease, nonce and attempt comes back exactly."""
    b1 = make_broker()
    ids = _setup(b1, 10)
    got = b1.receive("g", "t", 8, invisible_ms=10_000)  # one packed op of 8 leases
    assert [e.message.msg_id for e in got] == ids[:8]
    b1.ack("g", "t", got[3].receipt_handle)
    changed = b1.change_invisible_duration("g", "t", got[5].receipt_handle, 60_000)
    b1.shutdown()
    (tmp_path / "store" / "config" / "popState.json").unlink()  # replay the whole log

    b2 = make_broker()
    [nine] = b2.receive("g", "t", 1, invisible_ms=10_000)  # leased ones stay invisible
    assert nine.message.msg_id == ids[8]
    b2.ack("g", "t", got[6].receipt_handle)  # each replayed lease kept its own nonce
    with pytest.raises(InvalidReceiptHandle):
        b2.ack("g", "t", got[5].receipt_handle)  # superseded by the change
    clock.advance(10_000)
    again = b2.receive("g", "t", 10, invisible_ms=10_000)
    assert sorted(e.message.msg_id for e in again) == sorted(
        ids[i] for i in (0, 1, 2, 4, 7, 8, 9)
    )  # not 3 and 6 (acked), not 5 (leased for 60 s)
    assert {e.message.msg_id: e.delivery_attempt for e in again if e.message.msg_id != ids[9]} == {
        ids[i]: 2 for i in (0, 1, 2, 4, 7, 8)
    }
    b2.ack("g", "t", changed)


def test_long_poll_receive_wakes_on_arrival(broker: Broker) -> None:
    import threading

    broker.create_topic("t", queues=1)
    broker.create_group("g")
    assert broker.receive("g", "t", 1, invisible_ms=1_000) == []
    result: list[object] = []
    waiter = threading.Thread(
        target=lambda: result.extend(
            broker.receive("g", "t", 1, invisible_ms=1_000, long_poll_ms=20_000)
        )
    )
    waiter.start()
    broker.send_message(msg("t", b"x"))
    waiter.join(30)
    assert not waiter.is_alive()
    assert len(result) == 1


def test_ack_batch_reports_per_handle(broker: Broker, clock: ManualClock) -> None:
    _setup(broker, 3)
    got = broker.receive("g", "t", 3, invisible_ms=1_000)
    results = broker.ack_batch(
        "g", "t", [got[0].receipt_handle, "garbage", got[1].receipt_handle, got[0].receipt_handle]
    )
    assert results[0] is None and results[2] is None and results[3] is None
    assert isinstance(results[1], InvalidReceiptHandle)
    clock.advance(1_000)
    [late] = broker.ack_batch("g", "t", [got[2].receipt_handle])
    assert isinstance(late, ReceiptHandleExpired)
    [again] = broker.receive("g", "t", 3, invisible_ms=1_000)
    assert again.message.msg_id == got[2].message.msg_id and again.delivery_attempt == 2


def test_ack_batch_with_gaps_across_queues_survives_restart(
    make_broker: BrokerFactory, clock: ManualClock
) -> None:
    """A batch acks runs of offsets as ranges: with gaps, duplicates and two queues, exactly
    the acked messages are done, before and after the revive log is replayed."""
    b1 = make_broker()
    ids = _setup(b1, 12, queues=2)
    got = b1.receive("g", "t", 12, invisible_ms=10_000)
    assert sorted(e.message.msg_id for e in got) == sorted(ids)
    by_queue: dict[int, list[ReceivedEntry]] = {0: [], 1: []}
    for e in got:
        by_queue[e.message.queue_id].append(e)
    keep = [by_queue[0][2], by_queue[0][5], by_queue[1][0]]  # gaps at both ends, mid-run
    acked = [e for e in got if all(e is not k for k in keep)]
    handles = [e.receipt_handle for e in reversed(acked)] + [acked[0].receipt_handle]
    assert all(r is None for r in b1.ack_batch("g", "t", handles))
    b1.shutdown()

    b2 = make_broker()
    clock.advance(10_000)
    again = b2.receive("g", "t", 12, invisible_ms=10_000)
    assert sorted(e.message.msg_id for e in again) == sorted(e.message.msg_id for e in keep)
    assert all(e.delivery_attempt == 2 for e in again)
    assert all(r is None for r in b2.ack_batch("g", "t", [e.receipt_handle for e in again]))
    assert b2.query_offset("g", "t", 0) == 6 and b2.query_offset("g", "t", 1) == 6
    b2.shutdown()


def test_window_past_the_queue_end_is_cut_back(make_broker: BrokerFactory) -> None:
    """As after a power cut under async flush: the state names offsets the store lost."""
    import json

    b1 = make_broker()
    _setup(b1, 2)
    for e in b1.receive("g", "t", 2, invisible_ms=1_000):
        b1.ack("g", "t", e.receipt_handle)
    b1.shutdown()
    path = b1.store.config.config_dir / "popState.json"
    state = json.loads(path.read_text())
    window = state["groups"]["g"]["t"]["0"]
    window.update({"next": 9, "done": [5, 6], "leases": {"7": [1, 10**15, 1, None]}})
    path.write_text(json.dumps(state))

    b2 = make_broker()
    sent = [b2.send_message(msg("t", f"new{i}".encode())).msg_id for i in range(8)]
    settle(b2)
    got = b2.receive("g", "t", 32, invisible_ms=1_000)
    assert [e.message.msg_id for e in got] == sent  # offsets 2..9: none taken for done


def test_concurrent_receivers_get_every_message_exactly_once(broker: Broker, seed: int) -> None:
    import random
    import threading

    rng = random.Random(seed)
    broker.create_topic("t", queues=4)
    sent = {
        broker.send_message(msg("t", b"m", queue_id=rng.randrange(4))).msg_id for _ in range(600)
    }
    settle(broker)
    seen: list[str] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            empty = 0
            while empty < 3:
                batch = broker.receive("g", "t", rng.randrange(1, 17), invisible_ms=60_000)
                empty = 0 if batch else empty + 1
                with lock:
                    seen.extend(e.message.msg_id for e in batch)
                if batch:
                    assert all(
                        r is None
                        for r in broker.ack_batch("g", "t", [e.receipt_handle for e in batch])
                    )
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=consume) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(seen) == len(set(seen)) == 600  # no duplicate
    assert set(seen) == sent  # no loss
    assert sum(broker.query_offset("g", "t", q) for q in range(4)) == 600


def test_deleted_and_recreated_topic_starts_afresh(make_broker: BrokerFactory) -> None:
    b1 = make_broker()
    _setup(b1, 3)
    for e in b1.receive("g", "t", 3, invisible_ms=1_000):
        b1.ack("g", "t", e.receipt_handle)
    assert b1.delete_topic("t")
    b1.create_topic("t", queues=1)
    first = b1.send_message(msg("t", b"after")).msg_id
    settle(b1)
    assert [e.message.msg_id for e in b1.receive("g", "t", 3, invisible_ms=1_000)] == [first]
    b1.shutdown()
    b2 = make_broker()  # the forgetting was durable
    assert b2.receive("g", "t", 3, invisible_ms=1_000) == []
    assert b2.in_flight("g", "t")[0].queue_offset == 0


def test_tag_expressions_as_strings(broker: Broker) -> None:
    broker.create_topic("t", queues=1)
    for tag in ("a", "b", "c"):
        broker.send_message(msg("t", tag.encode(), tags=tag))
    settle(broker)
    got = broker.receive("g", "t", 10, invisible_ms=1_000, tags="a || c")
    assert [e.message.body for e in got] == [b"a", b"c"]
    pulled = broker.pull_message("h", "t", 0, 0, 10, tags="b")
    assert [m.body for m in pulled.messages] == [b"b"]
    assert [m.body for m in broker.pull_message("i", "t", 0, 0, 10, tags="*").messages] == [
        b"a",
        b"b",
        b"c",
    ]


def test_parked_receive_wakes_when_a_lease_expires(tmp_path: Path) -> None:
    """Wall clock and the background services: a receive parked on an empty topic gets the
    message whose invisible time ran out, without a new arrival."""
    from broker_kit import broker_config, store_config

    b = Broker(store_config(tmp_path / "s"), broker_config(pop_revive_interval_ms=20))
    b.start()
    try:
        _setup(b, 1)
        [first] = b.receive("g", "t", 1, invisible_ms=300)
        again = b.receive("g", "t", 1, invisible_ms=60_000, long_poll_ms=20_000)
        assert [e.message.msg_id for e in again] == [first.message.msg_id]
        assert again[0].delivery_attempt == 2
    finally:
        b.shutdown()
