"""The producer through the public API: retries at a transport seam, flow-control backoff,
async / oneway / batch / ordered / delayed sends and transactions."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from broker.store.config import FlushMode
from broker.store.message import decode_offset_msg_id
from reliable import (
    BadRequest,
    BrokerBusy,
    InvalidMessage,
    Message,
    Producer,
    ReceivedMessage,
    SendFailed,
    SendReceipt,
    SendStatus,
    SimpleConsumer,
    TransactionState,
    Transport,
    TransportError,
)
from reliable.transport.base import QueueRef
from tests.e2e.helpers import LEVEL_MS, stays, wait_until


class FaultySend:
    """A transport seam: the first `failures` sends raise `error`; every call is recorded."""

    def __init__(self, inner: Transport, failures: int, error: Callable[[], Exception]) -> None:
        self._inner = inner
        self._failures = failures
        self._error = error
        self.queues: list[QueueRef] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def send(self, message: Message, queue: QueueRef, **kwargs: Any) -> Any:
        self.queues.append(queue)
        if len(self.queues) <= self._failures:
            raise self._error()
        return self._inner.send(message, queue, **kwargs)


def _drain(transport: Transport, topic: str, n: int) -> list[ReceivedMessage]:
    got: list[ReceivedMessage] = []
    with SimpleConsumer(
        f"{topic}-reader", {topic: "*"}, transport=transport, await_duration_s=0.2
    ) as c:

        def more() -> bool:
            batch = c.receive(32)
            for m in batch:
                c.ack(m)
            got.extend(batch)
            return len(got) >= n

        wait_until(more, what=f"{n} messages on {topic}")
    return got


def test_send_retry_goes_to_another_queue_after_a_transport_failure(transport: Transport) -> None:
    seam = FaultySend(transport, 1, lambda: TransportError("connection reset"))
    with Producer(seam) as producer:  # type: ignore[arg-type]
        receipt = producer.send(Message("retry-q", b"x"))
    assert len(seam.queues) == 2
    assert seam.queues[0] != seam.queues[1]
    assert receipt.queue_id == seam.queues[1].queue_id
    assert [m.message_id for m in _drain(transport, "retry-q", 1)] == [receipt.message_id]


def test_send_gives_up_after_retry_times(transport: Transport) -> None:
    seam = FaultySend(transport, 99, lambda: TransportError("down"))
    producer = Producer(seam, retry_times_when_send_failed=2, failover_wait_s=0)  # type: ignore[arg-type]
    with producer, pytest.raises(SendFailed) as info:
        producer.send(Message("retry-q", b"x"))
    assert len(seam.queues) == 3 and len(info.value.attempts) == 3
    assert len(set(seam.queues)) == 3  # each attempt on another queue


class _VirtualTime:
    def __init__(self) -> None:
        self.ms = 1_000_000.0
        self.slept: list[float] = []

    def clock_ms(self) -> float:
        return self.ms

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.ms += s * 1000


def test_a_failover_is_waited_out_sync_and_pipelined_within_its_window(
    transport: Transport,
) -> None:
    """docs/ha.md: the broker unreachable for longer than the immediate retries last (a
    master lost, its slave not yet promoted): the send waits it out, then lands; past the
    window it fails with every attempt listed."""
    seam = FaultySend(transport, 7, lambda: TransportError("connection refused"))
    time_ = _VirtualTime()
    with Producer(seam, sleep=time_.sleep, clock_ms=time_.clock_ms) as producer:  # type: ignore[arg-type]
        receipt = producer.send(Message("failover-q", b"x"))
        assert len(seam.queues) == 8 and receipt.queue_offset >= 0
        assert time_.slept[:2] == [0.0, 0.0] and 0 < sum(time_.slept) < 10
        seam.queues.clear()
        time_.slept.clear()
        seam._failures = 10**6
        with pytest.raises(SendFailed) as failed:
            producer.send(Message("failover-q", b"y"))
        assert sum(time_.slept) == pytest.approx(10.0)  # the whole window, no more
        assert len(failed.value.attempts) == len(seam.queues) > 3
    pipelined = FaultySubmit(transport, 4, lambda: TransportError("connection refused"))
    with Producer(pipelined) as producer:  # type: ignore[arg-type]
        started = time.monotonic()
        receipt = producer.send_async(Message("failover-q", b"z")).result(10)
        assert len(pipelined.queues) == 5 and receipt.queue_offset >= 0
        assert time.monotonic() - started >= 0.2  # waited 0.1 + 0.2 s (+-20 %) at least
    assert [m.body for m in _drain(transport, "failover-q", 2)] in ([b"x", b"z"], [b"z", b"x"])


def test_bad_requests_are_not_retried(transport: Transport) -> None:
    seam = FaultySend(transport, 99, lambda: BadRequest("message illegal"))
    producer = Producer(seam)  # type: ignore[arg-type]
    with producer, pytest.raises(BadRequest):
        producer.send(Message("retry-q", b"x"))
    assert len(seam.queues) == 1


def test_oversize_message_is_a_bad_request_and_nothing_is_stored(
    make_transport: Callable[..., Transport],
) -> None:
    transport = make_transport(max_message_size=1024)
    with Producer(transport) as producer:
        with pytest.raises(BadRequest):
            producer.send(Message("big", b"x" * 2048))
        with pytest.raises(InvalidMessage):
            producer.send(Message("big", b""))
        ok = producer.send(Message("big", b"small"))
    assert [m.message_id for m in _drain(transport, "big", 1)] == [ok.message_id]


def test_flow_control_backoff_follows_the_configured_curve(transport: Transport) -> None:
    slept: list[float] = []
    seam = FaultySend(transport, 4, lambda: BrokerBusy("system busy", code="SYSTEM_BUSY"))
    with Producer(
        seam,
        sleep=slept.append,  # type: ignore[arg-type]
        rng=random.Random(5),
    ) as producer:
        producer.send(Message("busy", b"x"))
    waits = [s for s in slept if s > 0]
    assert len(waits) == 4 and len(seam.queues) == 5
    for got, base in zip(waits, [1.0, 1.6, 2.56, 4.096], strict=True):
        assert base * 0.8 <= got <= base * 1.2


def test_async_awaitable_callback_oneway_and_batch(transport: Transport) -> None:
    results: list[str] = []
    done = threading.Event()
    with Producer(transport) as producer:
        future = producer.send_async(
            Message("modes", b"async"),
            on_success=lambda r: (results.append(r.message_id), done.set()),
        )
        first = future.result(10)
        assert done.wait(10) and results == [first.message_id]
        second = asyncio.run(producer.asend(Message("modes", b"awaited")))
        producer.send_oneway(Message("modes", b"oneway"))
        batch = producer.send_batch([Message("modes", f"b{i}".encode()) for i in range(3)])
    assert len({r.queue_id for r in batch}) == 1
    offsets = [r.queue_offset for r in batch]
    assert offsets == list(range(offsets[0], offsets[0] + 3))
    bodies = sorted(m.body for m in _drain(transport, "modes", 6))
    assert bodies == sorted([b"async", b"awaited", b"oneway", b"b0", b"b1", b"b2"])
    assert second.message_id


def test_ordered_sends_keep_a_group_on_one_queue(transport: Transport) -> None:
    with Producer(transport) as producer:
        receipts = {
            g: [producer.send(Message("ordered", b"x", message_group=g)) for _ in range(5)]
            for g in ("a", "b", "c")
        }
    for rs in receipts.values():
        assert len({r.queue_id for r in rs}) == 1
        assert [r.queue_offset for r in rs] == sorted(r.queue_offset for r in rs)


def test_delayed_message_arrives_after_its_level(transport: Transport) -> None:
    with Producer(transport) as producer:
        t0 = time.monotonic()
        producer.send(Message("later", b"x", delay_level=5))
        at = int(time.time() * 1000) + 300
        producer.send(Message("later", b"y", deliver_at_ms=at))
    got = _drain(transport, "later", 2)
    elapsed_ms = (time.monotonic() - t0) * 1000
    assert sorted(m.body for m in got) == [b"x", b"y"]
    assert elapsed_ms >= LEVEL_MS[4] - 5


class Ledger:
    """The producer's local transactions: a committed set guarded by a lock."""

    def __init__(self) -> None:
        self.committed: set[str] = set()
        self.checked: list[str] = []

    def check(self, message: ReceivedMessage) -> TransactionState:
        self.checked.append(message.message_id)
        return (
            TransactionState.COMMIT
            if message.body in self.committed_bodies()
            else TransactionState.ROLLBACK
        )

    def committed_bodies(self) -> set[bytes]:
        return {b.encode() for b in self.committed}


