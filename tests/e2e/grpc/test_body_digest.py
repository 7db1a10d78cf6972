"""The official Python client verifies each delivered body's digest and finds none corrupted.

The bodies are crafted so that their CRC32 hex has leading zeros (tests/interop/bodies.py):
the ones a CRC32 digest gets wrong for some official client. The server sends the Apache
proxy's MD5 digest (docs/server.md, "The body digest"), which this client checks too: a
body it finds corrupted is flagged on a simple consumer, never reaches a push consumer's
listener, and a FIFO push consumer ends it in the dead-letter queue.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

from reliable.admin import AdminClient
from tests.e2e.grpc import official
from tests.e2e.grpc.server_process import ServerProcess
from tests.interop.bodies import all_bodies, crc_hex, leading_zero_crc

BODIES = all_bodies()


def test_the_bodies_have_crc32_digits_a_client_could_misread() -> None:
    assert leading_zero_crc(BODIES) >= 12
    assert any(crc_hex(b).startswith("0000") for b in BODIES)


def test_a_simple_consumer_receives_every_body_unflagged(server: ServerProcess) -> None:
    consumer = official.simple_consumer(server.endpoint, "g-digest-simple", "t-digest-simple")
    producer = official.producer(server.endpoint, ["t-digest-simple"])
    try:
        for body in BODIES:
            producer.send(official.message("t-digest-simple", body))
        got = official.receive_until(consumer, lambda g: len(g) >= len(BODIES), timeout_s=30)
    finally:
        producer.shutdown()
        consumer.shutdown()
    assert sorted(m.body for m in got) == sorted(BODIES)
    assert [crc_hex(m.body) for m in got if m.corrupted] == []


class Listener:
    """Records the bodies a push consumer's listener is called with, per message group."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bodies: list[bytes] = []
        self.by_group: dict[str | None, list[bytes]] = defaultdict(list)

    def consumer(self, endpoint: str, group: str, topic: str) -> Any:
        from rocketmq import ConsumeResult, FilterExpression, MessageListener, PushConsumer

        outer = self

        class Recording(MessageListener):  # type: ignore[misc]
            def consume(self, message: Any) -> Any:
                with outer.lock:
                    outer.bodies.append(message.body)
                    outer.by_group[message.message_group].append(message.body)
                return ConsumeResult.SUCCESS

        consumer = PushConsumer(
            official.configuration(endpoint),
            group,
            Recording(),
            {topic: FilterExpression("*")},
            consumption_thread_count=4,
        )
        consumer.startup()
        return consumer

    def has_all(self) -> bool:
        with self.lock:
            return set(self.bodies) >= set(BODIES)


def test_a_push_consumer_listener_gets_every_body(server: ServerProcess) -> None:
    listener = Listener()
    consumer = listener.consumer(server.endpoint, "g-digest-push", "t-digest-push")
    producer = official.producer(server.endpoint, ["t-digest-push"])
    try:
        for body in BODIES:
            producer.send(official.message("t-digest-push", body))
        assert official.wait_for(listener.has_all, timeout_s=30), [
            crc_hex(b) for b in set(BODIES) - set(listener.bodies)
        ]
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_a_fifo_push_consumer_gets_every_body_in_order_and_dead_letters_none(
    server: ServerProcess,
) -> None:
    admin = AdminClient(server.endpoint)
    try:
        admin.call("CreateTopic", name="t-digest-fifo", queues=2, type="FIFO")
        admin.call("CreateGroup", name="g-digest-fifo", fifo=True, max_retries=1)
    finally:
        admin.close()
    listener = Listener()
    consumer = listener.consumer(server.endpoint, "g-digest-fifo", "t-digest-fifo")
    producer = official.producer(server.endpoint, ["t-digest-fifo"])
    sent: dict[str, list[bytes]] = defaultdict(list)
    try:
        for i, body in enumerate(BODIES):
            group = f"mg-{i % 3}"
            producer.send(official.message("t-digest-fifo", body, group=group))
            sent[group].append(body)
        assert official.wait_for(listener.has_all, timeout_s=30)
    finally:
        producer.shutdown()
        consumer.shutdown()
    with listener.lock:
        assert {g: list(dict.fromkeys(b)) for g, b in listener.by_group.items()} == sent
    admin = AdminClient(server.endpoint)
    try:
        assert dead_letters(admin, "g-digest-fifo") == 0
    finally:
        admin.close()


def dead_letters(admin: AdminClient, group: str) -> int:
    """How many messages `%DLQ%<group>` holds (none when it was never created)."""
    topics = {t["name"] for t in admin.call("ListTopics")["topics"]}
    if f"%DLQ%{group}" not in topics:
        return 0
    queues = admin.call("GetTopic", name=f"%DLQ%{group}")["queues"]
    return sum(q["max_offset"] - q["min_offset"] for q in queues)
