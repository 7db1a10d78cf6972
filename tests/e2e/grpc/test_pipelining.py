"""Pipelined sends and batched acks: many requests in flight, many messages per request,
each message with its own receipt (and error), in order per message group.

Run over our gRPC server in a subprocess (real gRPC, and the server's native wire,
docs/wire.md) and over the embedded broker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from reliable import Message, Producer, ReceivedMessage, SimpleConsumer, Transport
from reliable.errors import BadRequest, ReceiptHandleError
from tests.e2e.grpc.conftest import open_transport
from tests.e2e.helpers import wait_until


@pytest.fixture(params=["embedded", "grpc", "wire"])
def transport(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Transport]:
    """Each test over the embedded broker, gRPC, and the native wire."""
    yield from open_transport(request, request.param, tmp_path)


class InFlightSeam:
    """A transport seam recording how many requests of each message group are in flight."""

    def __init__(self, inner: Transport) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self.now: dict[str | None, int] = {}
        self.most: dict[str | None, int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def submit_send(
        self, messages: Sequence[Message], queue: Any, *, done: Any, **kwargs: Any
    ) -> None:
        group = messages[0].message_group
        assert all(m.message_group == group for m in messages)
        with self._lock:
            self.now[group] = self.now.get(group, 0) + 1
            self.most[group] = max(self.most.get(group, 0), self.now[group])

        def finished(results: Any) -> None:
            with self._lock:
                self.now[group] -= 1
            done(results)

        self._inner.submit_send(
            messages,
            queue,
            done=finished,  # type: ignore[attr-defined]
            **kwargs,
        )


def _tag(transport: Transport) -> str:
    """Names of topics and groups per transport and wire: the grpc and wire runs share
    one server."""
    return (
        f"{transport.name}-wire" if getattr(transport, "wire", "") == "native" else transport.name
    )


def _receive_all(transport: Transport, group: str, topic: str, n: int) -> list[ReceivedMessage]:
    got: dict[str, ReceivedMessage] = {}
    with SimpleConsumer(
        group, {topic: "*"}, transport=transport, await_duration_s=1, invisible_duration_s=30
    ) as consumer:

        def more() -> bool:
            batch = consumer.receive(32)
            for m in batch:
                got[m.message_id] = m
            assert all(e is None for e in consumer.ack_many(batch))
            return len(got) >= n

        wait_until(more, timeout=60, what=f"{n} messages on {topic}")
    return list(got.values())


def test_concurrent_send_async_each_gets_its_receipt_in_group_order(transport: Transport) -> None:
    topic = f"pipe-order-{_tag(transport)}"
    groups = [f"g{i}" for i in range(6)]
    per_group, plain = 60, 120
    sent: dict[str, list[Message]] = {g: [] for g in groups}
    futures = []
    lock = threading.Lock()
    seam = InFlightSeam(transport)
    with Producer(
        seam,
        linger_ms=1,
        batch_size=4,  # type: ignore[arg-type]
        max_in_flight=32,
    ) as producer:
        # the first send of the topic also creates it on the server
        producer.send(Message(topic, b"first"))

        def send_group(group: str) -> None:
            for i in range(per_group - 1):
                m = Message(topic, f"{group}-{i}".encode(), message_group=group)
                sent[group].append(m)
                f = producer.send_async(m)
                with lock:
                    futures.append((m, f))
            # a synchronous send behind the group's pending ones queues after them
            last = Message(topic, f"{group}-{per_group - 1}".encode(), message_group=group)
            sent[group].append(last)
            receipt = producer.send(last)
            assert receipt.message_id == last.message_id

        def send_plain() -> None:
            for i in range(plain):
                m = Message(topic, f"plain-{i}".encode())
                f = producer.send_async(m)
                with lock:
                    futures.append((m, f))

        threads = [threading.Thread(target=send_group, args=(g,)) for g in groups]
        threads.append(threading.Thread(target=send_plain))
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        receipts = {m.message_id: f.result(30) for m, f in futures}
        # batching happened: fewer requests than pipelined messages
        assert producer.requests_sent < len(futures)
    assert len(futures) == len(groups) * (per_group - 1) + plain
    assert all(seam.most[g] == 1 for g in groups)  # one request of a group in flight
    if transport.name == "grpc":
        assert seam.most[None] > 1  # while messages without a group are pipelined
    for m, _ in futures:  # each future carries its own message's receipt
        assert receipts[m.message_id].message_id == m.message_id
    for group in groups:  # stored in send order: queue offsets grow with the send order
        offsets = [receipts[m.message_id].queue_offset for m in sent[group][:-1]]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)

    received = _receive_all(transport, f"{topic}-reader", topic, len(futures) + len(groups) + 1)
    by_group: dict[str, list[ReceivedMessage]] = {}
    for r in received:
        if r.message_group:
            by_group.setdefault(r.message_group, []).append(r)
    for group in groups:
        stored = sorted(by_group[group], key=lambda r: r.queue_offset)
        assert len({r.queue_id for r in stored}) == 1  # a group lives in one queue
        assert [r.body for r in stored] == [m.body for m in sent[group]]
    plain_bodies = sorted(r.body for r in received if r.body.startswith(b"plain-"))
    assert plain_bodies == sorted(f"plain-{i}".encode() for i in range(plain))


def test_linger_batches_messages_into_few_requests(transport: Transport) -> None:
    topic = f"pipe-linger-{_tag(transport)}"
    n = 200
    with Producer(transport, linger_ms=200, batch_size=64) as producer:
        producer.send(Message(topic, b"create"))
        futures = [producer.send_async(Message(topic, f"m{i}".encode())) for i in range(n)]
        ids = {f.result(30).message_id for f in futures}
        requests = producer.requests_sent
    assert len(ids) == n
    # a full batch leaves at once, the rest after the linger: ceil(200 / 64) requests, plus
    # the first message when it found the pipe idle
    assert requests <= n // 64 + 2, requests
    if transport.name == "grpc":
        assert transport.requests["SendMessage"] <= n // 64 + 3  # type: ignore[attr-defined]


def test_asend_from_asyncio(transport: Transport) -> None:
    topic = f"pipe-asend-{_tag(transport)}"

    async def main(producer: Producer) -> list[str]:
        receipts = await asyncio.gather(
            *(producer.asend(Message(topic, f"a{i}".encode())) for i in range(50))
        )
        return [r.message_id for r in receipts]

    with Producer(transport) as producer:
        producer.send(Message(topic, b"create"))
        ids = asyncio.run(main(producer))
    assert len(set(ids)) == 50
    bodies = sorted(m.body for m in _receive_all(transport, f"{topic}-r", topic, 51))
    assert bodies == sorted([b"create"] + [f"a{i}".encode() for i in range(50)])


def test_batched_acks_report_a_failed_entry_alone(transport: Transport) -> None:
    topic, group = f"pipe-acks-{_tag(transport)}", f"pipe-acks-g-{_tag(transport)}"
    with Producer(transport) as producer:
        for i in range(6):
            producer.send(Message(topic, f"m{i}".encode()))
    with SimpleConsumer(
        group, {topic: "*"}, transport=transport, await_duration_s=1, invisible_duration_s=2
    ) as consumer:
        got: list[ReceivedMessage] = []
        wait_until(
            lambda: bool(got.extend(consumer.receive(32))) or len(got) >= 6, what="6 messages"
        )
        assert len(got) == 6
        kept = got[2]
        forged = dataclasses.replace(
            kept, receipt_handle=kept.receipt_handle[:-6] + "AAAAAA" if kept.receipt_handle else "x"
        )
        before = dict(getattr(transport, "requests", {}))
        batch = [*got[:2], forged, *got[3:]]
        results = consumer.ack_many(batch)
        assert [r is None for r in results] == [True, True, False, True, True, True]
        assert isinstance(results[2], ReceiptHandleError)
        if transport.name == "grpc":  # one AckMessage with six entries
            after = transport.requests  # type: ignore[attr-defined]
            assert after["AckMessage"] - before["AckMessage"] == 1
        # the five acked never come back; the one whose entry failed does, after its lease
        again: list[ReceivedMessage] = []
        wait_until(
            lambda: bool(again.extend(consumer.receive(32))) or len(again) >= 1,
            timeout=30,
            what="the unacked message redelivered",
        )
        assert [m.message_id for m in again] == [kept.message_id]
        assert again[0].delivery_attempt == 2
        assert consumer.ack_async(again[0]).result(10) is None


def test_pipelined_invisible_duration_changes_each_get_their_handle(transport: Transport) -> None:
    topic, group = f"pipe-hide-{_tag(transport)}", f"pipe-hide-g-{_tag(transport)}"
    with Producer(transport) as producer:
        for i in range(5):
            producer.send(Message(topic, f"m{i}".encode()))
    with SimpleConsumer(
        group, {topic: "*"}, transport=transport, await_duration_s=1, invisible_duration_s=10
    ) as consumer:
        got: list[ReceivedMessage] = []
        wait_until(
            lambda: bool(got.extend(consumer.receive(32))) or len(got) >= 5, what="5 messages"
        )
        old = [m.receipt_handle for m in got]
        futures = [consumer.change_invisible_duration_async(m, 30) for m in got]
        handles = [f.result(10) for f in futures]
        assert handles == [m.receipt_handle for m in got]  # stored on each message
        assert all(h != o for h, o in zip(handles, old, strict=True))
        stale = dataclasses.replace(got[0], receipt_handle=old[0])
        results = consumer.ack_many([stale, *got])
        assert isinstance(results[0], ReceiptHandleError)  # the replaced handle is dead
        assert results[1:] == [None] * 5
        assert consumer.receive(32) == []  # all five acked, none back after the old lease


def test_a_send_from_a_send_callback_does_not_deadlock(transport: Transport) -> None:
    topic = f"pipe-callback-{_tag(transport)}"
    chained: list[str] = []
    done = threading.Event()
    with Producer(transport) as producer:
        producer.send(Message(topic, b"create"))

        def on_success(receipt: Any) -> None:
            # a synchronous send of the same group, while the group's lane is busy
            chained.append(producer.send(Message(topic, b"next", message_group="cb")).message_id)
            done.set()

        for i in range(5):
            producer.send_async(
                Message(topic, f"m{i}".encode(), message_group="cb"),
                on_success=on_success if i == 0 else None,
            )
        assert done.wait(30) and len(chained) == 1


def test_a_bad_message_in_a_batch_fails_alone(transport: Transport) -> None:
    topic = f"pipe-bad-{_tag(transport)}"
    with Producer(transport, linger_ms=100, batch_size=16) as producer:
        producer.send(Message(topic, b"create"))
        messages = [Message(topic, f"m{i}".encode()) for i in range(10)]
        messages[4] = Message(topic, b"bad", properties={"k": "a\x01b"})
        futures = [producer.send_async(m) for m in messages]
        outcomes = [f.exception(30) for f in futures]
    assert isinstance(outcomes[4], BadRequest)
    assert [o is None for o in outcomes] == [i != 4 for i in range(10)]
    bodies = sorted(m.body for m in _receive_all(transport, f"{topic}-r", topic, 10))
    assert bodies == sorted([b"create"] + [f"m{i}".encode() for i in range(10) if i != 4])
