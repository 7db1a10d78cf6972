"""The demo's faults, decided up front from one seed so a run can be replayed.

`FaultPlan` says, for every order, whether its transaction rolls back, whether its message is
poison, how many deliveries of it fail before one succeeds, and whether the send after the
commit is lost or duplicated. `ChaoticSender` is the transport side of that plan: it wraps
the producer the outbox sends through and

- **drops** a send after the broker would have accepted it: it answers with a receipt for
  the offset the message would have taken, so the outbox records it as sent, exactly as a
  broker that acknowledged and then lost the message (async flush and a crash) looks to the
  producer; only the resend worker can bring it back;
  (without `queue_ends`, the broker's queue offsets, the send fails instead, as a
  connection lost before the answer);
- **duplicates** a send (a producer retry after a lost acknowledgement): the consumer sees
  the same message id twice and the idempotency guard must absorb the copy.
"""

from __future__ import annotations

import random
import threading
import zlib
from dataclasses import dataclass, field
from typing import Protocol

from reliable import Message, SendReceipt
from reliable.transport import Transport


class QueueEnds(Protocol):
    """Where the next message of a queue will land (`outbox.QueueBounds`)."""

    def max_offset(self, topic: str, queue_id: int) -> int | None: ...


@dataclass(frozen=True)
class FaultRates:
    """How often each fault happens (probabilities per order), and how many poison messages."""

    fail: float = 0.15  # a delivery fails (then 1..max_failures deliveries fail in a row)
    max_failures: int = 2  # transient failures per message; below max_reconsume_times
    poison: int = 3  # malformed messages: every delivery fails, they end in the DLQ
    drop: float = 0.05  # the send after the commit is lost
    duplicate: float = 0.05  # the send after the commit happens twice
    rollback: float = 0.05  # the order's transaction rolls back: no order, no message

    def check(self) -> None:
        for name in ("fail", "drop", "duplicate", "rollback"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} rate must be between 0 and 1, got {value}")
        if self.poison < 0 or self.max_failures < 1:
            raise ValueError("poison must be >= 0 and max_failures >= 1")


@dataclass
class OrderFate:
    """What happens to one order."""

    order_id: str
    rolled_back: bool = False
    poison: bool = False
    failures: int = 0  # deliveries that fail before one succeeds
    dropped: bool = False
    duplicated: bool = False


@dataclass
class FaultPlan:
    """Every order's fate, drawn from `seed`."""

    seed: int
    fates: list[OrderFate] = field(default_factory=list)

    @classmethod
    def draw(cls, seed: int, orders: int, rates: FaultRates) -> FaultPlan:
        rates.check()
        rng = random.Random(seed)
        fates = [OrderFate(f"O-{seed % 100000:05d}-{i:06d}") for i in range(orders)]
        for fate in fates:
            fate.rolled_back = rng.random() < rates.rollback
        committed = [f for f in fates if not f.rolled_back]
        for fate in rng.sample(committed, min(rates.poison, len(committed))):
            fate.poison = True
        for fate in committed:
            if not fate.poison and rng.random() < rates.fail:
                fate.failures = rng.randint(1, rates.max_failures)
            fate.dropped = rng.random() < rates.drop
            fate.duplicated = not fate.dropped and rng.random() < rates.duplicate
        return cls(seed, fates)

    def by_id(self) -> dict[str, OrderFate]:
        return {f.order_id: f for f in self.fates}


class ChaoticSender:
    """A `outbox.Sender` that loses or repeats the sends the plan names (by message key)."""

    def __init__(
        self,
        producer: object,
        transport: Transport,
        plan: FaultPlan,
        *,
        queue_ends: QueueEnds | None = None,
    ) -> None:
        self._producer = producer
        self._queue_ends = queue_ends
        self._acknowledge_drops = queue_ends is not None
        self._transport = transport
        self._fates = plan.by_id()
        self._lock = threading.Lock()
        self.dropped: list[str] = []  # message ids acknowledged but never stored
        self.duplicated: list[str] = []

    def send(self, message: Message) -> SendReceipt:
        fate = self._fates.get(message.keys[0]) if message.keys else None
        if fate is not None and fate.dropped:
            with self._lock:
                first = message.message_id not in self.dropped  # only the first send is lost
                if first:
                    self.dropped.append(message.message_id)
            if first:
                if not self._acknowledge_drops:
                    raise ConnectionError("connection lost before the broker answered")
                return self._phantom_receipt(message)
        receipt: SendReceipt = self._producer.send(message)  # type: ignore[attr-defined]
        if fate is not None and fate.duplicated:
            with self._lock:
                first = message.message_id not in self.duplicated
                if first:
                    self.duplicated.append(message.message_id)
            if first:
                self._producer.send(message)  # type: ignore[attr-defined]
        return receipt

    def _phantom_receipt(self, message: Message) -> SendReceipt:
        """The receipt a broker that accepted and then lost the message would have given."""
        queues = self._transport.route(message.topic).write_queues
        queue = queues[zlib.crc32(message.message_id.encode()) % len(queues)]
        assert self._queue_ends is not None
        offset = self._queue_ends.max_offset(message.topic, queue.queue_id) or 0
        return SendReceipt(
            message_id=message.message_id,
            topic=message.topic,
            queue_id=queue.queue_id,
            queue_offset=offset,
        )
