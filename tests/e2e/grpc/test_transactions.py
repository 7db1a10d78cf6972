"""Transactions (commit, rollback, the orphan check over telemetry) and delay messages."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from protocol.pb import service_pb2, service_pb2_grpc
from tests.e2e.grpc import official
from tests.e2e.grpc.raw_telemetry import RawTelemetry, producer_settings
from tests.e2e.grpc.server_process import ServerProcess


class Checker:
    """A TransactionChecker answering `verdict`, recording what it was asked."""

    def __init__(self, verdict: str) -> None:
        self.verdict = verdict
        self.asked: list[tuple[str, bytes, str]] = []
        self.lock = threading.Lock()

    def build(self) -> Any:
        from rocketmq import TransactionChecker, TransactionResolution

        outer = self

        class _Checker(TransactionChecker):
            def check(self, message: Any) -> Any:
                with outer.lock:
                    outer.asked.append((message.message_id, message.body, message.topic))
                return getattr(TransactionResolution, outer.verdict)

        return _Checker()


def test_half_message_invisible_until_commit(server: ServerProcess) -> None:
    # checks may come while the test waits: "unknown" leaves the decision to the client
    checker = Checker("TRANSACTION_RESOLUTION_UNSPECIFIED")
    producer = official.producer(server.endpoint, ["t-tx"], checker.build())
    consumer = official.simple_consumer(server.endpoint, "g-tx", "t-tx")
    try:
        txn = producer.begin_transaction()
        receipt = producer.send(
            official.message("t-tx", b"half", tag="tx", props={"order": "7"}), txn
        )
        assert receipt.transaction_id
        assert consumer.receive(32, 15) == []  # a half message is not delivered
        txn.commit()
        got = official.receive_until(consumer, lambda g: len(g) >= 1)
        assert [(m.message_id, m.body, m.tag) for m in got] == [(receipt.message_id, b"half", "tx")]
        assert got[0].properties == {"order": "7"}

        txn = producer.begin_transaction()
        producer.send(official.message("t-tx", b"rolled back"), txn)
        txn.rollback()
        assert consumer.receive(32, 15) == []
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_orphaned_transaction_is_checked_over_telemetry(server: ServerProcess) -> None:
    checker = Checker("COMMIT")
    producer = official.producer(server.endpoint, ["t-orphan"], checker.build())
    consumer = official.simple_consumer(server.endpoint, "g-orphan", "t-orphan")
    try:
        txn = producer.begin_transaction()
        receipt = producer.send(official.message("t-orphan", b"orphan"), txn)
        # no commit: the server asks the producer through its telemetry stream
        got = official.receive_until(consumer, lambda g: len(g) >= 1, timeout_s=30)
        assert [m.message_id for m in got] == [receipt.message_id]
        with checker.lock:
            assert checker.asked[0] == (receipt.message_id, b"orphan", "t-orphan")
    finally:
        producer.shutdown()
        consumer.shutdown()


def checked(stream: RawTelemetry) -> list[str]:
    """The message ids of the orphan checks `stream` was sent."""
    return [
        c.message.system_properties.message_id
        for c in stream.received("recover_orphaned_transaction_command")
    ]


def test_a_client_s_older_stream_takes_the_checks_when_its_newer_one_ends(
    make_server: Callable[..., ServerProcess],
) -> None:
    """One client identity may hold two Telemetry streams to one server (the transport's
    access point stream and its group master stream, when both reach the same server). The
    server sends commands on the newer; when that one ends, the older still gets them: a
    half message's check is not lost because a client closed one of its two streams."""
    server = make_server()  # its own: a protocol-level check, not a cluster scenario
    topic, client_id = "t-two-streams", "two-streams@producer"
    older = RawTelemetry(server.endpoint, client_id, producer_settings(topic))
    newer: RawTelemetry | None = None
    channel = grpc.insecure_channel(server.endpoint)
    try:
        assert older.ready.wait(10)
        newer = RawTelemetry(server.endpoint, client_id, producer_settings(topic))
        assert newer.ready.wait(10)
        newer.close()
        time.sleep(0.5)  # the server has seen the newer stream end
        request = service_pb2.SendMessageRequest()
        message = request.messages.add()
        message.topic.name, message.body = topic, b"half"
        message_id = uuid.uuid4().hex.upper()
        message.system_properties.message_id = message_id
        message.system_properties.message_type = 4  # transaction: a half message
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        reply = stub.SendMessage(request, metadata=[("x-mq-client-id", client_id)], timeout=10)
        assert reply.status.code == 20000, reply.status
        deadline = time.monotonic() + 20  # checks every second here (FAST)
        while message_id not in checked(older) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert message_id in checked(older)
    finally:
        older.close()
        if newer is not None:
            newer.close()
        channel.close()


def test_delay_message_arrives_at_its_time(server: ServerProcess) -> None:
    consumer = official.simple_consumer(server.endpoint, "g-delay", "t-delay")
    producer = official.producer(server.endpoint, ["t-delay"])
    try:
        deliver_at = int(time.time()) + 3  # the official client takes epoch *seconds*
        receipt = producer.send(official.message("t-delay", b"later", deliver_at_s=deliver_at))
        got = official.receive_until(consumer, lambda g: len(g) >= 1, timeout_s=20)
        arrived = time.time()
        assert [m.message_id for m in got] == [receipt.message_id]
        assert arrived >= deliver_at - 0.001
        # the delivered message still says when it was due (the client reports ms)
        assert got[0].delivery_timestamp == deliver_at * 1000
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_delay_beyond_one_day_is_refused(server: ServerProcess) -> None:
    from rocketmq.v5.exception import BadRequestException

    producer = official.producer(server.endpoint, ["t-delay-far"])
    try:
        with pytest.raises(BadRequestException):
            producer.send(
                official.message("t-delay-far", b"x", deliver_at_s=int(time.time()) + 2 * 86400)
            )
    finally:
        producer.shutdown()


def test_recall_withdraws_a_delay_message(server: ServerProcess) -> None:
    consumer = official.simple_consumer(server.endpoint, "g-recall", "t-recall")
    producer = official.producer(server.endpoint, ["t-recall"])
    try:
        deliver_at = int(time.time()) + 3
        doomed = producer.send(official.message("t-recall", b"withdrawn", deliver_at_s=deliver_at))
        kept = producer.send(official.message("t-recall", b"kept", deliver_at_s=deliver_at))
        assert doomed.recall_handle and kept.recall_handle
        assert producer.recall_message("t-recall", doomed.recall_handle) == doomed.message_id
        got = official.receive_until(consumer, lambda g: len(g) >= 1, timeout_s=20)
        got += consumer.receive(32, 15)  # the recalled one is due at the same time
        assert [m.message_id for m in got] == [kept.message_id]
        with pytest.raises(Exception, match="already delivered"):
            producer.recall_message("t-recall", kept.recall_handle)
    finally:
        producer.shutdown()
        consumer.shutdown()
