"""The one interface every transport implements, and the values that cross it.

Two consumption models sit behind it, because the two kinds of broker offer different ones:

- **Invisible time** (`receive` / `ack` / `change_invisible_duration` / `forward_to_dlq`): the
  broker keeps delivery state; the client holds receipt handles. Every transport offers it:
  it is all a RocketMQ 5 gRPC endpoint offers, and `SimpleConsumer` uses nothing else.
- **Pull** (`pull`, offsets, `send_back`, the live consumer list): the client keeps delivery
  state (process queues, the smallest in-flight offset, rebalance). Only transports that
  declare `Capability.PULL` offer it (the embedded one).

`PushConsumer` runs its pull engine when the transport can pull and its invisible-time engine
otherwise; handler code never sees the difference. Producing is the same on every transport.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, cast

from protocol.results import PullStatus as PullStatus  # one enum for both layers
from reliable.message import Message, ReceivedMessage, SendReceipt


class Capability(enum.Enum):
    """Optional parts of the transport interface."""

    PULL = "pull"  # pull / offsets / send_back / consumer_ids: client-side rebalance
    BROKER_SIDE_FIFO = "broker_side_fifo"  # receive(fifo=True) blocks a message group in flight
    MEMBERSHIP_EVENTS = "membership_events"  # watch_consumers: rebalance at once on changes
    # receive(auto_renew=True): the server keeps what a client received invisible while the
    # client lives and releases it when the client leaves or its connection is lost
    SERVER_LEASES = "server_leases"
    # set_group_start / park_message_group (GroupAdmin): the server sets where a new
    # consumer group starts and parks a message group an ordered consumer gave up on
    GROUP_ADMIN = "group_admin"
    # set_direct_listener (DirectConsume): the server may hand one message straight to this
    # client (an operator's `reliable admin message reconsume --client`, RocketMQ's
    # CONSUME_MESSAGE_DIRECTLY) and the consumer's listener answers it
    DIRECT_CONSUME = "direct_consume"
    # parked_groups (ParkedGroupRecord): the broker in this process keeps the durable record
    # of the message groups an ordered consumer parked; sending a message marked
    # PARKED_MESSAGE_GROUP to the DLQ parks its group there
    PARKED_GROUPS = "parked_groups"


class QueueRef(NamedTuple):
    """One message queue: a topic's queue on one broker."""

    topic: str
    broker: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker}#{self.queue_id}"


@dataclass(frozen=True, slots=True)
class TopicRoute:
    """Where a topic can be written and read."""

    topic: str
    write_queues: tuple[QueueRef, ...]
    read_queues: tuple[QueueRef, ...]

    @property
    def brokers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(q.broker for q in self.write_queues + self.read_queues))


