"""The small contracts the outbox is built against; transports and brokers satisfy them.

- `Sender`: anything that sends one `reliable.Message` and returns a `reliable.SendReceipt`
  (raising on failure). `reliable.Producer` is one.
- `GroupSender`: a `Sender` that can say whether its broker accepts a resend to one consumer
  group alone, and send one (`reliable.Producer`: `can_send_to_group`, `send_to_group`).
- `OffsetSource`: the broker's committed consumer offset for (group, topic, queue): the next
  offset the group will consume, so a message at `queue_offset < committed` has been passed.
- `QueueBounds` (optional): the broker's current max offset of a queue, so a stub whose
  recorded offset the broker no longer holds (lost in a crash under async flush) is noticed.
- `Clock`: naive UTC `datetime` now (the tables store naive UTC); injected so tests never sleep.

Topic names and property names are the broker's (`protocol.names`, `protocol.props.Prop`):
`retry_topic` here is `protocol.names.retry_topic` itself.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

from protocol.names import retry_topic
from protocol.props import Prop
from reliable.message import Message, SendReceipt

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    """Naive UTC now, the form every outbox timestamp column stores."""
    return datetime.now(UTC).replace(tzinfo=None)


@runtime_checkable
class Sender(Protocol):
    """Sends one message; returns where it landed; raises on failure."""

    def send(self, message: Message) -> SendReceipt: ...


@runtime_checkable
class GroupSender(Protocol):
    """A `Sender` that can also resend to one consumer group alone (`reliable.Producer`).

    `can_send_to_group()`: whether the broker accepts it (the embedded broker and our
    server do, an Apache RocketMQ proxy does not; asked of the broker, never guessed from a
    refusal). `send_to_group(message, group)`: the copy for that group only."""

    def send(self, message: Message) -> SendReceipt: ...

    def can_send_to_group(self) -> bool: ...

    def send_to_group(self, message: Message, group: str) -> SendReceipt: ...


@runtime_checkable
class OffsetSource(Protocol):
    """The broker's committed consumer offset (next offset to consume), or None if unknown."""

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int | None: ...


@runtime_checkable
class QueueBounds(Protocol):
    """The broker's max offset of a queue (one past the last message), or None if unknown."""

    def max_offset(self, topic: str, queue_id: int) -> int | None: ...


# Property carrying the original topic of a message resent through a group's retry topic
# (`%RETRY%<group>`, `protocol.names.retry_topic`): the broker's own `RETRY_TOPIC`.
PROPERTY_RETRY_TOPIC = Prop.RETRY_TOPIC

# Property numbering a resend (the stub's send count of that copy: "2" for the first resend).
# A copy that differs from the first send only by its number is still the same message id to
# consumers (the guard runs it once), but a server that deduplicates client retries on (topic,
# message id, properties) stores it instead of answering with the first send's receipt.
PROPERTY_SEND_COUNT = "OUTBOX_SEND_COUNT"


__all__ = [
    "PROPERTY_RETRY_TOPIC",
    "PROPERTY_SEND_COUNT",
    "Clock",
    "GroupSender",
    "OffsetSource",
    "QueueBounds",
    "Sender",
    "retry_topic",
    "utcnow",
]