def test_half_message_never_delivered_before_commit_nor_after_rollback(
    transport: Transport,
) -> None:
    ledger = Ledger()
    seen: list[bytes] = []
    with (
        Producer(transport, group="tx-p", transaction_checker=ledger.check) as producer,
        SimpleConsumer("tx-g", {"tx": "*"}, transport=transport, await_duration_s=0.1) as consumer,
    ):

        def poll() -> list[bytes]:
            batch = consumer.receive(32)
            for m in batch:
                consumer.ack(m)
            seen.extend(m.body for m in batch)
            return seen

        def commit_later(message: Message, arg: Any) -> TransactionState:
            assert stays(lambda: b"commit-me" not in poll(), 0.3)  # invisible until commit
            ledger.committed.add("commit-me")
            return TransactionState.COMMIT

        result = producer.send_in_transaction(Message("tx", b"commit-me"), commit_later)
        assert result.state is TransactionState.COMMIT
        rolled = producer.send_in_transaction(
            Message("tx", b"roll-me-back"), lambda m, a: TransactionState.ROLLBACK
        )
        assert rolled.state is TransactionState.ROLLBACK
        producer.send(Message("tx", b"marker"))
        wait_until(lambda: b"marker" in poll() and b"commit-me" in seen, what="delivery")
        assert stays(lambda: b"roll-me-back" not in poll(), 1.0)
    assert seen.count(b"commit-me") == 1


