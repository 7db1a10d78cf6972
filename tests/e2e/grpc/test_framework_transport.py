"""The framework's own producer and consumers: the same code over both transports.

`transport` is the only difference between the runs: the embedded broker in-process, or
our gRPC server in a subprocess through `reliable.transport.grpc`.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

import reliable
from reliable import (
    BadRequest,
    ConsumeContext,
    ConsumeResult,
    InvalidMessage,
    Message,
    Producer,
    PushConsumer,
    ReceivedMessage,
    SimpleConsumer,
    Transport,
)
from tests.e2e.grpc import official
from tests.e2e.grpc.server_process import ServerProcess


def unique(name: str, transport: Transport) -> str:
    return f"{name}-{transport.name}"


def test_send_and_receive_with_invisible_time(transport: Transport) -> None:
    topic, group = unique("fw-simple", transport), unique("fw-simple-g", transport)
    with (
        SimpleConsumer(
            group, {topic: "*"}, transport=transport, await_duration_s=1, invisible_duration_s=15
        ) as consumer,
        Producer(transport) as producer,
    ):
        sent = {}
        for i in range(100):
            m = Message(
                topic,
                f"b{i}".encode(),
                tags="t" if i % 2 else "u",
                keys=[f"k{i}"],
                properties={"n": str(i)},
            )
            sent[producer.send(m).message_id] = i
        got: Counter[str] = Counter()

        def all_in() -> bool:
            for msg in consumer.receive(max_messages=32):
                i = sent[msg.message_id]
                assert (msg.body, msg.keys, msg.properties.get("n")) == (
                    f"b{i}".encode(),
                    [f"k{i}"],
                    str(i),
                )
                assert msg.tags == ("t" if i % 2 else "u")
                consumer.ack(msg)
                got[msg.message_id] += 1
            return set(got) == set(sent)

        assert official.wait_for(all_in, timeout_s=60, interval_s=0)
        assert max(got.values()) == 1
        assert consumer.receive(max_messages=32) == []


def test_push_consumer_handler_with_retries(transport: Transport) -> None:
    topic, group = unique("fw-push", transport), unique("fw-push-g", transport)
    lock = threading.Lock()
    attempts: dict[str, list[int]] = {}
    done: Counter[str] = Counter()

    def listener(messages: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        with lock:
            for m in messages:
                attempts.setdefault(m.message_id, []).append(m.delivery_attempt)
                if m.body.endswith(b"7") and m.delivery_attempt == 1:
                    return ConsumeResult.RECONSUME_LATER
                done[m.message_id] += 1
        return ConsumeResult.SUCCESS

    with Producer(transport) as producer:
        consumer = PushConsumer(
            group,
            listener,
            {topic: "*"},
            transport=transport,
            consume_from=reliable.ConsumeFrom.FIRST,
            consume_threads=4,
            rebalance_interval_s=0.2,
            heartbeat_interval_s=0.5,
            pull_suspend_ms=200,
            receive_long_poll_ms=1000,
            invisible_ms=15_000,
        )
        with consumer:
            sent = {producer.send(Message(topic, f"p{i}".encode())).message_id for i in range(50)}
            assert official.wait_for(lambda: set(done) == sent, timeout_s=60)
    with lock:
        retried = [mid for mid, seen in attempts.items() if seen[0] == 1 and len(seen) > 1]
        assert len(retried) == 5
        assert all(attempts[mid] == [1, 2] for mid in retried)
        assert max(done.values()) == 1


def test_transaction_checked_back_over_grpc(server: ServerProcess) -> None:
    t = reliable.connect("grpc", endpoint=server.endpoint)
    t.start()
    asked: list[str] = []

    def checker(message: ReceivedMessage) -> reliable.TransactionState:
        asked.append(message.message_id)
        return reliable.TransactionState.COMMIT

    try:
        with (
            Producer(t, transaction_checker=checker) as producer,
            SimpleConsumer(
                "fw-tx-g", {"fw-tx": "*"}, transport=t, await_duration_s=1, invisible_duration_s=15
            ) as consumer,
        ):
            result = producer.send_in_transaction(
                Message("fw-tx", b"pending"), lambda m, arg: reliable.TransactionState.UNKNOWN
            )
            mid = result.receipt.message_id
            got: list[ReceivedMessage] = []

            def arrived() -> bool:
                for m in consumer.receive(max_messages=8):
                    consumer.ack(m)
                    got.append(m)
                return bool(got)

            assert official.wait_for(arrived, timeout_s=30, interval_s=0)
            assert [m.message_id for m in got] == [mid]
            assert mid in asked
    finally:
        t.close()


def test_handler_decorators_with_retry_and_dead_letter(transport: Transport) -> None:
    from reliable import Worker, dlq_handler, handler

    topic, group = unique("fw-handlers", transport), unique("fw-handlers-g", transport)
    lock = threading.Lock()
    billed: list[tuple[bytes, int]] = []
    dead: list[tuple[bytes, str]] = []

    @handler(topic, group=group, max_reconsume_times=1, consume_from="first")
    def bill(message: ReceivedMessage) -> None:
        if message.body == b"broken":
            raise ValueError("unparseable order")  # retried, then dead-lettered
        if message.body == b"flaky" and message.reconsume_times == 0:
            raise ConnectionError("gateway timeout")  # retried once
        with lock:
            billed.append((message.body, message.delivery_attempt))

    @dlq_handler(group)
    def dead_orders(message: ReceivedMessage) -> None:
        with lock:
            dead.append((message.body, message.properties.get("DLQ_ORIGIN_TOPIC", "")))

    if transport.name == "grpc":  # the group's retry budget lives on the server
        from reliable.admin import AdminClient

        admin = AdminClient(transport.endpoint)  # type: ignore[attr-defined]
        admin.call("CreateGroup", name=group, max_retries=1)
        admin.close()
        transport.heartbeat("warm-up", group, {topic: None})  # learn the server's ladder
    with Worker(bill, dead_orders, transport=transport) as worker:
        with worker.producer() as producer:
            for body in (b"ok", b"flaky", b"broken"):
                producer.send(Message(topic, body))
        assert official.wait_for(lambda: len(billed) >= 2 and len(dead) >= 1, timeout_s=60)
    with lock:
        assert sorted(billed) == [(b"flaky", 2), (b"ok", 1)]
        assert dead == [(b"broken", topic)]


def test_recall_cancels_a_delayed_message(transport: Transport) -> None:
    """The broker's schedule service drops a recalled message: no consumer on any transport
    sees it; a delivered one can no longer be recalled."""
    topic, group = unique("fw-recall", transport), unique("fw-recall-g", transport)
    with (
        SimpleConsumer(
            group, {topic: "*"}, transport=transport, await_duration_s=1, invisible_duration_s=15
        ) as consumer,
        Producer(transport) as producer,
    ):
        now_ms = int(time.time() * 1000)
        doomed = producer.send(Message(topic, b"withdrawn", deliver_at_ms=now_ms + 1500))
        kept = producer.send(Message(topic, b"kept", deliver_at_ms=now_ms + 2000))
        plain = producer.send(Message(topic, b"now"))
        assert doomed.recall_handle and kept.recall_handle and plain.recall_handle is None
        assert producer.recall(doomed) == doomed.message_id
        assert producer.recall(doomed.topic, doomed.recall_handle) == doomed.message_id
        got: list[str] = []
        arrived: dict[str, int | None] = {}

        def kept_arrived() -> bool:
            for msg in consumer.receive(max_messages=32):
                consumer.ack(msg)
                got.append(msg.message_id)
                arrived[msg.message_id] = msg.deliver_at_ms
            return kept.message_id in got

        assert official.wait_for(kept_arrived, timeout_s=30, interval_s=0)
        for msg in consumer.receive(max_messages=32):  # anything due with it is here by now
            got.append(msg.message_id)
        assert sorted(got) == sorted([plain.message_id, kept.message_id])
        assert arrived[kept.message_id] == now_ms + 2000  # when it was due
        assert arrived[plain.message_id] is None
        with pytest.raises(BadRequest, match="already delivered"):
            producer.recall(kept)
        with pytest.raises(BadRequest):
            producer.recall(topic, "1~not~a~handle")
        with pytest.raises(InvalidMessage):
            producer.recall(plain)


class RecordingDelays:
    """A transport seam: records the invisible time of every change_invisible_duration."""

    def __init__(self, inner: Transport) -> None:
        self._inner = inner
        self.delays: list[int] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def change_invisible_duration(
        self, group: str, message: ReceivedMessage, invisible_ms: int
    ) -> str:
        self.delays.append(invisible_ms)
        return self._inner.change_invisible_duration(group, message, invisible_ms)

    def submit_change_invisible(
        self, group: str, message: ReceivedMessage, invisible_ms: int, done: Any
    ) -> None:  # the pipelined form
        self.delays.append(invisible_ms)
        self._inner.submit_change_invisible(  # type: ignore[attr-defined]
            group, message, invisible_ms, done
        )


def test_push_consumer_retries_on_the_servers_ladder_without_warm_up(server: ServerProcess) -> None:
    """A fresh transport and group: the consumer is built before the Settings handshake
    tells the server's ladder, yet its retry waits the server's level 3, not RocketMQ's."""
    topic, group = "fw-ladder", "fw-ladder-g"
    transport = reliable.connect("grpc", endpoint=server.endpoint)
    transport.start()
    seam = RecordingDelays(transport)
    attempts: list[int] = []

    def listener(messages: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        attempts.append(messages[0].delivery_attempt)
        return ConsumeResult.SUCCESS if len(attempts) >= 2 else ConsumeResult.RECONSUME_LATER

    try:
        with (
            Producer(transport) as producer,
            PushConsumer(
                group,
                listener,
                {topic: "*"},
                transport=seam,  # type: ignore[arg-type]
                heartbeat_interval_s=0.5,
                receive_long_poll_ms=1000,
                invisible_ms=15_000,
            ),
        ):
            producer.send(Message(topic, b"retry me once"))
            assert official.wait_for(lambda: len(attempts) >= 2, timeout_s=60)
    finally:
        transport.close()
    assert attempts == [1, 2]
    # level 3 of the server's ladder ("1s 1s 1s 2s 2s"), not the default ladder's 10 s
    assert seam.delays[0] == 1000
