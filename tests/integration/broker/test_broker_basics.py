"""Topics, groups, validation, offsets and long polling through the Broker API."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest
from broker_kit import (
    BrokerFactory,
    ManualClock,
    broker_config,
    drain,
    msg,
    settle,
    store_config,
)

from broker.broker import Broker, PullStatus
from broker.errors import (
    BodyOverLimit,
    GroupNotFound,
    InvalidTopicName,
    MessageIllegal,
    MessageTypeMismatch,
    NoPermission,
    SystemTopicReserved,
    TopicNotFound,
)
from broker.offsets import ConsumeFromWhere
from broker.store.message import Message
from broker.topic import PERM_READ, PERM_WRITE
from protocol.props import Prop


def test_topics_and_groups_persist(make_broker: BrokerFactory) -> None:
    b1 = make_broker()
    b1.create_topic("orders", queues=8, message_type="FIFO")
    b1.create_topic("audit", queues=2, perm=PERM_READ)
    b1.create_group("billing", retry_max_times=5, fifo=True)
    b1.shutdown()
    b2 = make_broker()
    orders = b2.get_topic("orders")
    assert orders is not None and orders.write_queue_nums == 8 and orders.order
    assert [t.name for t in b2.topics()] == ["audit", "orders"]
    group = b2.get_group("billing")
    assert group is not None and group.retry_max_times == 5 and group.fifo
    assert b2.max_delivery_attempts("billing") == 6


def test_bad_input_gets_typed_errors_and_stores_nothing(make_broker: BrokerFactory) -> None:
    b = make_broker(
        auto_create_topic=False,
        auto_create_subscription_group=False,
        max_message_size=1024,
        check_message_type=True,
    )
    b.create_topic("t", queues=2)
    b.create_topic("ro", queues=1, perm=PERM_READ)
    b.create_topic("wo", queues=1, perm=PERM_WRITE)
    with pytest.raises(InvalidTopicName):
        b.send_message(msg("bad topic"))
    with pytest.raises(SystemTopicReserved):
        b.send_message(msg("SCHEDULE_TOPIC_XXXX"))
    with pytest.raises(SystemTopicReserved):
        b.create_topic("RMQ_SYS_TRANS_HALF_TOPIC")
    with pytest.raises(TopicNotFound):
        b.send_message(msg("missing"))
    with pytest.raises(TopicNotFound):
        b.route("missing")
    with pytest.raises(MessageIllegal):
        b.send_message(msg("t", b""))
    with pytest.raises(BodyOverLimit):
        b.send_message(msg("t", b"x" * 1025))
    with pytest.raises(MessageIllegal):
        b.send_message(msg("t", queue_id=2))
    with pytest.raises(MessageIllegal):
        b.send_message(msg("t", **{Prop.DELAY: "99"}))
    with pytest.raises(MessageIllegal):
        b.send_message(msg("t", **{Prop.TIMER_DELIVER_MS: "soon"}))
    with pytest.raises(MessageIllegal):
        b.send_message(msg("t", **{"k": "a\x01b"}))
    with pytest.raises(MessageIllegal):  # transactional without a producer group
        b.send_message(msg("t", **{Prop.TRAN_MSG: "true"}))
    with pytest.raises(MessageTypeMismatch):
        b.send_message(msg("t", **{Prop.SHARDING_KEY: "g1"}))
    with pytest.raises(NoPermission):
        b.send_message(msg("ro"))
    b.create_group("g")
    with pytest.raises(NoPermission):
        b.pull_message("g", "wo", 0, 0)
    with pytest.raises(GroupNotFound):
        b.pull_message("nobody", "t", 0, 0)
    with pytest.raises(MessageIllegal):
        b.send_batch([msg("t"), msg("t", queue_id=1)])
    settle(b)
    assert b.max_offset("t", 0) == 0 and b.max_offset("t", 1) == 0  # nothing stored


def test_auto_create_topic(broker: Broker) -> None:
    route = broker.route("fresh")
    assert route.write_queue_nums == 4 and route.perm == 6
    broker.send_message(msg("fresh2"))
    assert broker.get_topic("fresh2") is not None


def test_batch_send(broker: Broker) -> None:
    broker.create_topic("t", queues=1)
    results = broker.send_batch([msg("t", f"{i}".encode()) for i in range(5)])
    assert [r.queue_offset for r in results] == [0, 1, 2, 3, 4]
    assert [m.body for m in drain(broker, "g", "t")] == [b"0", b"1", b"2", b"3", b"4"]


def test_offsets_persist_across_restart(make_broker: BrokerFactory) -> None:
    b1 = make_broker()
    b1.create_topic("t", queues=2)
    b1.commit_offset("g", "t", 0, 7)
    b1.commit_offset("g", "t", 1, 3)
    b1.shutdown()
    b2 = make_broker()
    assert b2.query_offset("g", "t", 0) == 7
    assert b2.query_offset("g", "t", 1) == 3
    assert b2.query_offset("other", "t", 0) == -1


def test_initial_offsets(broker: Broker, clock: ManualClock) -> None:
    broker.create_topic("t", queues=1)
    for i in range(3):
        broker.send_message(msg("t", f"{i}".encode()))
        clock.advance(1_000)
    t_mid = clock() - 2_000  # the second message's store time
    for i in range(3, 5):
        broker.send_message(msg("t", f"{i}".encode()))
    settle(broker)
    assert broker.initial_offset("last", "t", 0, ConsumeFromWhere.LAST_OFFSET) == 5
    assert broker.initial_offset("first", "t", 0, ConsumeFromWhere.FIRST_OFFSET) == 0
    assert broker.initial_offset("ts", "t", 0, ConsumeFromWhere.TIMESTAMP, t_mid) == 1
    # committed at once: a later takeover starts at the same place
    assert broker.initial_offset("last", "t", 0, ConsumeFromWhere.FIRST_OFFSET) == 5


def test_tag_filtered_pull(broker: Broker) -> None:
    broker.create_topic("t", queues=1)
    for tag in ("a", "b", "a"):
        broker.send_message(msg("t", tag.encode(), tags=tag))
    settle(broker)
    result = broker.pull_message("g", "t", 0, 0, 32, tags={"b"})
    assert result.status is PullStatus.FOUND
    assert [m.body for m in result.messages] == [b"b"]
    assert result.next_begin_offset == 3


def test_long_poll_pull_wakes_on_arrival(broker: Broker) -> None:
    broker.create_topic("t", queues=1)
    assert broker.pull_message("g", "t", 0, 0).status is PullStatus.NO_NEW_MSG
    result: list[object] = []
    waiter = threading.Thread(
        target=lambda: result.append(broker.pull_message("g", "t", 0, 0, suspend_ms=20_000))
    )
    waiter.start()
    broker.send_message(Message(topic="t", body=b"x"))
    waiter.join(30)
    assert not waiter.is_alive()
    [r] = result
    assert r.status is PullStatus.FOUND  # type: ignore[attr-defined]


def test_consumer_registry(broker: Broker, clock: ManualClock) -> None:
    broker.heartbeat("c2", "g", {"t": None})
    broker.heartbeat("c1", "g", {"t": ["a"]})
    assert broker.consumer_ids("g") == ["c1", "c2"]
    broker.unregister("c2", "g")
    assert broker.consumer_ids("g") == ["c1"]
    clock.advance(broker.config.consumer_expiry_ms + 1)
    assert broker.consumer_ids("g") == []


def test_offsets_are_written_periodically_not_only_at_shutdown(
    make_broker: BrokerFactory, clock: ManualClock
) -> None:
    import json

    b = make_broker(flush_offset_interval_ms=5_000)
    b.create_topic("t", queues=1)
    path = b.store.config.config_dir / "consumerOffset.json"
    b.commit_offset("g", "t", 0, 42)
    clock.advance(4_999)
    b.do_maintenance()
    before = json.loads(path.read_text()) if path.exists() else {}
    assert before.get("offsetTable", {}).get("t@g") is None
    clock.advance(1)
    b.do_maintenance()
    assert json.loads(path.read_text())["offsetTable"]["t@g"] == {"0": 42}


def test_disabled_group_cannot_consume(broker: Broker) -> None:
    from broker.errors import ConsumeDisabled

    broker.create_topic("t", queues=1)
    broker.create_group("off", consume_enable=False)
    with pytest.raises(ConsumeDisabled):
        broker.pull_message("off", "t", 0, 0)
    with pytest.raises(ConsumeDisabled):
        broker.receive("off", "t", 1, invisible_ms=1_000)


def test_heartbeat_accepts_tag_expressions(broker: Broker) -> None:
    broker.heartbeat("c1", "g", {"t": "a || b", "u": "*"})
    assert broker.consumer_ids("g") == ["c1"]


def test_consumer_progress(broker: Broker) -> None:
    broker.create_topic("t", queues=2)
    for i in range(5):
        broker.send_message(msg("t", queue_id=i % 2))
    settle(broker)
    broker.commit_offset("g", "t", 0, 1)
    got = broker.receive("p", "t", 2, invisible_ms=1_000)
    assert len(got) == 2
    rows = {(r.topic, r.queue_id): r for r in broker.consumer_progress("g")}
    assert rows[("t", 0)].broker_offset == 3 and rows[("t", 0)].lag == 2
    assert rows[("t", 1)].consumer_offset == -1 and rows[("t", 1)].lag == 2
    pop_rows = broker.consumer_progress("p", "t")
    assert sum(r.in_flight for r in pop_rows) == 2


def _not_called(*_args: object, **_kw: object) -> None:
    raise AssertionError("the other store path was taken")


def test_a_producers_batch_is_one_record_batch_with_per_message_results(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages differing only in body, KEYS and UNIQ_KEY go through put_batch; each still
    gets its own record, offset message id and queue offset, readable by key."""
    monkeypatch.setattr(broker.store, "put_messages", _not_called)
    broker.create_topic("t", queues=2)
    broker.send_message(msg("t", b"before", queue_id=1))
    batch = [
        Message(
            "t",
            f"body-{i}".encode(),
            queue_id=1,
            properties={
                Prop.TAGS: "paid",
                "tenant": "acme",
                Prop.KEYS: f"order-{i}",
                Prop.UNIQ_KEY: f"U{i:031d}",
            },
        )
        for i in range(6)
    ]
    results = broker.send_batch(batch)
    assert [r.queue_offset for r in results] == [1, 2, 3, 4, 5, 6]
    assert [r.msg_id for r in results] == [f"U{i:031d}" for i in range(6)]
    assert len({r.offset_msg_id for r in results}) == 6
    for i, r in enumerate(results):
        stored = broker.store.look_message_by_offset(r.commitlog_offset)
        assert stored is not None and stored.body == f"body-{i}".encode()
        assert stored.properties == batch[i].properties
        assert stored.queue_offset == r.queue_offset
        assert r.offset_msg_id.endswith(f"{r.commitlog_offset:016X}")
    assert broker.store.wait_dispatched(10)
    found = broker.store.query_message_by_key("t", "order-4")
    assert [m.body for m in found] == [b"body-4"]
    assert [m.body for m in drain(broker, "g", "t")] == [b"before"] + [
        f"body-{i}".encode() for i in range(6)
    ]


