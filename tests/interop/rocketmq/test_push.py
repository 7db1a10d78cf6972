"""The framework's PushConsumer and handler decorators on Apache RocketMQ 5's proxy.

Concurrent: a failing message is retried on the group's ladder (the delays the proxy hands
the client in its Settings), and after the group's maximum attempts the proxy moves it to
`%DLQ%<group>`. Orderly, on a FIFO group: each message group in order, a poison message
retried locally, then its message group parked (it and every later message of the group
dead-lettered) while the other groups go on. An orderly consumer of a group that is not
FIFO refuses to start. Every outcome a decorated handler can have: `RetryLater` at a level,
an exception in `retry_on` on the ladder, `Discard`, `ignore_on`, `dead_letter_on` and
`dead_letter_other` (each dead letter handled once by a `dlq_handler`), the rate limit,
and the idempotency guard on Redis and PostgreSQL absorbing a second copy of one message.

The broker's pop revive (which makes a retried message visible again) adds a few seconds
to every delay, so delays are asserted as lower bounds: a retry never comes sooner than its
level says.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from apache_rocketmq import MessageType, RocketMQCluster
from idempotency import IdempotencyGuard
from outbox.models import OutboxTables
from reliable import (
    ConfigurationError,
    ConsumeContext,
    ConsumeFrom,
    ConsumeResult,
    Discard,
    Message,
    Producer,
    PushConsumer,
    ReceivedMessage,
    RetryLater,
    SimpleConsumer,
    Transport,
    Worker,
    dlq_handler,
    handler,
    new_message_id,
)
from reliable.consumer.orderly import PARKED_PROPERTY
from reliable.errors import ReliableError
from tests.interop.rocketmq.helpers import grpc_transport, unique, wait_for

# the proxy answers a long poll after 5 s at the earliest; leases are the proxy's (renewed)
CONSUMER: dict[str, Any] = {
    "receive_long_poll_ms": 5000,
    "invisible_ms": 30_000,
    "consume_threads": 4,
}
DEADLINE_S = 60.0


class _Deliveries:
    """What a listener saw: body -> [(delivery attempt, monotonic time)], thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seen: dict[bytes, list[tuple[int, float]]] = defaultdict(list)
        self.order: list[bytes] = []

    def add(self, m: ReceivedMessage) -> int:
        with self._lock:
            self.seen[m.body].append((m.delivery_attempt, time.monotonic()))
            self.order.append(m.body)
            return len(self.seen[m.body])

    def attempts(self, body: bytes) -> list[int]:
        with self._lock:
            return [a for a, _ in self.seen.get(body, [])]

    def gaps(self, body: bytes) -> list[float]:
        with self._lock:
            times = [t for _, t in self.seen.get(body, [])]
        return [b - a for a, b in itertools.pairwise(times)]


@contextmanager
def dead_letters(
    cluster: RocketMQCluster, transport: Transport, group: str
) -> Iterator[SimpleConsumer]:
    """A reader of `%DLQ%<group>`, made before anything is dead-lettered: the topic is
    created up front (the broker keeps it when its first dead letter comes) and read once,
    so the reader starts at its beginning."""
    topic = f"%DLQ%{group}"
    cluster.create_topic(topic)
    reader = unique("dlq-reader")
    cluster.create_group(reader)
    with SimpleConsumer(
        reader, {topic: "*"}, transport=transport, await_duration_s=1, invisible_duration_s=30
    ) as consumer:
        _receive(consumer)
        yield consumer


def _receive(consumer: SimpleConsumer) -> list[ReceivedMessage]:
    try:
        return consumer.receive(max_messages=16)
    except ReliableError:  # a long poll answered late on a loaded machine: ask again
        return []


def _collect(consumer: SimpleConsumer, want: int, timeout_s: float) -> list[ReceivedMessage]:
    got: list[ReceivedMessage] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        for m in _receive(consumer):
            consumer.ack(m)
            got.append(m)
    return got


def _nothing_more(consumer: SimpleConsumer, seconds: float) -> list[ReceivedMessage]:
    """What still arrives within `seconds` (acked, so that a failure shows it once)."""
    return _collect(consumer, 1 << 30, seconds)