class TransactionState(enum.Enum):
    """The producer's verdict on a half message."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"  # decide later: the broker's check-back asks the checker again


class ConsumeFrom(enum.Enum):
    """Where a group with no committed offset starts on a queue."""

    LAST = "LAST"
    FIRST = "FIRST"
    TIMESTAMP = "TIMESTAMP"


@dataclass(slots=True)
class PullBatch:
    status: PullStatus
    messages: list[ReceivedMessage]
    next_offset: int
    min_offset: int = 0
    max_offset: int = 0


@dataclass(frozen=True, slots=True)
class TransactionRef:
    """What `end_transaction` needs to find a half message again."""

    topic: str
    message_id: str
    transaction_id: str | None
    offset_msg_id: str | None
    extra: Mapping[str, str] = field(default_factory=dict)


TransactionChecker = Callable[[ReceivedMessage], TransactionState]


class Transport(Protocol):
    """What the producer and consumers need from a broker."""

    name: str
    capabilities: frozenset[Capability]

    def start(self) -> None: ...
    def close(self) -> None: ...

    # --- producing
    def route(self, topic: str) -> TopicRoute: ...
    def send(
        self,
        message: Message,
        queue: QueueRef,
        *,
        producer_group: str | None = None,
        transactional: bool = False,
        timeout_s: float | None = None,
    ) -> SendReceipt:
        """Store one message on `queue`; raise `BrokerCallError` with the right `kind`."""
        ...

    def send_batch(
        self, messages: Sequence[Message], queue: QueueRef, *, producer_group: str | None = None
    ) -> list[SendReceipt]: ...
    def end_transaction(
        self,
        producer_group: str,
        ref: TransactionRef,
        state: TransactionState,
        *,
        from_check: bool = False,
    ) -> None: ...
    def recall(self, topic: str, recall_handle: str) -> str:
        """Cancel a delayed message before it is due (the handle of its receipt); return its
        message id. `BadRequest` when the handle is malformed, for another topic, or the
        message was already delivered."""
        ...

    def set_transaction_checker(
        self, producer_group: str, checker: TransactionChecker | None
    ) -> None:
        """Register (None: remove) the checker the broker's check-back reaches; the transport
        answers the broker with the state the checker returns."""
        ...

    # --- client liveness
    def heartbeat(
        self, client_id: str, group: str, subscriptions: Mapping[str, Collection[str] | None]
    ) -> None: ...
    def unregister(self, client_id: str, group: str) -> None: ...

    # --- invisible-time consumption (every transport)
    def receive(
        self,
        group: str,
        topic: str,
        max_msgs: int,
        invisible_ms: int,
        tags: Collection[str] | None = None,
        *,
        long_poll_ms: int = 0,
        fifo: bool = False,
    ) -> list[ReceivedMessage]:
        """Messages with `receipt_handle` set and `reconsume_times` = delivery attempt - 1."""
        ...

    def ack(self, group: str, message: ReceivedMessage) -> None: ...
    def change_invisible_duration(
        self, group: str, message: ReceivedMessage, invisible_ms: int
    ) -> str:
        """Return the new receipt handle (also stored on `message`); the old one is dead."""
        ...

    def forward_to_dlq(self, group: str, message: ReceivedMessage) -> None: ...
    def max_delivery_attempts(self, group: str) -> int: ...
    def delay_levels_ms(self, group: str | None = None) -> list[int]:
        """The retry ladder (level 1 first), used to space redeliveries; `group`: the ladder
        that consumer group was given (a server may set it per group)."""
        ...

    def retry_topic(self, group: str) -> str: ...
    def dlq_topic(self, group: str) -> str: ...


class PullTransport(Transport, Protocol):
    """A transport with `Capability.PULL`: the client keeps offsets and rebalances."""

    def consumer_ids(self, group: str) -> list[str]: ...
    def pull(
        self,
        group: str,
        queue: QueueRef,
        offset: int,
        max_msgs: int,
        tags: Collection[str] | None = None,
        *,
        suspend_ms: int = 0,
    ) -> PullBatch: ...
    def commit_offset(self, group: str, queue: QueueRef, offset: int) -> None: ...
    def query_offset(self, group: str, queue: QueueRef) -> int:
        """The committed offset, or -1 when the group has none."""
        ...

    def initial_offset(
        self, group: str, queue: QueueRef, where: ConsumeFrom, timestamp_ms: int | None = None
    ) -> int: ...
    def send_back(
        self,
        group: str,
        message: ReceivedMessage,
        delay_level: int = 0,
        max_reconsume_times: int | None = None,
    ) -> None:
        """Hand a failed message back for a later retry (0: the broker's ladder; -1: DLQ now)."""
        ...


class MembershipEvents(Protocol):
    """A transport with `Capability.MEMBERSHIP_EVENTS` (optional): consumers rebalance at once
    when their group's membership changes instead of at their next period."""

    def watch_consumers(
        self, group: str, client_id: str, callback: Callable[[str], None] | None
    ) -> None:
        """Call `callback(group)` on every membership change of `group` (None: stop)."""
        ...


class ServerLeases(Protocol):
    """A transport with `Capability.SERVER_LEASES`."""

    def receive(
        self,
        group: str,
        topic: str,
        max_msgs: int,
        invisible_ms: int,
        tags: Collection[str] | None = None,
        *,
        long_poll_ms: int = 0,
        fifo: bool = False,
        auto_renew: bool = False,
    ) -> list[ReceivedMessage]:
        """`auto_renew`: the server renews the messages' invisible time while this client
        lives (the receipt handles stay valid) and releases them when it leaves."""
        ...


class GroupAdmin(Protocol):
    """A transport with `Capability.GROUP_ADMIN`: each call returns False when the server
    at the other end does not offer it."""

    def set_group_start(
        self, group: str, topic: str, where: ConsumeFrom, timestamp_ms: int | None = None
    ) -> bool:
        """Commit where `group` starts on every queue of `topic` it has not consumed yet."""
        ...

    def make_group_fifo(self, group: str) -> bool:
        """Make `group` FIFO on the server (created so, or changed keeping its other
        settings): the server then delivers each message group in order."""
        ...

    def park_message_group(self, group: str, topic: str, message_group: str) -> bool:
        """From now on the server dead-letters `message_group`'s messages for `group`
        (marked `PARKED_MESSAGE_GROUP`) until an operator unparks it."""
        ...


# what a consumer does with a message the server delivers to it directly: (consumed, why
# not); it runs outside the group's delivery bookkeeping (no ack, no retry, no offsets)
DirectListener = Callable[[ReceivedMessage], tuple[bool, str]]


class DirectConsume(Protocol):
    """A transport with `Capability.DIRECT_CONSUME`."""

    def set_direct_listener(self, group: str, listener: DirectListener | None) -> None:
        """Run `listener` on messages the server delivers directly to this transport's client
        of `group` and answer the server with its verdict (None: refuse them)."""
        ...

    def consumer_client_id(self, group: str) -> str:
        """The client id the server knows this transport's consumer of `group` by."""
        ...


class ParkedGroupRecord(Protocol):
    """A transport with `Capability.PARKED_GROUPS`."""

    def parked_groups(self, group: str, topic: str) -> frozenset[str]:
        """The message groups of `group` parked on `topic`, until an operator unparks them:
        the broker's durable record (it holds across restarts and rebalances)."""
        ...


def can_pull(transport: Transport) -> bool:
    return Capability.PULL in transport.capabilities


def parked_group_record(transport: Transport) -> ParkedGroupRecord | None:
    """The transport's record of parked groups, when it offers one (`PARKED_GROUPS`)."""
    if Capability.PARKED_GROUPS in transport.capabilities:
        return cast(ParkedGroupRecord, transport)
    return None


def parse_tags(expression: str | None) -> frozenset[str] | None:
    """`"*"`, `""` or None: every tag; `"a || b"`: those tags."""
    if expression is None:
        return None
    parts = [p.strip() for p in expression.split("||")]
    tags = frozenset(p for p in parts if p)
    if not tags or "*" in tags:
        return None
    return tags
