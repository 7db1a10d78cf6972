"""The official Producer and SimpleConsumer against our server (a real subprocess)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.grpc import official
from tests.e2e.grpc.server_process import ServerProcess


def test_thousand_messages_no_loss_no_duplicates(server: ServerProcess) -> None:
    consumer = official.simple_consumer(server.endpoint, "g-thousand", "t-thousand")
    producer = official.producer(server.endpoint, ["t-thousand"])
    try:
        sent = {
            producer.send(official.message("t-thousand", f"m{i}".encode())).message_id
            for i in range(1000)
        }
        assert len(sent) == 1000
        got = official.receive_until(consumer, lambda g: len(g) >= 1000, timeout_s=60)
        ids = Counter(m.message_id for m in got)
        assert set(ids) == sent
        assert max(ids.values()) == 1
        # nothing more arrives: every ack took
        assert consumer.receive(32, 15) == []
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_tags_keys_properties_survive_and_tags_filter(server: ServerProcess) -> None:
    consumer = official.simple_consumer(server.endpoint, "g-tags", "t-tags", tag="red || blue")
    producer = official.producer(server.endpoint, ["t-tags"])
    try:
        wanted = {}
        for i, tag in enumerate(["red", "green", "blue", "green", "red"]):
            msg = official.message(
                "t-tags",
                f"body-{i}".encode(),
                tag=tag,
                keys=[f"k{i}", f"order-{i}"],
                props={"tenant": "acme", "n": str(i)},
            )
            receipt = producer.send(msg)
            if tag != "green":
                wanted[receipt.message_id] = (tag, i)
        got = official.receive_until(consumer, lambda g: len(g) >= 3)
        assert {m.message_id for m in got} == set(wanted)
        for m in got:
            tag, i = wanted[m.message_id]
            assert m.tag == tag
            assert sorted(m.keys) == sorted([f"k{i}", f"order-{i}"])
            assert m.properties == {"tenant": "acme", "n": str(i)}
            assert m.body == f"body-{i}".encode()
            assert m.delivery_attempt == 1
            assert not m.corrupted
        assert consumer.receive(32, 15) == []  # the green ones never come
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_redelivery_after_invisible_time_increments_attempt(server: ServerProcess) -> None:
    consumer = official.simple_consumer(server.endpoint, "g-redeliver", "t-redeliver")
    producer = official.producer(server.endpoint, ["t-redeliver"])
    try:
        mid = producer.send(official.message("t-redeliver", b"x")).message_id
        first = official.receive_until(consumer, lambda g: len(g) >= 1, invisible_s=1, ack=False)
        assert [(m.message_id, m.delivery_attempt) for m in first] == [(mid, 1)]
        again = official.receive_until(consumer, lambda g: len(g) >= 1, invisible_s=1, ack=False)
        assert [(m.message_id, m.delivery_attempt) for m in again] == [(mid, 2)]
        # the first handle is dead now
        from rocketmq.v5.exception import BadRequestException

        with pytest.raises(BadRequestException):
            consumer.ack(first[0])
        consumer.ack(again[0])
        assert consumer.receive(32, 1) == []
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_change_invisible_duration_returns_new_handle(server: ServerProcess) -> None:
    consumer = official.simple_consumer(server.endpoint, "g-change", "t-change")
    producer = official.producer(server.endpoint, ["t-change"])
    try:
        mid = producer.send(official.message("t-change", b"x")).message_id
        (m,) = official.receive_until(consumer, lambda g: len(g) >= 1, invisible_s=60, ack=False)
        old_handle = m.receipt_handle
        consumer.change_invisible_duration(m, 1)  # the client swaps in the new handle
        assert m.receipt_handle != old_handle
        started = time.monotonic()
        again = official.receive_until(
            consumer, lambda g: len(g) >= 1, invisible_s=30, ack=False, timeout_s=20
        )
        assert [(x.message_id, x.delivery_attempt) for x in again] == [(mid, 2)]
        assert time.monotonic() - started < 20  # well before the original 60 s
        consumer.ack(again[0])
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_dead_letter_after_max_attempts(server: ServerProcess) -> None:
    from reliable.admin import AdminClient

    admin = AdminClient(server.endpoint)
    admin.call("CreateGroup", name="g-dlq", max_retries=1)  # 2 deliveries, then the DLQ
    admin.close()
    consumer = official.simple_consumer(server.endpoint, "g-dlq", "t-dlq")
    producer = official.producer(server.endpoint, ["t-dlq"])
    try:
        msg = official.message(
            "t-dlq", b"poison", tag="p", keys=["poison-1"], props={"why": "test"}
        )
        mid = producer.send(msg).message_id
        attempts = []
        began = time.monotonic()
        # the official Python client picks each receive's queue afresh at random (its
        # simple consumer builds a new round-robin selector with a random start on every
        # receive): against a cluster, the broker holding the message may go unasked for
        # several receives in a row, each waiting out its 2 s long poll
        deadline = began + 60
        calls = []  # (start s, duration s, messages) of each receive: why, if it fails
        while time.monotonic() < deadline and len(attempts) < 2:
            t = time.monotonic()
            got = consumer.receive(32, 1)
            calls.append((round(t - began, 2), round(time.monotonic() - t, 2), len(got)))
            for m in got:
                attempts.append((m.message_id, m.delivery_attempt))  # never acked
        assert attempts == [(mid, 1), (mid, 2)], calls
        dlq = official.simple_consumer(server.endpoint, "g-dlq-reader", "%DLQ%g-dlq")
        try:
            got = official.receive_until(dlq, lambda g: len(g) >= 1, timeout_s=20)
            assert [m.message_id for m in got] == [mid]
            assert got[0].body == b"poison" and got[0].tag == "p"
            assert set(got[0].keys) == {"poison-1"} and got[0].properties.get("why") == "test"
            assert consumer.receive(32, 1) == []  # dead-lettered, not delivered a third time
        finally:
            dlq.shutdown()
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_resent_message_id_is_stored_once_even_across_a_restart(
    make_server: Any, tmp_path: Path
) -> None:
    import uuid

    import grpc

    from protocol.pb import service_pb2, service_pb2_grpc

    store = tmp_path / "dedupe-store"
    request = service_pb2.SendMessageRequest()
    msg = request.messages.add()
    msg.topic.name, msg.body = "t-dedupe", b"once"
    msg.system_properties.message_id = uuid.uuid4().hex.upper()
    msg.system_properties.message_type = 1
    md = [("x-mq-client-id", "dedupe-test")]

    def send(endpoint: str) -> Any:
        with grpc.insecure_channel(endpoint) as channel:
            return service_pb2_grpc.MessagingServiceStub(channel).SendMessage(
                request, metadata=md, timeout=10
            )

    server = make_server(store=store)
    first = send(server.endpoint)
    again = send(server.endpoint)  # a retry after a lost answer
    assert first.status.code == again.status.code == 20000
    assert first.entries[0].offset == again.entries[0].offset
    assert server.terminate() == 0
    server = make_server(store=store)
    after_restart = send(server.endpoint)
    assert after_restart.entries[0].offset == first.entries[0].offset
    consumer = official.simple_consumer(server.endpoint, "g-dedupe", "t-dedupe")
    try:
        got = official.receive_until(consumer, lambda g: len(g) >= 1)
        got += consumer.receive(32, 15)
        assert [m.message_id for m in got] == [msg.system_properties.message_id]
    finally:
        consumer.shutdown()


def test_change_invisible_duration_to_zero_makes_it_visible_now(server: ServerProcess) -> None:
    consumer = official.simple_consumer(server.endpoint, "g-zero", "t-zero")
    producer = official.producer(server.endpoint, ["t-zero"])
    try:
        mid = producer.send(official.message("t-zero", b"x")).message_id
        (m,) = official.receive_until(consumer, lambda g: len(g) >= 1, invisible_s=60, ack=False)
        consumer.change_invisible_duration(m, 0)  # what a push consumer's 0 s backoff sends
        again = official.receive_until(consumer, lambda g: len(g) >= 1, timeout_s=20)
        assert [(x.message_id, x.delivery_attempt) for x in again] == [(mid, 2)]
    finally:
        producer.shutdown()
        consumer.shutdown()