def test_check_back_resolves_an_unknown_transaction(transport: Transport) -> None:
    ledger = Ledger()
    seen: list[bytes] = []
    with (
        Producer(transport, group="tx-check", transaction_checker=ledger.check) as producer,
        SimpleConsumer(
            "tx-check-g", {"txc": "*"}, transport=transport, await_duration_s=0.1
        ) as consumer,
    ):

        def crash_before_answer(message: Message, arg: Any) -> TransactionState:
            ledger.committed.add(message.body.decode())  # the DB commit happened...
            raise ConnectionError("...but the answer to the broker is lost")

        unknown = producer.send_in_transaction(Message("txc", b"paid"), crash_before_answer)
        assert unknown.state is TransactionState.UNKNOWN
        assert isinstance(unknown.error, ConnectionError)
        undecided = producer.send_in_transaction(
            Message("txc", b"abandoned"), lambda m, a: TransactionState.UNKNOWN
        )

        def poll() -> bool:
            for m in consumer.receive(32):
                consumer.ack(m)
                seen.append(m.body)
            return b"paid" in seen

        wait_until(poll, what="the checked transaction to commit")
        wait_until(lambda: undecided.receipt.message_id in ledger.checked, what="the other check")

        def still_absent() -> bool:
            poll()
            return b"abandoned" not in seen

        assert stays(still_absent, 1.0)
    assert unknown.receipt.message_id in ledger.checked
    assert seen == [b"paid"]


class TwoBrokers:
    """A transport seam presenting the embedded broker as two: queues 0-1 on `slow` (each
    send there takes 600 ms on the producer's clock), queues 2-3 on `fast`."""

    def __init__(self, inner: Transport, clock: list[float]) -> None:
        self._inner = inner
        self._clock = clock
        self.brokers: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def route(self, topic: str) -> Any:
        from reliable.transport.base import TopicRoute

        queues = tuple(QueueRef(topic, "slow" if q < 2 else "fast", q) for q in range(4))
        return TopicRoute(topic, queues, queues)

    def send(self, message: Message, queue: QueueRef, **kwargs: Any) -> Any:
        self.brokers.append(queue.broker)
        if queue.broker == "slow":
            self._clock[0] += 600
        return self._inner.send(message, queue, **kwargs)


def test_latency_fault_tolerance_avoids_a_slow_broker(transport: Transport) -> None:
    clock = [0.0]
    seam = TwoBrokers(transport, clock)
    with Producer(
        seam,
        send_latency_fault_enable=True,  # type: ignore[arg-type]
        clock_ms=lambda: clock[0],
    ) as producer:
        for _ in range(4):
            producer.send(Message("lft", b"x"))
        slow_at = seam.brokers.index("slow")
        assert "slow" not in seam.brokers[slow_at + 1 :]  # 600 ms -> avoided for 30 s
        clock[0] += 30_000
        for _ in range(4):
            producer.send(Message("lft", b"x"))
        assert "slow" in seam.brokers[4:]  # the penalty is over
    assert len(_drain(transport, "lft", 8)) == 8


