"""Values the Broker hands back: routes, send results, pull results; status mappings."""

from __future__ import annotations

from dataclasses import dataclass

from broker.errors import ResponseCode
from broker.store.message import GetMessageStatus, MessageExt, PutMessageStatus
from broker.topic import TopicMessageType
from protocol.results import PullStatus

# A full disk is "service not available" on this broker (RocketMQ answers the same): the
# producer tries another queue/broker at once instead of backing off as for SYSTEM_BUSY,
# which stays for a busy page cache (flow control).
PUT_STATUS_CODES = {
    PutMessageStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutMessageStatus.DISK_FULL: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutMessageStatus.OS_PAGE_CACHE_BUSY: ResponseCode.SYSTEM_BUSY,
    PutMessageStatus.CREATE_MAPPED_FILE_FAILED: ResponseCode.SYSTEM_ERROR,
    PutMessageStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.UNKNOWN_ERROR: ResponseCode.SYSTEM_ERROR,
}


@dataclass(frozen=True, slots=True)
class TopicRoute:
    """Where a topic can be written and read on this broker."""

    topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    message_type: TopicMessageType

    @property
    def read_queue_ids(self) -> list[int]:
        return list(range(self.read_queue_nums))

    @property
    def write_queue_ids(self) -> list[int]:
        return list(range(self.write_queue_nums))


@dataclass(frozen=True, slots=True)
class SendResult:
    """A stored message. `queue_offset` is -1 while it waits (delay, half message)."""

    status: PutMessageStatus  # PUT_OK, or a stored-but status such as FLUSH_DISK_TIMEOUT
    msg_id: str  # UNIQ_KEY when the producer set one, else the offset message id
    offset_msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    transaction_id: str | None = None
    recall_handle: str | None = None  # delayed messages: cancels it before it is due


@dataclass(slots=True)
class PullResult:
    status: PullStatus
    messages: list[MessageExt]
    next_begin_offset: int
    min_offset: int
    max_offset: int


PULL_STATUS = {
    GetMessageStatus.FOUND: PullStatus.FOUND,
    GetMessageStatus.NO_MATCHED_MESSAGE: PullStatus.NO_MATCHED_MSG,
    GetMessageStatus.MESSAGE_WAS_REMOVING: PullStatus.NO_MATCHED_MSG,
    GetMessageStatus.OFFSET_FOUND_NULL: PullStatus.NO_NEW_MSG,
    GetMessageStatus.OFFSET_OVERFLOW_ONE: PullStatus.NO_NEW_MSG,
    GetMessageStatus.NO_MATCHED_LOGIC_QUEUE: PullStatus.NO_NEW_MSG,
    GetMessageStatus.NO_MESSAGE_IN_QUEUE: PullStatus.NO_NEW_MSG,
    GetMessageStatus.OFFSET_OVERFLOW_BADLY: PullStatus.OFFSET_ILLEGAL,
    GetMessageStatus.OFFSET_TOO_SMALL: PullStatus.OFFSET_ILLEGAL,
}


@dataclass(frozen=True, slots=True)
class QueueProgress:
    """One queue of a group's consumption (mqadmin consumerProgress)."""

    topic: str
    queue_id: int
    broker_offset: int  # the queue's max offset
    consumer_offset: int  # committed; -1 when the group has none
    in_flight: int  # leased by invisible-time consumption

    @property
    def lag(self) -> int:
        return max(0, self.broker_offset - max(self.consumer_offset, 0))
