"""Test support for applications: a throwaway in-process broker with a virtual clock.

    from reliable.testing import TestBroker

    def test_billing_retries_then_succeeds():
        with TestBroker() as tb, Worker(bill, transport=tb.transport):
            with tb.producer() as p:
                p.send(Message("orders", b"42"))
            ...                 # first attempt fails
            tb.advance(10)      # the real ladder: retry 1 is due after 10 s of virtual time
            ...                 # second attempt
            tb.settle()         # or play the whole ladder out, whatever it holds

Only the broker's notion of time is virtual: delays, retries, invisible times and
transaction checks become due when the test calls `advance`, not after real minutes.
`run_handler` calls a declared handler on one message with no broker at all.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from broker.broker import Broker
from broker.config import BrokerConfig
from broker.pop_journal import InFlight
from broker.store.config import (
    WATERMARKS_OFF,
    StoreConfig,
    max_message_size_for,
    smallest_commitlog_file_for,
)
from protocol.clock import wall_ms
from reliable.consumer.listener import ConsumeContext
from reliable.decorators import Handler
from reliable.message import ConsumeResult, Message, ReceivedMessage
from reliable.producer import Producer
from reliable.transport.base import QueueRef
from reliable.transport.embedded import EmbeddedTransport

__all__ = ["TestBroker", "VirtualClock", "run_handler"]


class VirtualClock:
    """Milliseconds since the epoch that move only when told to."""

    def __init__(self, start_ms: int | None = None) -> None:
        self._now = wall_ms() if start_ms is None else start_ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time only moves forward")
        with self._lock:
            self._now += int(seconds * 1000)


class TestBroker:
    """A started broker on a temporary small store, its transport, and a virtual clock.

    `broker_options` are `BrokerConfig` fields (e.g. `message_delay_level="1s 2s"`)."""

    __test__ = False  # not a pytest test class

    def __init__(self, *, start_ms: int | None = None, **broker_options: Any) -> None:
        self.clock = VirtualClock(start_ms)
        self.directory = Path(tempfile.mkdtemp(prefix="reliable-test-"))
        broker_config = BrokerConfig(**broker_options)
        # one body limit: a body of exactly the broker's limit is stored here as on a served
        # broker, so the small commitlog files are still big enough for the largest record
        record = max_message_size_for(broker_config.max_message_size)
        commitlog = max(4 << 20, smallest_commitlog_file_for(record))
        store = StoreConfig(
            store_dir=self.directory,
            mapped_file_size_commitlog=commitlog,
            max_message_size=record,
            mapped_file_size_consume_queue=20 * 20_000,
            max_hash_slot_num=4096,
            max_index_num=16_384,
            warm_mapped_file=False,
            # a throwaway store on a shared disk: the host's fill level is
            # not the test's to answer for
            **WATERMARKS_OFF,
        )
        self.broker = Broker(store, broker_config, clock=self.clock.now_ms)
        self.broker.start()
        self.transport = EmbeddedTransport(broker=self.broker)

    def advance(self, seconds: float) -> None:
        """Move virtual time forward and run the time-driven broker passes now: due delayed
        and retried messages, expired invisible times, transaction checks."""
        self.clock.advance(seconds)
        self.broker.deliver_due()
        self.broker.revive()
        self.broker.do_maintenance()
        self.broker.check_transactions()

    def settle(self, *, quiet_s: float = 0.2, timeout_s: float = 30.0) -> float:
        """Play out every retry and delay: wait until the consumers are idle, advance the
        virtual clock to the next thing due (a delay level's or a retry's time, an invisible
        time running out), and again, until nothing is scheduled or in flight. Returns the
        virtual seconds that passed.

        "Idle" means the broker saw nothing new (no record stored, no delivery, ack or
        offset commit) for `quiet_s` of real time: give a handler slower than that a longer
        `quiet_s`. `TimeoutError` when it has not settled after `timeout_s` of real time (a
        handler that never returns, or one that keeps producing)."""
        deadline = time.monotonic() + timeout_s
        start = self.clock.now_ms()
        while True:
            self.advance(0)  # what is due now
            self._wait_quiet(quiet_s, deadline)
            wake = self._next_wake()
            if wake is None:
                return (self.clock.now_ms() - start) / 1000
            if time.monotonic() > deadline:
                raise TimeoutError(f"not settled after {timeout_s} s: next due at {wake}")
            self.clock.advance((wake - self.clock.now_ms() + 0.5) / 1000)

    def _next_wake(self) -> int | None:
        """When the broker next has something to do by time alone (later than now); None:
        nothing. A lease already run out waits for a consumer, not for time."""
        now = self.clock.now_ms()
        times = [f.invisible_until_ms for f in self._in_flight()]
        due = self.broker.next_due_ms()
        if due is not None:
            times.append(due)
        return min((t for t in times if t > now), default=None)

    def _in_flight(self) -> list[InFlight]:
        topics = [t.name for t in self.broker.topics()]
        return [
            f
            for g in self.broker.groups()
            for t in topics
            for f in self.broker.in_flight(g.group, t)
        ]

    def _state(self) -> tuple[object, ...]:
        """What changes while consumers work: the log's end, deliveries and acks, leases
        and committed offsets."""
        b = self.broker
        return (
            b.store.get_commitlog_max_offset(),
            sum(b.delivered.snapshot().values()),
            sum(b.acked.snapshot().values()),
            len(self._in_flight()),
            tuple(
                (g.group, p.topic, p.queue_id, p.consumer_offset)
                for g in b.groups()
                for p in b.consumer_progress(g.group)
            ),
        )

    def _wait_quiet(self, quiet_s: float, deadline: float) -> None:
        self.broker.store.wait_dispatched(max(0.0, deadline - time.monotonic()))
        last, since = self._state(), time.monotonic()
        while time.monotonic() - since < quiet_s:
            if time.monotonic() > deadline:
                raise TimeoutError("the consumers did not go idle")
            time.sleep(0.01)
            now = self._state()
            if now != last:
                last, since = now, time.monotonic()

    def producer(self, **options: Any) -> Producer:
        return Producer(self.transport, **options)

    def messages(self, topic: str) -> list[ReceivedMessage]:
        """Everything stored in `topic` (e.g. `%DLQ%billing`), without consuming it."""
        out: list[ReceivedMessage] = []
        if self.broker.get_topic(topic) is None:
            return out
        for qid in self.transport.route(topic).read_queues:
            offset = self.broker.min_offset(topic, qid.queue_id)
            while True:
                batch = self.transport.pull(
                    "reliable-testing", QueueRef(topic, qid.broker, qid.queue_id), offset, 32
                )
                out.extend(batch.messages)
                if not batch.messages or batch.next_offset <= offset:
                    break
                offset = batch.next_offset
        return out

    def close(self) -> None:
        self.broker.shutdown()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> TestBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_handler(
    handler: Handler, message: Message | ReceivedMessage, *, reconsume_times: int = 0
) -> tuple[ConsumeResult, ConsumeContext]:
    """Call a declared handler on one message, as its consumer would; return the result and
    the context (`delay_level_when_next_consume`, `discarded`)."""
    if isinstance(message, Message):
        message = ReceivedMessage(
            message_id=message.message_id,
            topic=message.topic,
            body=bytes(message.body),
            queue_id=0,
            queue_offset=0,
            tags=message.tags,
            keys=list(message.keys),
            properties=dict(message.properties),
            reconsume_times=reconsume_times,
            message_group=message.message_group,
            consumer_group=handler.group,
        )
    ctx = ConsumeContext(group=handler.group)
    return handler.listener([message], ctx), ctx