class NotFlushedFirst:
    """A transport seam: the first send is stored but reported FLUSH_DISK_TIMEOUT."""

    def __init__(self, inner: Transport) -> None:
        self._inner = inner
        self.queues: list[QueueRef] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def send(self, message: Message, queue: QueueRef, **kwargs: Any) -> Any:
        import dataclasses

        from reliable import SendStatus

        self.queues.append(queue)
        receipt = self._inner.send(message, queue, **kwargs)
        if len(self.queues) == 1:
            return dataclasses.replace(receipt, status=SendStatus.FLUSH_DISK_TIMEOUT)
        return receipt


@pytest.mark.parametrize("retry_not_ok", [False, True])
def test_not_stored_ok_is_retried_only_when_asked(transport: Transport, retry_not_ok: bool) -> None:
    from reliable import SendStatus

    seam = NotFlushedFirst(transport)
    with Producer(
        seam,
        retry_another_broker_when_not_store_ok=retry_not_ok,  # type: ignore[arg-type]
    ) as producer:
        receipt = producer.send(Message("flushy", b"x"))
    if retry_not_ok:
        assert receipt.status is SendStatus.SEND_OK and len(seam.queues) == 2
        assert seam.queues[0] != seam.queues[1]
    else:
        assert receipt.status is SendStatus.FLUSH_DISK_TIMEOUT and len(seam.queues) == 1


def test_pipelined_receipts_say_where_each_message_was_stored(transport: Transport) -> None:
    """Plain messages (a body and an id) are stored straight from their bodies: each
    receipt still names its message's id, queue, queue offset and offset message id,
    and a message group travels with every message of the batch."""
    sent = [Message("receipts", f"p{i}".encode()) for i in range(40)]
    sent += [Message("receipts", f"g{i}".encode(), message_group="g") for i in range(40)]
    with Producer(transport, linger_ms=20) as producer:
        futures = [producer.send_async(m) for m in sent]
        receipts = [f.result(10) for f in futures]
    got = {m.message_id: m for m in _drain(transport, "receipts", len(sent))}
    assert len(got) == len(sent)
    for m, r in zip(sent, receipts, strict=True):
        stored = got[m.message_id]
        assert r == SendReceipt(
            m.message_id,
            "receipts",
            stored.queue_id,
            stored.queue_offset,
            offset_msg_id=stored.offset_msg_id,
        )
        assert stored.body == m.body and stored.message_group == m.message_group
    assert producer.requests_sent < len(sent)  # batched: the record-batch path was taken


class FaultySubmit(FaultySend):
    """The pipelined seam: the first `failures` requests get `error` for each message."""

    inline_sends = True

    def submit_send(self, messages: Any, queue: QueueRef, **kwargs: Any) -> None:
        self.queues.append(queue)
        if len(self.queues) <= self._failures:
            kwargs["done"]([self._error() for _ in messages])
            return
        self._inner.submit_send(messages, queue, **kwargs)


def test_pipelined_sends_retry_elsewhere_then_report_every_attempt(
    transport: Transport,
) -> None:
    seam = FaultySubmit(transport, 99, lambda: TransportError("down"))
    producer = Producer(seam, retry_times_when_send_async_failed=2, failover_wait_s=0)  # type: ignore[arg-type]
    with producer:
        future = producer.send_async(Message("retry-async", b"x"))
        with pytest.raises(SendFailed) as info:
            future.result(10)
    assert len(info.value.attempts) == 3 and len(seam.queues) == 3
    recovered = FaultySubmit(transport, 1, lambda: TransportError("reset"))
    with Producer(recovered) as producer:  # type: ignore[arg-type]
        receipt = producer.send_async(Message("retry-async", b"y")).result(10)
    assert receipt.queue_offset >= 0 and len(recovered.queues) == 2


