"""The framework and the official Python client against Apache RocketMQ 5's own proxy.

The first step of the interop suite: a send, a receive and an ack through the real proxy,
by our `Producer` and `SimpleConsumer` over the grpc transport, and by the official client.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import reliable
from apache_rocketmq import RocketMQCluster, admin
from apache_rocketmq.cluster import query_route
from reliable import Message, Producer, SimpleConsumer
from tests.e2e.grpc import official


def names(prefix: str) -> tuple[str, str]:
    run = uuid.uuid4().hex[:8]
    return f"{prefix}-{run}", f"{prefix}-g-{run}"


def test_a_created_topic_is_routed_when_create_topic_returns(rocketmq: RocketMQCluster) -> None:
    """The name server knows it before any client asks the proxy (which would otherwise
    remember the miss for about 20 s)."""
    topic, _ = names("smoke-route")
    namesrv = rocketmq.broker_address[0], rocketmq.ports.namesrv
    assert not admin.routed(namesrv, topic)
    rocketmq.create_topic(topic)
    assert admin.routed(namesrv, topic)
    assert query_route(rocketmq.endpoint, topic) == "OK"


def test_framework_sends_receives_and_acks(rocketmq: RocketMQCluster) -> None:
    topic, group = names("smoke-fw")
    rocketmq.create_topic(topic)
    rocketmq.create_group(group)
    transport = reliable.connect("grpc", endpoint=rocketmq.endpoint)
    transport.start()
    try:
        with (
            SimpleConsumer(
                group,
                {topic: "*"},
                transport=transport,
                await_duration_s=5,
                invisible_duration_s=15,
            ) as consumer,
            Producer(transport) as producer,
        ):
            sent = {}
            for i in range(10):
                m = Message(
                    topic, f"b{i}".encode(), tags="t", keys=[f"k{i}"], properties={"n": str(i)}
                )
                sent[producer.send(m).message_id] = i
            got: dict[str, int] = {}

            def all_in() -> bool:
                for msg in consumer.receive(max_messages=16):
                    i = sent[msg.message_id]
                    assert (msg.body, msg.tags, msg.keys, msg.properties.get("n")) == (
                        f"b{i}".encode(),
                        "t",
                        [f"k{i}"],
                        str(i),
                    )
                    consumer.ack(msg)
                    got[msg.message_id] = got.get(msg.message_id, 0) + 1
                return set(got) == set(sent)

            assert official.wait_for(all_in, timeout_s=60, interval_s=0)
            assert max(got.values()) == 1
    finally:
        transport.close()


def test_official_client_sends_receives_and_acks(
    rocketmq: RocketMQCluster, official_client_home: Path
) -> None:
    topic, group = names("smoke-official")
    rocketmq.create_topic(topic)
    rocketmq.create_group(group)
    producer = official.producer(rocketmq.endpoint, [topic])
    consumer = official.simple_consumer(rocketmq.endpoint, group, topic, await_s=5)
    try:
        sent = {}
        for i in range(10):
            body = f"o{i}".encode()
            sent[producer.send(official.message(topic, body)).message_id] = body
        got: list[str] = []

        def all_in() -> bool:
            for msg in consumer.receive(16, 15):
                assert msg.body == sent[msg.message_id]
                consumer.ack(msg)
                got.append(msg.message_id)
            return set(got) == set(sent)

        assert official.wait_for(all_in, timeout_s=60, interval_s=0)
        assert len(got) == len(sent)
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_the_broker_s_spinning_thread_only_takes_an_idle_core(rocketmq: RocketMQCluster) -> None:
    """The transaction op batch thread spins from the first ended transaction on
    (docs/rocketmq.md): the start gives it the idle scheduling class."""
    pid = rocketmq.pids["proxy"]

    def name(tid: str) -> str:  # a JVM thread can end between the listing and the read
        try:
            return Path(f"/proc/{pid}/task/{tid}/comm").read_text()
        except FileNotFoundError:
            return ""

    spinning = [
        int(tid)
        for tid in os.listdir(f"/proc/{pid}/task")
        if name(tid).startswith("TransactionalOp")
    ]
    assert spinning
    assert all(os.sched_getscheduler(tid) == os.SCHED_IDLE for tid in spinning)