def test_a_mixed_batch_is_stored_message_by_message(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(broker.store, "put_batch", _not_called)
    broker.create_topic("t", queues=1)
    mixed = [
        Message("t", b"a", properties={Prop.TAGS: "x"}),
        Message("t", b"b", properties={Prop.TAGS: "y"}),
    ]  # TAGS differ
    results = broker.send_batch(mixed)
    assert [r.queue_offset for r in results] == [0, 1]
    assert [m.tags for m in drain(broker, "g", "t")] == ["x", "y"]


def test_a_batch_too_big_as_a_whole_is_stored_message_by_message(tmp_path: Path) -> None:
    """put_batch caps a batch's total at the store's max_message_size (RocketMQ's rule);
    send_batch then stores the messages one by one, as it always did."""
    config = dataclasses.replace(store_config(tmp_path), max_message_size=1000)
    b = Broker(config, broker_config())
    b.start()
    try:
        b.create_topic("t", queues=1)
        results = b.send_batch([Message("t", bytes([i]) * 400) for i in range(4)])
        assert [r.queue_offset for r in results] == [0, 1, 2, 3]
        assert [m.body[:1] for m in drain(b, "g", "t")] == [b"\x00", b"\x01", b"\x02", b"\x03"]
    finally:
        b.shutdown()


def test_send_bodies_stores_the_records_send_batch_would(broker: Broker) -> None:
    """The in-process client's batch: bodies and unique keys, shared properties; each
    record as `send_batch` of the equivalent messages stores it, with its own offsets."""
    broker.create_topic("t", queues=2)
    broker.send_message(msg("t", b"before", queue_id=1))
    ids = [f"U{i:031d}" for i in range(4)]
    result = broker.send_bodies(
        "t", 1, [f"b{i}".encode() for i in range(4)], ids, {Prop.SHARDING_KEY: "g1"}
    )
    assert result is not None and result.append is not None
    append = result.append
    assert append.queue_offset == 1 and append.msg_num == 4
    for i, offset in enumerate(append.record_offsets):
        stored = broker.store.look_message_by_offset(offset)
        assert stored is not None and stored.body == f"b{i}".encode()
        assert stored.properties == {Prop.SHARDING_KEY: "g1", Prop.UNIQ_KEY: ids[i]}
        assert stored.queue_offset == 1 + i and stored.queue_id == 1
        assert append.msg_id_at(offset) == stored.offset_msg_id
    assert [m.body for m in drain(broker, "g", "t")] == [b"before"] + [
        f"b{i}".encode() for i in range(4)
    ]


def test_send_bodies_validates_as_send_batch_does(broker: Broker) -> None:
    broker.create_topic("t", queues=1)
    broker.create_topic("ro", queues=1, perm=PERM_READ)
    limit = broker.config.max_message_size
    with pytest.raises(BodyOverLimit):
        broker.send_bodies("t", 0, [b"a", b"x" * (limit + 1)], ["A", "B"])
    with pytest.raises(MessageIllegal):
        broker.send_bodies("t", 0, [b"a", b""], ["A", "B"])
    with pytest.raises(MessageIllegal):
        broker.send_bodies("t", 0, [b"a", b"b"], ["A", "B\x01"])
    with pytest.raises(MessageIllegal):
        broker.send_bodies("t", 0, [b"a"], ["A"], {Prop.DELAY: "1"})
    with pytest.raises(MessageIllegal):
        broker.send_bodies("t", 1, [b"a"], ["A"])  # no such queue
    with pytest.raises(MessageIllegal):
        broker.send_bodies("t", 0, [b"a", b"b"], ["A"])  # a key per body
    with pytest.raises(NoPermission):
        broker.send_bodies("ro", 0, [b"a"], ["A"])
    settle(broker)
    assert broker.max_offset("t", 0) == 0  # nothing stored