def test_pipelined_sends_under_sync_flush_are_acknowledged_once_on_disk(
    make_transport: Callable[..., Transport],
) -> None:
    """The record-batch path keeps SYNC_FLUSH: each receipt arrives only once the
    commitlog is on disk past its record."""
    transport = make_transport("sync", flush=FlushMode.SYNC_FLUSH)
    commitlog = transport.broker.store.commitlog  # type: ignore[attr-defined]
    flushed_at_ack: list[tuple[int, int]] = []

    def record(receipt: SendReceipt) -> None:
        assert receipt.offset_msg_id is not None
        offset = decode_offset_msg_id(receipt.offset_msg_id)[1]
        flushed_at_ack.append((offset, commitlog.get_flushed_offset()))

    with Producer(transport, linger_ms=5) as producer:
        futures = [
            producer.send_async(Message("sync-flush", b"x" * 100), on_success=record)
            for _ in range(300)
        ]
        receipts = [f.result(10) for f in futures]
    assert all(r.status is SendStatus.SEND_OK for r in receipts)
    assert producer.requests_sent < 300  # batched: the record-batch path was taken
    assert len(flushed_at_ack) == 300
    assert all(flushed > offset for offset, flushed in flushed_at_ack)


class IdRecorder(FaultySubmit):
    """Records the message id of every attempt, sync and pipelined."""

    def __init__(self, inner: Transport, failures: int, error: Callable[[], Exception]) -> None:
        super().__init__(inner, failures, error)
        self.ids: list[str] = []

    def send(self, message: Message, queue: QueueRef, **kwargs: Any) -> Any:
        self.ids.append(message.message_id)
        return super().send(message, queue, **kwargs)

    def submit_send(self, messages: Any, queue: QueueRef, **kwargs: Any) -> None:
        self.ids.extend(m.message_id for m in messages)
        super().submit_send(messages, queue, **kwargs)


@pytest.mark.parametrize("code", ["HA_NOT_AVAILABLE", "SLAVE_PERSISTENCE_TIMEOUT"])
def test_a_sync_masters_not_replicated_answer_is_resent_by_default_with_the_same_id(
    transport: Transport, code: str
) -> None:
    """docs/ha.md: a failover under way answers "stored, no slave confirmed it"; a
    producer with default settings sends again (the same message id, which the server
    de-duplicates), within its retry budget, then raises."""
    from reliable import BrokerCallError
    from reliable.errors import FailureKind

    def error() -> Exception:
        return BrokerCallError(FailureKind.NOT_REPLICATED, "no slave", code=code)

    seam = IdRecorder(transport, 2, error)
    with Producer(seam) as producer:  # type: ignore[arg-type]
        message = Message("not-replicated", b"x")
        receipt = producer.send(message)
        assert receipt.status is SendStatus.SEND_OK
        assert seam.ids == [message.message_id] * 3  # two refusals, then stored
        seam.ids.clear()
        seam.queues.clear()
        later = Message("not-replicated", b"y")
        assert producer.send_async(later).result(10).status is SendStatus.SEND_OK
        assert seam.ids == [later.message_id] * 3
        seam.queues.clear()
    seam.queues.clear()
    seam._failures = 10**6  # bounded: 1 + 2 attempts, then the failover window, then SendFailed
    with Producer(seam, failover_wait_s=0.5) as producer:  # type: ignore[arg-type]
        started = time.monotonic()
        with pytest.raises(SendFailed) as failed:
            producer.send(Message("not-replicated", b"z"))
        assert 0.5 <= time.monotonic() - started < 3
        assert len(failed.value.attempts) > 3
        assert isinstance(failed.value.last_error, BrokerCallError)
        assert failed.value.last_error.kind is FailureKind.NOT_REPLICATED


class NotReplicatedReceiptFirst(NotFlushedFirst):
    """The in-process broker's form: the first send is stored, its receipt says no slave
    confirmed it (SLAVE_NOT_AVAILABLE)."""

    def send(self, message: Message, queue: QueueRef, **kwargs: Any) -> Any:
        import dataclasses

        receipt = NotFlushedFirst.send(self, message, queue, **kwargs)
        if receipt.status is SendStatus.FLUSH_DISK_TIMEOUT:
            return dataclasses.replace(receipt, status=SendStatus.SLAVE_NOT_AVAILABLE)
        return receipt


def test_a_not_replicated_receipt_is_resent_by_default(transport: Transport) -> None:
    seam = NotReplicatedReceiptFirst(transport)
    with Producer(seam) as producer:  # type: ignore[arg-type]
        receipt = producer.send(Message("not-replicated-receipt", b"x"))
    assert receipt.status is SendStatus.SEND_OK and len(seam.queues) == 2
