"""The delivery layer's exceptions and response codes.

`BrokerError` is the one root of every error the `broker` package raises on purpose: the
delivery layer's (here), the store's (`broker.store.errors.StoreError`) and the gRPC
server's (`broker.server.errors.ServerError`). Each subclass says what went wrong in one
line, carries the data needed to act on it, and names the `ResponseCode` a wire protocol
reports for it (the gRPC server maps codes to statuses in one function,
`broker.server.status.code_of`). This module imports nothing else from `broker`: it is the
bottom of the package's import graph.
"""

from __future__ import annotations

import enum


class ResponseCode(enum.IntEnum):
    """Broker response codes; values follow RocketMQ's `ResponseCode` where it has one."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    TRANSACTION_STATE_GROUP_WRONG = 203
    CONSUMER_NOT_ONLINE = 206
    NO_MESSAGE = 208
    POLLING_TIMEOUT = 210
    # codes of our own (no RocketMQ remoting equivalent)
    INVALID_PARAMETER = 1000
    INVALID_RECEIPT_HANDLE = 1001
    RECEIPT_HANDLE_EXPIRED = 1002
    MESSAGE_TYPE_MISMATCH = 1003
    TRANSACTION_NOT_FOUND = 1004
    TRANSACTION_ALREADY_RESOLVED = 1005


class BrokerError(Exception):
    """Root of every error the broker package raises (delivery layer, store, server)."""

    code: ResponseCode = ResponseCode.SYSTEM_ERROR


class InvalidArgument(BrokerError):
    """A request argument is out of range or malformed."""

    code = ResponseCode.INVALID_PARAMETER


class InvalidName(InvalidArgument):
    """A topic or group name breaks the naming rules."""

    kind = "name"

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"invalid {self.kind} {name!r}: {reason}")


class InvalidTopicName(InvalidName):
    """A topic name breaks the naming rules (`[%|a-zA-Z0-9_-]+`, at most 127 chars)."""

    code = ResponseCode.MESSAGE_ILLEGAL
    kind = "topic"


class InvalidGroupName(InvalidName):
    """A consumer or producer group name breaks the naming rules."""

    code = ResponseCode.SUBSCRIPTION_PARSE_FAILED
    kind = "group"


class SystemTopicReserved(BrokerError):
    """The topic is reserved for the broker's own use."""

    code = ResponseCode.NO_PERMISSION

    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(f"topic {topic!r} is a system topic reserved for the broker")


class TopicNotFound(BrokerError):
    """The topic does not exist and auto-creation is off."""

    code = ResponseCode.TOPIC_NOT_EXIST

    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(f"topic {topic!r} does not exist")


class GroupNotFound(BrokerError):
    """The subscription group does not exist and auto-creation is off."""

    code = ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST

    def __init__(self, group: str) -> None:
        self.group = group
        super().__init__(f"subscription group {group!r} does not exist")


class NoPermission(BrokerError):
    """The topic's permission bits forbid this read or write."""

    code = ResponseCode.NO_PERMISSION

    def __init__(self, topic: str, action: str, perm: int) -> None:
        self.topic = topic
        self.action = action
        self.perm = perm
        super().__init__(f"topic {topic!r} (perm {perm}) is not {action}")


class ReplicaNotServing(BrokerError):
    """A slave serves receives and acks only while its group's master is down (it acts for
    it, docs/ha.md "Reading from a slave"); otherwise, or for what it cannot do there, the
    call is refused."""

    code = ResponseCode.NO_PERMISSION


class ConsumeDisabled(BrokerError):
    """The subscription group is disabled for consumption."""

    code = ResponseCode.NO_PERMISSION

    def __init__(self, group: str) -> None:
        self.group = group
        super().__init__(f"consumption is disabled for group {group!r}")


class MessageIllegal(BrokerError):
    """A message cannot be accepted as given (empty body, bad property, bad delay, ...)."""

    code = ResponseCode.MESSAGE_ILLEGAL


class BodyOverLimit(MessageIllegal):
    """The message body exceeds the broker's `max_message_size` (`size`, `limit` in bytes)."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"message body of {size} bytes exceeds the limit of {limit} bytes")


class MessageTypeMismatch(MessageIllegal):
    """The message's type (normal, FIFO, delay, transaction) is not what the topic accepts."""

    code = ResponseCode.MESSAGE_TYPE_MISMATCH

    def __init__(self, topic: str, topic_type: str, message_type: str) -> None:
        self.topic = topic
        self.topic_type = topic_type
        self.message_type = message_type
        super().__init__(f"topic {topic!r} accepts {topic_type} messages, not {message_type}")


class SendRejected(BrokerError):
    """The store did not accept the message (not running, disk full, ...)."""

    def __init__(self, topic: str, status: str, code: ResponseCode) -> None:
        self.topic = topic
        self.status = status
        self.code = code
        super().__init__(f"message to {topic!r} not stored: {status}")


class BrokerNotRunning(BrokerError):
    """The broker is not started or is shutting down."""

    code = ResponseCode.SERVICE_NOT_AVAILABLE


class ReceiptHandleError(BrokerError):
    """Root of receipt handle failures."""

    code = ResponseCode.INVALID_RECEIPT_HANDLE

    def __init__(self, handle: str, reason: str) -> None:
        self.handle = handle
        self.reason = reason
        super().__init__(f"receipt handle {handle[:80]!r}: {reason}")


class InvalidReceiptHandle(ReceiptHandleError):
    """The handle is malformed, belongs to another group/topic, or was superseded."""


class ReceiptHandleExpired(ReceiptHandleError):
    """The handle's invisible time has ended; the message will be (or was) delivered again."""

    code = ResponseCode.RECEIPT_HANDLE_EXPIRED


class TransactionError(BrokerError):
    """Root of end-transaction failures."""

    code = ResponseCode.TRANSACTION_FAILED


class TransactionNotFound(TransactionError):
    """No half message at that offset matches the transaction id and producer group."""

    code = ResponseCode.TRANSACTION_NOT_FOUND

    def __init__(self, transaction_id: str, commitlog_offset: int, reason: str) -> None:
        self.transaction_id = transaction_id
        self.commitlog_offset = commitlog_offset
        super().__init__(f"transaction {transaction_id!r} at offset {commitlog_offset}: {reason}")


class TransactionAlreadyResolved(TransactionError):
    """The transaction was already resolved the other way (commit after rollback or back)."""

    code = ResponseCode.TRANSACTION_ALREADY_RESOLVED

    def __init__(self, transaction_id: str, resolution: str) -> None:
        self.transaction_id = transaction_id
        self.resolution = resolution
        super().__init__(f"transaction {transaction_id!r} was already {resolution}")


class ConfigError(BrokerError):
    """A broker configuration value is invalid (caught at start-up)."""

    code = ResponseCode.INVALID_PARAMETER
