"""What a push consumer calls: a listener taking a batch and a context, returning a result."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from reliable.message import ConsumeResult, ReceivedMessage
from reliable.transport.base import QueueRef

DLQ_NOW = -1  # delay_level_when_next_consume: dead-letter at once, no more retries


class MessageModel(enum.Enum):
    CLUSTERING = "CLUSTERING"  # each message to one consumer of the group
    BROADCASTING = "BROADCASTING"  # each message to every consumer of the group


@dataclass(slots=True)
class ConsumeContext:
    """Per-call context a listener may adjust to steer the retry."""

    group: str
    queue: QueueRef | None = None
    orderly: bool = False
    # concurrent mode: 0 = the broker's ladder (3 + reconsume times), n = level n, -1 = DLQ now
    delay_level_when_next_consume: int = 0
    # orderly mode: how long to suspend the queue before the local retry (None: the default)
    suspend_ms: int | None = None
    # the listener finished the batch without success on purpose (Discard): acknowledged
    discarded: bool = False
    # with RECONSUME_LATER: how many messages at the head of the batch did succeed (only the
    # rest is retried; RocketMQ's ackIndex)
    succeeded: int = 0


class MessageListener(Protocol):
    def __call__(
        self, messages: Sequence[ReceivedMessage], context: ConsumeContext, /
    ) -> ConsumeResult: ...


class PreparingListener(MessageListener, Protocol):
    """A listener that wants each received batch before its messages are handled: the
    receive engine calls `prepare(batch)` once, then the listener per message as ever (a
    guard takes the batch's leases together there). `prepare` must not raise."""

    def prepare(self, messages: Sequence[ReceivedMessage], /) -> None: ...