def test_concurrent_push_retries_on_the_ladder_then_the_proxy_dead_letters(
    rocketmq: RocketMQCluster,
) -> None:
    topic, group = unique("push"), unique("push-g")
    rocketmq.create_topic(topic)
    # 3 deliveries; a nack asks for level 3 + reconsume times: 1 s, then 2 s
    rocketmq.create_group(group, retry_max_times=2, retry_delays_ms=[1000, 1000, 1000, 2000])
    seen = _Deliveries()

    def listener(messages: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        seen.add(messages[0])
        return ConsumeResult.SUCCESS if messages[0].body == b"ok" else ConsumeResult.RECONSUME_LATER

    with (
        grpc_transport(rocketmq.endpoint) as transport,
        dead_letters(rocketmq, transport, group) as dlq,
        PushConsumer(group, listener, {topic: "*"}, transport=transport, **CONSUMER),
        Producer(transport) as producer,
    ):
        producer.send(Message(topic, b"ok"))
        failing = producer.send(Message(topic, b"fails", keys=["k1"])).message_id
        dead = _collect(dlq, 1, DEADLINE_S)
        assert [(m.message_id, m.body, m.keys) for m in dead] == [(failing, b"fails", ["k1"])]
        assert dead[0].topic == f"%DLQ%{group}"
        assert _nothing_more(dlq, 2.0) == []
    assert seen.attempts(b"ok") == [1]
    assert seen.attempts(b"fails") == [1, 2, 3]  # the group's maximum, then the DLQ
    first, second = seen.gaps(b"fails")
    assert first >= 1.0 and second >= 2.0, (first, second)


def test_orderly_push_on_a_fifo_group_parks_the_poison_message_group(
    rocketmq: RocketMQCluster,
) -> None:
    topic, group = unique("push-fifo"), unique("push-fifo-g")
    rocketmq.create_topic(topic, MessageType.FIFO)
    rocketmq.create_group(group, orderly=True)
    seen = _Deliveries()

    def listener(messages: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        for m in messages:
            seen.add(m)
            if m.body == b"a1":  # poison: fails every time
                return ConsumeResult.RECONSUME_LATER
        return ConsumeResult.SUCCESS

    with (
        grpc_transport(rocketmq.endpoint) as transport,
        dead_letters(rocketmq, transport, group) as dlq,
        PushConsumer(
            group,
            listener,
            {topic: "*"},
            transport=transport,
            orderly=True,
            max_reconsume_times=2,
            suspend_ms=100,
            **CONSUMER,
        ),
        Producer(transport) as producer,
    ):
        for i in range(3):
            for key in "ab":
                producer.send(Message(topic, f"{key}{i}".encode(), message_group=key))
        dead = _collect(dlq, 2, DEADLINE_S)
        assert wait_for(lambda: len(seen.attempts(b"b2")) == 1, DEADLINE_S)
        assert _nothing_more(dlq, 2.0) == []
    # the poison message three times (max_reconsume_times=2), then its group parked:
    # a1 and the a2 behind it dead-lettered in order, a2 never handled; b went on in order
    assert sorted(m.body for m in dead) == [b"a1", b"a2"]
    # the broker copies the stored message: the consumer's mark of the parked group is not
    # on the copies (docs/rocketmq.md names the difference)
    assert all(PARKED_PROPERTY not in m.properties for m in dead)
    assert seen.attempts(b"a1") == [1, 2, 3]
    assert seen.attempts(b"a2") == []
    assert [b for b in seen.order if b.startswith(b"a")] == [b"a0", b"a1", b"a1", b"a1"]
    assert [b for b in seen.order if b.startswith(b"b")] == [b"b0", b"b1", b"b2"]


def test_orderly_push_on_a_group_that_is_not_fifo_refuses_to_start(
    rocketmq: RocketMQCluster,
) -> None:
    topic, group = unique("push-nf"), unique("push-nf-g")
    rocketmq.create_topic(topic, MessageType.FIFO)
    rocketmq.create_group(group)  # not orderly: the proxy would interleave a message group

    def listener(messages: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        return ConsumeResult.SUCCESS

    with grpc_transport(rocketmq.endpoint) as transport:
        consumer = PushConsumer(
            group, listener, {topic: "*"}, transport=transport, orderly=True, **CONSUMER
        )
        with pytest.raises(ConfigurationError, match="not FIFO") as refused:
            consumer.start()
        assert "\n" not in str(refused.value)
        assert f"mqadmin updateSubGroup -g {group} -o true" in str(refused.value)
        assert "orderly=False" in str(refused.value)
        consumer.shutdown()  # nothing started: a no-op


@pytest.mark.parametrize("where", [ConsumeFrom.FIRST, ConsumeFrom.TIMESTAMP])
def test_a_group_start_the_proxy_cannot_set_refuses_to_start(
    rocketmq: RocketMQCluster, where: ConsumeFrom
) -> None:
    """The proxy has no call to set where a new group starts: a consumer asking for one
    other than LAST would read from wherever the broker's default puts it, so it refuses."""
    topic, group = unique("push-from"), unique("push-from-g")
    rocketmq.create_topic(topic)
    rocketmq.create_group(group)

    def listener(messages: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        return ConsumeResult.SUCCESS

    with grpc_transport(rocketmq.endpoint) as transport:
        options = {"consume_timestamp_ms": 1} if where is ConsumeFrom.TIMESTAMP else {}
        consumer = PushConsumer(
            group,
            listener,
            {topic: "*"},
            transport=transport,
            consume_from=where,
            **options,
            **CONSUMER,
        )
        with pytest.raises(ConfigurationError, match=f"consume_from={where.name}") as refused:
            consumer.start()
        assert "\n" not in str(refused.value)
        assert f"mqadmin resetOffsetByTime -g {group} -t {topic}" in str(refused.value)
        assert "consume_from=ConsumeFrom.LAST" in str(refused.value)
        consumer.shutdown()  # nothing started: a no-op
        with PushConsumer(group, listener, {topic: "*"}, transport=transport, **CONSUMER):
            pass  # LAST, the default, starts
        preferred = PushConsumer(
            group,
            listener,
            {topic: "*"},
            transport=transport,
            consume_from=where,
            consume_from_preferred=True,
            **options,
            **CONSUMER,
        )
        with preferred:
            pass  # a preference: logged, the broker's default applies


class InvalidOrder(Exception):
    pass


def test_every_handler_outcome(rocketmq: RocketMQCluster) -> None:
    topic, group = unique("dec"), unique("dec-g")
    rocketmq.create_topic(topic)
    rocketmq.create_group(group, retry_max_times=3, retry_delays_ms=[1000, 2000, 3000, 4000])
    # the dead letters' handler: its group (`<group>-DLQ`) and topic made up front
    rocketmq.create_topic(f"%DLQ%{group}")
    rocketmq.create_group(f"{group}-DLQ")
    seen, dead = _Deliveries(), _Deliveries()
    dead_ids: list[tuple[bytes, str]] = []

    @handler(
        topic,
        group=group,
        retry_on=(RuntimeError,),
        dead_letter_other=True,
        dead_letter_on=(InvalidOrder,),
        ignore_on=(KeyError,),
        **CONSUMER,
    )
    def handle(message: ReceivedMessage) -> None:
        attempt = seen.add(message)
        body = message.body
        if body == b"discard":
            raise Discard("not ours")
        if body == b"ignore":
            raise KeyError("unknown sku")
        if body == b"dead":
            raise InvalidOrder("no such customer")
        if body == b"other":
            raise ValueError("not in retry_on")
        if attempt == 1 and body == b"retry-level-1":
            raise RetryLater(delay_level=1)
        if attempt == 1 and body == b"retry-level-4":
            raise RetryLater(delay_level=4)
        if attempt == 1 and body == b"crash":
            raise RuntimeError("database blip")  # in retry_on: the ladder, level 3 + 0

    @dlq_handler(group, **CONSUMER)
    def dead_letter(message: ReceivedMessage) -> None:
        dead.add(message)
        dead_ids.append((message.body, message.message_id))

    bodies = [b"ok", b"discard", b"ignore", b"dead", b"other"]
    retried = [b"retry-level-1", b"retry-level-4", b"crash"]
    with (
        grpc_transport(rocketmq.endpoint) as transport,
        Worker(handle, dead_letter, transport=transport),
        Producer(transport) as producer,
    ):
        ids = {body: producer.send(Message(topic, body)).message_id for body in bodies + retried}
        assert wait_for(lambda: all(len(seen.attempts(b)) == 2 for b in retried), DEADLINE_S), dict(
            seen.seen
        )
        assert wait_for(lambda: len(dead.order) == 2, DEADLINE_S), dead.order
        time.sleep(2.0)  # anything more would come now
    # dead-lettered at once, each once, with its id
    assert sorted(dead_ids) == [(b"dead", ids[b"dead"]), (b"other", ids[b"other"])]
    # (on Apache the copy's delivery count goes on from the retries: attempt 2 here)
    assert len(dead.attempts(b"dead")) == len(dead.attempts(b"other")) == 1
    for body in bodies:  # settled on their first delivery
        assert seen.attempts(body) == [1], body
    for body in retried:
        assert seen.attempts(body) == [1, 2], body
    # never sooner than the level's delay on the group's ladder
    assert seen.gaps(b"retry-level-1")[0] >= 1.0
    assert seen.gaps(b"retry-level-4")[0] >= 4.0
    assert seen.gaps(b"crash")[0] >= 3.0
    # and nothing settled comes back to the group
    with (
        grpc_transport(rocketmq.endpoint) as transport,
        SimpleConsumer(group, {topic: "*"}, transport=transport, await_duration_s=1) as again,
    ):
        assert _nothing_more(again, 2.0) == []


def test_the_rate_limit_paces_the_handler(rocketmq: RocketMQCluster) -> None:
    topic, group = unique("rate"), unique("rate-g")
    rocketmq.create_topic(topic)
    rocketmq.create_group(group)
    starts: list[float] = []

    @handler(topic, group=group, rate_limit=5, rate_burst=1, **CONSUMER)
    def handle(message: ReceivedMessage) -> None:
        starts.append(time.monotonic())

    with grpc_transport(rocketmq.endpoint) as transport, Producer(transport) as producer:
        for i in range(6):
            producer.send(Message(topic, b"%d" % i))
        with Worker(handle, transport=transport):
            assert wait_for(lambda: len(starts) == 6, DEADLINE_S)
    # 5 a second, one at a time: the sixth starts a second after the first
    assert starts[-1] - starts[0] >= 0.9, starts


@pytest.mark.redis
@pytest.mark.postgres
def test_the_idempotent_guard_on_redis_and_postgres_runs_a_copy_once(
    rocketmq: RocketMQCluster, redis_client: Any, table_prefix: str
) -> None:
    from tests.conftest import POSTGRES_URL

    topic, group = unique("idem"), unique("idem-g")
    rocketmq.create_topic(topic)
    rocketmq.create_group(group, retry_delays_ms=[1000, 1000, 1000])
    engine = sa.create_engine(POSTGRES_URL)
    tables = OutboxTables(prefix=table_prefix)
    tables.create_all(engine)
    guard = IdempotencyGuard(engine, tables, redis_client)
    runs: list[tuple[bytes, int]] = []
    lock = threading.Lock()

    @handler(topic, group=group, idempotent=guard, **CONSUMER)
    def pay(message: ReceivedMessage, session: Any) -> None:
        with lock:
            runs.append((message.body, message.delivery_attempt))
        session.execute(sa.text("select 1"))  # the guard's transaction is the handler's
        if message.body == b"flaky" and message.delivery_attempt == 1:
            raise RuntimeError("payment gateway timeout")  # not done: retried, not absorbed

    try:
        with (
            grpc_transport(rocketmq.endpoint) as transport,
            Worker(pay, transport=transport),
            Producer(transport) as producer,
        ):
            twice = new_message_id()
            producer.send(Message(topic, b"pay 10", message_id=twice))
            producer.send(Message(topic, b"pay 10", message_id=twice))  # a producer's retry
            flaky = producer.send(Message(topic, b"flaky")).message_id
            assert wait_for(lambda: (b"flaky", 2) in runs, DEADLINE_S), runs
            time.sleep(2.0)  # the second copy of "pay 10" has long been delivered
        assert sorted(runs) == [(b"flaky", 1), (b"flaky", 2), (b"pay 10", 1)]
        with engine.connect() as conn:
            confirmed = conn.execute(
                sa.select(tables.confirmation.c.message_id, tables.confirmation.c.consumer_group)
            ).all()
        assert sorted(confirmed) == sorted([(twice, group), (flaky, group)])
    finally:
        tables.drop_all(engine)
        engine.dispose()
