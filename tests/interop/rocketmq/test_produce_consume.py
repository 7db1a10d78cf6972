"""The framework's producer and SimpleConsumer on Apache RocketMQ 5's proxy, feature by
feature: sync, async, oneway and batch sends, message groups (FIFO), delay levels,
delivery times and recall, transactions with the broker's check-back, receive / ack /
change invisible duration.

The session's cluster checks half messages every second and asks about any older than
2 s (conftest.py), so a check-back arrives within seconds. `check_back_commits` is the
scenario both ways: it passes on that broker and fails on one whose check is off
(`test_check_back_fails_on_a_broker_that_does_not_check`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from concurrent.futures import Future

import pytest

from apache_rocketmq import MessageType, RocketMQCluster
from reliable import (
    BrokerCallError,
    ConfigurationError,
    Message,
    Producer,
    ReceivedMessage,
    SendReceipt,
    SimpleConsumer,
    TransactionState,
)
from tests.interop.rocketmq.helpers import (
    TRANSACTION_TIMEOUT_MS,
    drain,
    grpc_transport,
    receive,
    unique,
)


def _topic_and_group(
    cluster: RocketMQCluster,
    prefix: str,
    kind: MessageType = MessageType.NORMAL,
    *,
    orderly: bool = False,
) -> tuple[str, str]:
    topic, group_name = unique(prefix), unique(f"{prefix}-g")
    cluster.create_topic(topic, kind)
    cluster.create_group(group_name, orderly=orderly)
    return topic, group_name


def test_sync_async_oneway_and_batch_sends_arrive_once(rocketmq: RocketMQCluster) -> None:
    topic, group = _topic_and_group(rocketmq, "sends")
    with (
        grpc_transport(rocketmq.endpoint) as transport,
        SimpleConsumer(group, {topic: "*"}, transport=transport, await_duration_s=2) as consumer,
        Producer(transport) as producer,
    ):
        ids = [producer.send(Message(topic, b"sync-%d" % i)).message_id for i in range(3)]
        futures: list[Future[SendReceipt]] = [
            producer.send_async(Message(topic, b"async-%d" % i)) for i in range(3)
        ]
        ids += [f.result(timeout=10).message_id for f in futures]
        oneway = Message(topic, b"oneway")
        producer.send_oneway(oneway)
        ids.append(oneway.message_id)
        ids += [
            r.message_id
            for r in producer.send_batch([Message(topic, b"batch-%d" % i) for i in range(4)])
        ]
        got = drain(consumer, len(ids))
        assert sorted(m.message_id for m in got) == sorted(ids)
        assert {m.body for m in got} >= {b"sync-0", b"async-2", b"oneway", b"batch-3"}


def test_message_groups_are_delivered_in_order(rocketmq: RocketMQCluster) -> None:
    topic, group = _topic_and_group(rocketmq, "fifo", MessageType.FIFO, orderly=True)
    with (
        grpc_transport(rocketmq.endpoint) as transport,
        SimpleConsumer(
            group, {topic: "*"}, transport=transport, await_duration_s=2, fifo=True
        ) as consumer,
        Producer(transport) as producer,
    ):
        for i in range(5):
            for key in ("a", "b", "c"):
                producer.send(Message(topic, f"{key}{i}".encode(), message_group=key))
        seen: dict[str, list[int]] = defaultdict(list)
        for m in drain(consumer, 15):
            seen[m.message_group or ""].append(int(m.body[1:]))
        assert dict(seen) == {k: [0, 1, 2, 3, 4] for k in "abc"}


def test_a_fifo_receive_on_a_group_that_is_not_fifo_refuses_to_start(
    rocketmq: RocketMQCluster,
) -> None:
    topic, group = _topic_and_group(rocketmq, "fifo-nf", MessageType.FIFO)  # group not orderly
    with grpc_transport(rocketmq.endpoint) as transport:
        consumer = SimpleConsumer(group, {topic: "*"}, transport=transport, fifo=True)
        with pytest.raises(ConfigurationError, match="not FIFO") as refused:
            consumer.start()
        assert "\n" not in str(refused.value)
        assert f"mqadmin updateSubGroup -g {group} -o true" in str(refused.value)
        with SimpleConsumer(group, {topic: "*"}, transport=transport) as unordered:
            assert unordered.receive(max_messages=1) == []  # without fifo it is served


def test_delay_level_delivery_time_and_recall(rocketmq: RocketMQCluster) -> None:
    topic, group = _topic_and_group(rocketmq, "delay", MessageType.DELAY)
    with (
        grpc_transport(rocketmq.endpoint) as transport,
        SimpleConsumer(group, {topic: "*"}, transport=transport, await_duration_s=1) as consumer,
        Producer(transport) as producer,
    ):
        receive(consumer, 1)  # the group is known before the sends
        start = time.time()
        producer.send(Message(topic, b"level-1", delay_level=1))  # 1 s on the default ladder
        producer.send(Message(topic, b"at+3s", deliver_at_ms=int((start + 3) * 1000)))
        recalled = producer.send(Message(topic, b"recalled", deliver_at_ms=int((start + 3) * 1000)))
        producer.recall(recalled)
        arrived: dict[bytes, float] = {}
        deadline = time.monotonic() + 20
        while len(arrived) < 2 and time.monotonic() < deadline:
            for m in receive(consumer, 4):
                arrived[m.body] = time.time() - start
                consumer.ack(m)
        time.sleep(1.0)  # anything recalled would have come with "at+3s"
        for m in receive(consumer, 4):
            arrived[m.body] = time.time() - start
        assert set(arrived) == {b"level-1", b"at+3s"}, arrived
        assert 0.8 <= arrived[b"level-1"] < 3 + 2, arrived
        assert 2.8 <= arrived[b"at+3s"] < 3 + 5, arrived


def _transactions(
    cluster: RocketMQCluster, *, wait_s: float
) -> tuple[dict[bytes, int], list[bytes]]:
    """Commit, roll back, and leave one UNKNOWN for the check-back (which commits it):
    what the consumer got (body -> count) within `wait_s`, and what the checker was asked."""
    topic, group = _topic_and_group(cluster, "tx", MessageType.TRANSACTION)
    checked: list[bytes] = []

    def checker(message: ReceivedMessage) -> TransactionState:
        checked.append(message.body)
        return TransactionState.COMMIT

    with (
        grpc_transport(cluster.endpoint) as transport,
        SimpleConsumer(group, {topic: "*"}, transport=transport, await_duration_s=1) as consumer,
        Producer(transport, transaction_checker=checker) as producer,
    ):
        receive(consumer, 1)
        producer.send_in_transaction(
            Message(topic, b"commit"), lambda m, a: TransactionState.COMMIT
        )
        producer.send_in_transaction(Message(topic, b"rollback"), lambda m, a: False)
        producer.send_in_transaction(
            Message(topic, b"unknown"), lambda m, a: TransactionState.UNKNOWN
        )
        got: dict[bytes, int] = defaultdict(int)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and got.get(b"unknown", 0) == 0:
            for m in receive(consumer, 4):
                got[m.body] += 1
                consumer.ack(m)
        for m in receive(consumer, 4):  # a late rollback would show here
            got[m.body] += 1
            consumer.ack(m)
    return dict(got), checked


def receive_within(consumer: SimpleConsumer, timeout_s: float) -> list[ReceivedMessage]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = receive(consumer, 1)
        if got:
            return got
    return []


def check_back_commits(cluster: RocketMQCluster, *, wait_s: float = 20.0) -> None:
    got, checked = _transactions(cluster, wait_s=wait_s)
    # the rollback never arrives, both others do; the checked-back one may arrive twice:
    # the broker checks every second, and on a loaded machine a second check can be asked
    # (and committed) before the first answer is recorded (at least once, as Apache
    # RocketMQ promises for transactions; the idempotency guard absorbs the copy)
    assert set(got) == {b"commit", b"unknown"}, got
    assert b"unknown" in checked, checked


def test_transactions_commit_roll_back_and_are_checked_back(rocketmq: RocketMQCluster) -> None:
    check_back_commits(rocketmq)


def test_receive_ack_and_change_invisible_duration(rocketmq: RocketMQCluster) -> None:
    topic, group = _topic_and_group(rocketmq, "simple")
    with (
        grpc_transport(rocketmq.endpoint) as transport,
        SimpleConsumer(
            group, {topic: "*"}, transport=transport, await_duration_s=1, invisible_duration_s=30
        ) as consumer,
        Producer(transport) as producer,
    ):
        receive(consumer, 1)
        sent = producer.send(Message(topic, b"job")).message_id
        (m,) = receive_within(consumer, 20)
        assert m.message_id == sent and m.delivery_attempt == 1
        consumer.change_invisible_duration(m, 1)  # give it back in a second, not 30
        (m2,) = receive_within(consumer, 40)
        assert m2.message_id == sent and m2.delivery_attempt == 2
        consumer.ack(m2)
        time.sleep(1.5)
        assert receive(consumer, 1) == []  # acked: never again


def test_recall_on_a_broker_that_forbids_it_fails_at_the_call(rocketmq: RocketMQCluster) -> None:
    """Recall is off by default in Apache RocketMQ (`recallMessageEnable`): the call fails
    with a typed error saying so, and the message is still delivered when due. (The proxy
    answers INTERNAL_SERVER_ERROR, which the producer reads as `try_elsewhere`: see
    docs/rocketmq.md.)"""
    topic, group = _topic_and_group(rocketmq, "norecall", MessageType.DELAY)
    rocketmq.update_broker_config({"recallMessageEnable": False})
    try:
        with (
            grpc_transport(rocketmq.endpoint) as transport,
            SimpleConsumer(group, {topic: "*"}, transport=transport, await_duration_s=1) as c,
            Producer(transport) as producer,
        ):
            receive(c, 1)
            due = int((time.time() + 2) * 1000)
            receipt = producer.send(Message(topic, b"kept", deliver_at_ms=due))
            with pytest.raises(BrokerCallError, match="recall failed, operation is forbidden"):
                producer.recall(receipt)
            assert [m.body for m in drain(c, 1, timeout_s=20)] == [b"kept"]
    finally:
        rocketmq.update_broker_config({"recallMessageEnable": True})


def test_check_back_fails_on_a_broker_that_does_not_check(rocketmq: RocketMQCluster) -> None:
    """The suite notices a server without the feature: with the broker told to check no
    half message younger than an hour, the check-back scenario above fails. (The setting
    is restored after; the slowness once blamed on such changes was the broker's timer
    out of direct memory, see apache_rocketmq/cluster.py.)"""
    rocketmq.update_broker_config({"transactionTimeOut": 3_600_000})
    try:
        time.sleep(1.5)  # a check round already running finishes under the old setting
        with pytest.raises(AssertionError, match="unknown"):
            check_back_commits(rocketmq, wait_s=6.0)
    finally:
        rocketmq.update_broker_config({"transactionTimeOut": TRANSACTION_TIMEOUT_MS})
