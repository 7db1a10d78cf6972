"""Consumers through the public API: rebalancing, broadcasting, back-pressure, the
invisible-time engine and the SimpleConsumer."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from reliable import (
    ConsumeContext,
    ConsumeResult,
    Message,
    MessageModel,
    Producer,
    PushConsumer,
    ReceiptHandleError,
    ReceivedMessage,
    SimpleConsumer,
    Transport,
    TransportError,
    allocate_consistent_hash,
)
from tests.e2e.helpers import FAST, stays, wait_until


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: Counter[str] = Counter()
        self.by: dict[str, Counter[str]] = {}

    def listener(self, name: str):  # type: ignore[no-untyped-def]
        self.by[name] = Counter()

        def consume(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
            with self.lock:
                for m in msgs:
                    self.seen[m.message_id] += 1
                    self.by[name][m.message_id] += 1
            return ConsumeResult.SUCCESS

        return consume


@pytest.mark.parametrize("allocate", ["averagely", "consistent_hash"])
def test_two_consumers_split_queues_and_one_takes_over(transport: Transport, allocate: str) -> None:
    options = dict(FAST)
    if allocate == "consistent_hash":
        options["allocate"] = allocate_consistent_hash
    rec = Recorder()
    c1 = PushConsumer(
        "split-g",
        rec.listener("c1"),
        {"split": "*"},
        transport=transport,
        client_id="c1",
        **options,
    )
    c2 = PushConsumer(
        "split-g",
        rec.listener("c2"),
        {"split": "*"},
        transport=transport,
        client_id="c2",
        **options,
    )
    with Producer(transport) as producer:
        producer.send(Message("split", b"create the topic"))
        c1.start()
        c2.start()
        try:

            def split() -> bool:
                a = {q for q in c1.assigned_queues if q.topic == "split"}
                b = {q for q in c2.assigned_queues if q.topic == "split"}
                return len(a | b) == 4 and not a & b and bool(a) and bool(b)

            wait_until(split, what="the queues to be split")
            sent = [producer.send(Message("split", f"{i}".encode())).message_id for i in range(40)]
            wait_until(lambda: set(sent) <= set(rec.seen), what="the first 40")
            assert rec.by["c1"] and rec.by["c2"]  # both consumed
            c2.shutdown()
            wait_until(
                lambda: len([q for q in c1.assigned_queues if q.topic == "split"]) == 4,
                what="c1 to take every queue",
            )
            sent += [
                producer.send(Message("split", f"{i}".encode())).message_id for i in range(40, 120)
            ]
            wait_until(lambda: set(sent) <= set(rec.seen), what="all 120")
        finally:
            c1.shutdown()
            c2.shutdown()
    duplicates = sum(n - 1 for n in rec.seen.values())
    print(f"{allocate}: 121 sent, {len(rec.seen)} received, {duplicates} duplicate(s)")
    assert set(sent) <= set(rec.seen)  # no loss


def test_broadcasting_gives_every_consumer_every_message(transport: Transport) -> None:
    rec = Recorder()
    consumers = [
        PushConsumer(
            "bcast-g",
            rec.listener(n),
            {"bcast": "*"},
            transport=transport,
            client_id=n,
            message_model=MessageModel.BROADCASTING,
            **FAST,
        )
        for n in ("x", "y")
    ]
    for c in consumers:
        c.start()
    try:
        with Producer(transport) as producer:
            sent = {producer.send(Message("bcast", b"hello")).message_id for _ in range(10)}
        wait_until(lambda: set(rec.by["x"]) == sent and set(rec.by["y"]) == sent)
    finally:
        for c in consumers:
            c.shutdown()


def test_back_pressure_caps_cached_messages_per_queue(transport: Transport) -> None:
    gate = threading.Event()
    inflight = [0]
    peak = [0]
    lock = threading.Lock()

    def slow(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        with lock:
            inflight[0] += len(msgs)
            peak[0] = max(peak[0], inflight[0])
        gate.wait(10)
        with lock:
            inflight[0] -= len(msgs)
        return ConsumeResult.SUCCESS

    with Producer(transport) as producer:
        receipts = [producer.send(Message("bp", b"x", message_group="one")) for _ in range(60)]
    queue_id = receipts[0].queue_id
    settings = dict(FAST, consume_threads=20, pull_threshold_for_queue=5, pull_batch_size=4)
    consumer = PushConsumer("bp-g", slow, {"bp": "*"}, transport=transport, **settings)
    with consumer:
        wait_until(lambda: peak[0] >= 5, what="the cache to fill")
        # the puller stops at the threshold: at most threshold + one pull batch are held
        assert stays(lambda: inflight[0] <= 5 + 4, 0.5)
        gate.set()
    assert {r.queue_id for r in receipts} == {queue_id}


def test_receive_engine_redelivers_failures(transport: Transport) -> None:
    """The invisible-time engine (the one a gRPC endpoint needs), over the embedded broker."""
    attempts: Counter[str] = Counter()

    def consume(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        m = msgs[0]
        attempts[m.message_id] += 1
        assert m.reconsume_times == attempts[m.message_id] - 1
        return (
            ConsumeResult.SUCCESS if attempts[m.message_id] >= 2 else ConsumeResult.RECONSUME_LATER
        )

    with Producer(transport) as producer:
        sent = {producer.send(Message("pop", b"x")).message_id for _ in range(5)}
    consumer = PushConsumer(
        "pop-g",
        consume,
        {"pop": "*"},
        transport=transport,
        engine="receive",
        receive_long_poll_ms=200,
        invisible_ms=5_000,
        **FAST,
    )
    with consumer:
        wait_until(lambda: all(attempts[i] == 2 for i in sent), what="two attempts each")
        assert stays(lambda: all(attempts[i] == 2 for i in sent), 0.5)


def test_simple_consumer_receive_ack_and_change_invisible(transport: Transport) -> None:
    with Producer(transport) as producer:
        sent = {producer.send(Message("simple", f"{i}".encode())).message_id for i in range(3)}
    with SimpleConsumer(
        "simple-g", {"simple": "*"}, transport=transport, await_duration_s=0.5
    ) as consumer:
        got: list[ReceivedMessage] = []
        wait_until(
            lambda: got.extend(consumer.receive(10, invisible_duration_s=0.3)) or len(got) == 3,
            what="3 messages",
        )
        assert {m.message_id for m in got} == sent
        keep, extend, forget = got
        consumer.ack(keep)
        old = extend.receipt_handle
        new = consumer.change_invisible_duration(extend, 30)
        assert new != old and extend.receipt_handle == new
        # `forget` is not acked: it comes back after 0.3 s with attempt 2; the others do not
        again: list[ReceivedMessage] = []
        wait_until(
            lambda: again.extend(consumer.receive(10, invisible_duration_s=5)) or bool(again),
            what="the redelivery",
        )
        assert [(m.message_id, m.delivery_attempt) for m in again] == [(forget.message_id, 2)]
        consumer.ack(again[0])
        stale = ReceivedMessage(**{**_fields(extend), "receipt_handle": old})
        with pytest.raises(ReceiptHandleError):
            consumer.ack(stale)  # the handle replaced by change_invisible_duration is dead
        consumer.ack(extend)


def _fields(m: ReceivedMessage) -> dict[str, object]:
    return {f: getattr(m, f) for f in m.__dataclass_fields__}


def test_graceful_shutdown_commits_offsets_so_a_successor_sees_no_duplicates(
    transport: Transport,
) -> None:
    first, second = Recorder(), Recorder()
    with Producer(transport) as producer:
        old = {producer.send(Message("handover", b"x")).message_id for _ in range(30)}
        c1 = PushConsumer(
            "handover-g",
            first.listener("c1"),
            {"handover": "*"},
            transport=transport,
            persist_offset_interval_s=3600,
            **{k: v for k, v in FAST.items() if k != "persist_offset_interval_s"},
        )
        with c1:
            wait_until(lambda: set(first.seen) == old, what="the first 30")
        # periodic persistence was off: only the shutdown committed the offsets
        new = {producer.send(Message("handover", b"y")).message_id for _ in range(10)}
        with PushConsumer(
            "handover-g", second.listener("c2"), {"handover": "*"}, transport=transport, **FAST
        ):
            wait_until(lambda: set(second.seen) == new, what="the 10 new ones")
            assert stays(lambda: set(second.seen) == new, 0.5)
    assert all(n == 1 for n in first.seen.values())


class FailingSendBack:
    """A transport seam: the first `failures` send-backs fail like a lost connection."""

    def __init__(self, inner: Transport, failures: int) -> None:
        self._inner = inner
        self.failures = failures
        self.calls = 0

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._inner, name)

    def send_back(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls <= self.failures:
            raise TransportError("connection reset during send-back")
        return self._inner.send_back(*args, **kwargs)


def test_failed_send_back_is_retried_locally(transport: Transport) -> None:
    seam = FailingSendBack(transport, failures=1)
    attempts: list[int] = []

    def consume(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        attempts.append(msgs[0].reconsume_times)
        return ConsumeResult.SUCCESS if len(attempts) >= 3 else ConsumeResult.RECONSUME_LATER

    with Producer(transport) as producer:
        producer.send(Message("sendback", b"x"))
    with PushConsumer("sendback-g", consume, {"sendback": "*"}, transport=seam, **FAST):  # type: ignore[arg-type]
        wait_until(lambda: len(attempts) == 3, what="3 attempts")
        assert stays(lambda: len(attempts) == 3, 0.8)
    # 1st failure: the send-back is lost -> retried locally (the listener sees reconsume 1);
    # 2nd failure: sent back -> redelivered from %RETRY%, counted by the broker from its
    # stored copy (reconsume 1, as RocketMQ does); then success
    assert attempts == [0, 1, 1] and seam.calls == 2


def test_receive_engine_renews_the_lease_of_a_slow_handler(transport: Transport) -> None:
    calls: Counter[str] = Counter()

    def slow(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        calls[msgs[0].message_id] += 1
        threading.Event().wait(2.4)  # four times the invisible time
        return ConsumeResult.SUCCESS

    with Producer(transport) as producer:
        mid = producer.send(Message("lease", b"x")).message_id
    # 600 ms leases renewed at half-life: 300 ms of slack for the renewal thread, enough on a
    # loaded machine (150 ms was not)
    with PushConsumer(
        "lease-g",
        slow,
        {"lease": "*"},
        transport=transport,
        engine="receive",
        invisible_ms=600,
        receive_long_poll_ms=100,
        **FAST,
    ) as consumer:
        wait_until(lambda: calls[mid] == 1, what="the delivery")
        assert stays(lambda: calls[mid] == 1, 3.0), "redelivered while still being handled"
        assert transport.broker.in_flight("lease-g", "lease") == []  # type: ignore[attr-defined]
    assert consumer.group == "lease-g"


def test_receive_engine_gathers_a_batch_while_every_handler_is_busy(
    transport: Transport, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4 handler threads hold up to 8 messages: once started, every receive asks for at
    least 4, never for the one slot a finished handler frees (a round trip a message)."""
    asked: list[int] = []
    real = transport.receive

    def receive(group: str, topic: str, max_messages: int, *args: object, **kw: object):  # type: ignore[no-untyped-def]
        if group == "gather-g":
            asked.append(max_messages)
        return real(group, topic, max_messages, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(transport, "receive", receive)
    lock = threading.Lock()
    handled: Counter[str] = Counter()

    def slow(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        threading.Event().wait(0.02)
        with lock:
            handled[msgs[0].message_id] += 1
        return ConsumeResult.SUCCESS

    with Producer(transport) as producer:
        sent = {producer.send(Message("gather", b"x")).message_id for _ in range(60)}
    settings = dict(FAST, consume_threads=4, receive_long_poll_ms=100)
    with PushConsumer(
        "gather-g", slow, {"gather": "*"}, transport=transport, engine="receive", **settings
    ):
        wait_until(lambda: set(handled) == sent, what="every message handled")
    assert all(n == 1 for n in handled.values())
    assert asked and min(asked) >= 4, asked


def test_receive_engine_hands_each_batch_to_the_listeners_prepare_first(
    transport: Transport,
) -> None:
    lock = threading.Lock()
    prepared: list[str] = []
    handled_unprepared: list[str] = []
    handled: Counter[str] = Counter()

    class Preparing:
        def __call__(self, msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
            with lock:
                if msgs[0].message_id not in prepared:
                    handled_unprepared.append(msgs[0].message_id)
                handled[msgs[0].message_id] += 1
            return ConsumeResult.SUCCESS

        def prepare(self, msgs: list[ReceivedMessage]) -> None:
            with lock:
                prepared.extend(m.message_id for m in msgs)

    with Producer(transport) as producer:
        sent = {producer.send(Message("prep", b"x")).message_id for _ in range(30)}
    with PushConsumer(
        "prep-g", Preparing(), {"prep": "*"}, transport=transport, engine="receive", **FAST
    ):
        wait_until(lambda: set(handled) == sent, what="every message handled")
    assert handled_unprepared == [] and sorted(prepared) == sorted(sent)
