"""The served hot paths in batches: a SendMessage of several messages, an AckMessage of
several entries, and concurrent single sends under SYNC_FLUSH (acknowledged only once on
disk, and all there after a SIGKILL). The unary calls go over gRPC and over the server's
native wire (docs/wire.md), through the same stub interface."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.broker import Broker
from broker.server.codes import Code
from broker.server.config import ServerConfig
from broker.server.server import MessagingServer
from broker.store.config import FlushMode, StoreConfig
from protocol.pb import service_pb2, service_pb2_grpc
from reliable.transport._native_wire import NativeStub
from tests.e2e.grpc.conftest import FAST
from tests.e2e.grpc.server_process import ServerProcess

MD = (("x-mq-client-id", "batched-test"),)
WIRES = ["grpc", "native"]


def make_stub(channel: Any, wire: str, wire_port: int) -> Any:
    """The grpc stub, or the same interface over the native wire (streams stay on gRPC)."""
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    if wire == "native":
        assert wire_port
        return NativeStub(stub, None, host="127.0.0.1", ask_port=None, port=wire_port)
    return stub


@pytest.fixture(params=WIRES)
def stub(server: ServerProcess, request: pytest.FixtureRequest) -> Iterator[Any]:
    channel = grpc.insecure_channel(server.endpoint)
    made = make_stub(channel, request.param, server.wire_port)
    yield made
    if isinstance(made, NativeStub):
        made.close()
    channel.close()


def send_request(topic: str, bodies: list[bytes]) -> Any:
    request = service_pb2.SendMessageRequest()
    for body in bodies:
        m = request.messages.add()
        m.topic.name = topic
        m.body = body
        m.system_properties.message_id = uuid.uuid4().hex.upper()
        m.system_properties.message_type = 1
        m.system_properties.body_encoding = 1
        m.system_properties.born_host = "127.0.0.1"
        m.system_properties.born_timestamp.GetCurrentTime()
    return request


def sync_flush_broker(store_dir: Path) -> Broker:
    """A started in-process broker acknowledging sends after fsync, on a small store."""
    broker = Broker(
        StoreConfig(
            store_dir=store_dir,
            flush_mode=FlushMode.SYNC_FLUSH,
            mapped_file_size_commitlog=8 << 20,
            warm_mapped_file=False,
        )
    )
    broker.start()
    return broker


def receive_request(group: str, topic: str, invisible_s: int = 30, poll_s: int = 2) -> Any:
    """A ReceiveMessage of up to 32 messages, every tag."""
    request = service_pb2.ReceiveMessageRequest(batch_size=32)
    request.group.name = group
    request.message_queue.topic.name = topic
    request.filter_expression.type = 1
    request.filter_expression.expression = "*"
    request.invisible_duration.seconds = invisible_s
    request.long_polling_timeout.seconds = poll_s
    return request


def receive_all(
    stub: Any, group: str, topic: str, want: int, invisible_s: int = 30, within_s: float = 20.0
) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + within_s
    while len(got) < want and time.monotonic() < deadline:
        request = receive_request(group, topic, invisible_s)
        for response in stub.ReceiveMessage(request, metadata=MD, timeout=10):
            if response.WhichOneof("content") == "message":
                got.append(response.message)
    return got


def test_one_send_of_several_messages_is_one_batch_with_an_offset_each(stub: Any) -> None:
    topic = f"batched-send-{type(stub).__name__}"
    bodies = [f"m{i}".encode() for i in range(6)]
    request = send_request(topic, bodies)
    reply = stub.SendMessage(request, metadata=MD, timeout=10)
    assert reply.status.code == Code.OK
    assert [e.status.code for e in reply.entries] == [Code.OK] * 6
    assert [e.message_id for e in reply.entries] == [
        m.system_properties.message_id for m in request.messages
    ]
    offsets = [e.offset for e in reply.entries]
    assert offsets == list(range(offsets[0], offsets[0] + 6))  # consecutive: one queue, in order
    got = receive_all(stub, "batched-send-g", topic, 6)
    assert sorted(m.body for m in got) == sorted(bodies)
    by_id = {m.system_properties.message_id: m.system_properties for m in got}
    queues = {by_id[e.message_id].queue_id for e in reply.entries}
    assert len(queues) == 1  # the whole request went to one queue
    assert [by_id[e.message_id].queue_offset for e in reply.entries] == offsets
    # the same request again: every message answered from the de-duplication cache
    again = stub.SendMessage(request, metadata=MD, timeout=10)
    assert [e.offset for e in again.entries] == offsets
    assert receive_all(stub, "batched-send-g", topic, 1, within_s=2.5) == []


def test_a_bad_message_in_a_send_fails_alone(stub: Any) -> None:
    topic = f"batched-send-bad-{type(stub).__name__}"
    request = send_request(topic, [b"a", b"", b"c"])  # an empty body is refused
    reply = stub.SendMessage(request, metadata=MD, timeout=10)
    assert [e.status.code for e in reply.entries] == [Code.OK, Code.MESSAGE_BODY_EMPTY, Code.OK]
    assert reply.status.code == Code.MULTIPLE_RESULTS
    got = receive_all(stub, "batched-send-bad-g", topic, 2)
    assert sorted(m.body for m in got) == [b"a", b"c"]


def test_a_batched_ack_reports_a_failed_entry_alone(stub: Any) -> None:
    topic, group = f"batched-ack-{type(stub).__name__}", f"batched-ack-g-{type(stub).__name__}"
    stub.SendMessage(send_request(topic, [b"one", b"two", b"three"]), metadata=MD, timeout=10)
    got = receive_all(stub, group, topic, 3, invisible_s=2)
    assert len(got) == 3
    by_body = {m.body: m.system_properties for m in got}
    ack = service_pb2.AckMessageRequest()
    ack.group.name, ack.topic.name = group, topic
    for body, handle in (
        (b"one", by_body[b"one"].receipt_handle),
        (b"two", "not-a-handle"),
        (b"three", by_body[b"three"].receipt_handle),
    ):
        entry = ack.entries.add()
        entry.message_id = by_body[body].message_id
        entry.receipt_handle = handle
    reply = stub.AckMessage(ack, metadata=MD, timeout=10)
    assert [e.status.code for e in reply.entries] == [Code.OK, Code.INVALID_RECEIPT_HANDLE, Code.OK]
    assert [e.message_id for e in reply.entries] == [
        by_body[b].message_id for b in (b"one", b"two", b"three")
    ]
    assert reply.status.code == Code.MULTIPLE_RESULTS
    # acking the same handles again is harmless (already done)
    again = service_pb2.AckMessageRequest()
    again.CopyFrom(ack)
    del again.entries[1]
    assert stub.AckMessage(again, metadata=MD, timeout=10).status.code == Code.OK
    # only the message whose ack failed comes back when its invisible time is over
    back = receive_all(stub, group, topic, 1, invisible_s=30, within_s=15)
    assert [m.body for m in back] == [b"two"]
    assert back[0].system_properties.delivery_attempt == 2
    assert receive_all(stub, group, topic, 1, within_s=3.5) == []


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("producers", [8, 1])
def test_sync_flush_acknowledges_concurrent_sends_only_once_on_disk(
    tmp_path: Path, wire: str, producers: int
) -> None:
    """In-process: at the moment each answer arrives, the commitlog is fsynced past the
    message's record; the sends of many threads share group commits. A lone producer's
    sends are fsynced on the event loop (no group to share): the same guarantee."""
    broker = sync_flush_broker(tmp_path)
    broker.create_topic("durable", queues=1)
    server = MessagingServer(broker, ServerConfig(port=0, wire_port=0))
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    stub = make_stub(channel, wire, server.wire_port)
    flushed = broker.store.commitlog.queue
    seen: list[tuple[int, int]] = []  # (queue offset, flushed position when answered)
    errors: list[BaseException] = []

    def producer() -> None:
        try:
            for _ in range(15):
                reply = stub.SendMessage(
                    send_request("durable", [b"x" * 512]), metadata=MD, timeout=10
                )
                where = flushed.flushed_where
                assert reply.status.code == Code.OK, reply
                seen.append((reply.entries[0].offset, where))
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    try:
        threads = [threading.Thread(target=producer) for _ in range(producers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        sends = 15 * producers
        assert sorted(o for o, _ in seen) == list(range(sends))
        # the consume queue is built after the answer, by the dispatch thread
        assert broker.store.wait_dispatched(timeout_s=10.0)
        for offset, where in seen:
            ext = broker.store.get_message_by_queue_offset("durable", 0, offset)
            assert ext is not None
            assert ext.commitlog_offset + ext.store_size <= where
        if producers > 1:
            assert broker.store.fsync_count < sends  # group commits were shared
        # receive and ack: answered only once their invisible-time records are on disk
        got = receive_all(stub, "durable-g", "durable", min(32, sends))
        logged = broker._pop._logged_end  # type: ignore[attr-defined]
        assert len(got) == min(32, sends) and flushed.flushed_where >= logged > 0
        ack = service_pb2.AckMessageRequest()
        ack.group.name, ack.topic.name = "durable-g", "durable"
        for m in got:
            entry = ack.entries.add()
            entry.message_id = m.system_properties.message_id
            entry.receipt_handle = m.system_properties.receipt_handle
        assert stub.AckMessage(ack, metadata=MD, timeout=10).status.code == Code.OK
        assert broker._pop._logged_end > logged  # type: ignore[attr-defined]
        assert flushed.flushed_where >= broker._pop._logged_end  # type: ignore[attr-defined]
    finally:
        channel.close()
        server.stop()
        broker.shutdown()


def test_concurrent_sync_flush_sends_survive_a_sigkill(tmp_path: Path, client_home: Path) -> None:
    server = ServerProcess(tmp_path / "store", client_home, *FAST, "--flush", "sync").start()
    acked: list[bytes] = []
    errors: list[BaseException] = []
    try:
        channel = grpc.insecure_channel(server.endpoint)
        stub = service_pb2_grpc.MessagingServiceStub(channel)

        def producer(n: int) -> None:
            try:
                for i in range(20):
                    body = f"{n}-{i}".encode()
                    reply = stub.SendMessage(
                        send_request("durable-kill", [body]), metadata=MD, timeout=10
                    )
                    if reply.status.code == Code.OK:
                        acked.append(body)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=producer, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        channel.close()
    finally:
        server.kill()  # SIGKILL: nothing is flushed on the way out
    assert not errors, errors
    assert len(acked) == 160
    again = ServerProcess(tmp_path / "store", client_home, *FAST).start()
    try:
        channel = grpc.insecure_channel(again.endpoint)
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        got = receive_all(stub, "durable-kill-g", "durable-kill", 160, within_s=30)
        channel.close()
    finally:
        again.kill()
    assert sorted(m.body for m in got) == sorted(acked)
