"""The client-side message values every transport, handler and outbox component shares."""

from __future__ import annotations

import dataclasses
import enum
import itertools
import os
import socket
import struct
from dataclasses import dataclass, field

from protocol.clock import wall_ms


class ConsumeResult(enum.Enum):
    """What a listener tells the consumer about one message (or a batch)."""

    SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class SendStatus(enum.Enum):
    """Store status reported back to a producer for an accepted message."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"

    @property
    def not_replicated(self) -> bool:
        """Stored on a sync-master that no slave confirmed it to: the producer resends it
        (the same message id) within its retry budget, by default (docs/ha.md)."""
        return self in (SendStatus.FLUSH_SLAVE_TIMEOUT, SendStatus.SLAVE_NOT_AVAILABLE)


class _UniqueIdGenerator:
    """Client-generated unique message ids (the broker's `UNIQ_KEY`), 32 hex chars.

    Layout: 4 B IPv4, 2 B pid, 4 B class-load hash, 4 B milliseconds (epoch ms, modulo
    2**32), 2 B counter: RocketMQ's `MessageClientIDSetter` shape, so ids sort by time
    within one process (between wraps, every 49 days) and never collide across processes
    on one host; 65,536 ids per millisecond before the counter could repeat one.
    """

    def __init__(self) -> None:
        try:
            ip = socket.inet_aton(socket.gethostbyname(socket.gethostname()))
        except OSError:
            ip = b"\x7f\x00\x00\x01"
        prefix = ip + struct.pack(">HI", os.getpid() & 0xFFFF, id(self) & 0xFFFFFFFF)
        self._prefix = prefix.hex().upper()
        self._counter = itertools.count(1)  # next() is atomic: no lock per id
        self._head = (-1, "")  # (ms, prefix + ms in hex): one tuple, swapped atomically

    def next(self) -> str:
        counter = next(self._counter) & 0xFFFF
        ms = wall_ms() & 0xFFFFFFFF
        head = self._head
        if head[0] != ms:  # ids of one millisecond share their first 28 characters
            head = self._head = (ms, f"{self._prefix}{ms:08X}")
        return f"{head[1]}{counter:04X}"


_ids = _UniqueIdGenerator()
# a forked child gets a new prefix (its pid), so parent and child never collide; checked at
# fork time rather than by a getpid() system call per id
os.register_at_fork(after_in_child=lambda: _ids.__init__())  # type: ignore[misc]


def new_message_id() -> str:
    """A fresh unique message id (travels as `UNIQ_KEY`; the outbox keys stubs by it)."""
    return _ids.next()


@dataclass(slots=True)
class Message:
    """A message to send. `message_id` is generated when not given."""

    topic: str
    body: bytes
    tags: str | None = None
    keys: list[str] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    message_group: str | None = None  # FIFO: messages of one group keep their order
    delay_level: int | None = None  # 1..18 (RocketMQ's levels)
    deliver_at_ms: int | None = None  # absolute delivery time, epoch milliseconds
    message_id: str = field(default_factory=new_message_id)


@dataclass(slots=True, frozen=True)
class SendReceipt:
    """Where a sent message landed."""

    message_id: str
    topic: str
    queue_id: int
    queue_offset: int
    status: SendStatus = SendStatus.SEND_OK
    offset_msg_id: str | None = None
    transaction_id: str | None = None
    recall_handle: str | None = None  # a delayed message: `Producer.recall` cancels it


# A frozen dataclass's __init__ sets each field through `object.__setattr__`; a batch of
# sends builds one SendReceipt per message, so `send_receipt` sets the slots through their
# descriptors instead: the same frozen object, equal to `SendReceipt(...)` (a test holds
# them equal).
_RECEIPT_SETTERS = tuple(
    SendReceipt.__dict__[f.name].__set__ for f in dataclasses.fields(SendReceipt)
)
assert [f.name for f in dataclasses.fields(SendReceipt)] == [
    "message_id",
    "topic",
    "queue_id",
    "queue_offset",
    "status",
    "offset_msg_id",
    "transaction_id",
    "recall_handle",
]


def send_receipt(
    message_id: str,
    topic: str,
    queue_id: int,
    queue_offset: int,
    status: SendStatus,
    offset_msg_id: str | None,
    transaction_id: str | None = None,
    recall_handle: str | None = None,
) -> SendReceipt:
    """`SendReceipt(...)` with every field given, without its __init__ (a third of it)."""
    r: SendReceipt = object.__new__(SendReceipt)
    s_id, s_topic, s_queue, s_offset, s_status, s_offset_id, s_tx, s_recall = _RECEIPT_SETTERS
    s_id(r, message_id)
    s_topic(r, topic)
    s_queue(r, queue_id)
    s_offset(r, queue_offset)
    s_status(r, status)
    s_offset_id(r, offset_msg_id)
    s_tx(r, transaction_id)
    s_recall(r, recall_handle)
    return r


@dataclass(slots=True)
class ReceivedMessage:
    """A message as a consumer sees it."""

    message_id: str
    topic: str
    body: bytes
    queue_id: int
    queue_offset: int
    tags: str | None = None
    keys: list[str] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    reconsume_times: int = 0  # 0 on first delivery; delivery attempt = reconsume_times + 1
    born_timestamp: int = 0
    store_timestamp: int = 0
    message_group: str | None = None
    consumer_group: str | None = None
    offset_msg_id: str | None = None
    receipt_handle: str | None = None  # invisible-time consumption only
    transaction_id: str | None = None  # half messages handed to a transaction checker
    deliver_at_ms: int | None = None  # a delayed message: when it was due (epoch ms)
    # the transport's own handle to the stored record (send-back, DLQ); opaque to users
    source: object | None = field(default=None, repr=False, compare=False)

    @property
    def delivery_attempt(self) -> int:
        return self.reconsume_times + 1
