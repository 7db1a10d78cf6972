"""reliable: messaging that loses no message and processes none twice."""

from reliable.consumer.listener import ConsumeContext, MessageListener, MessageModel
from reliable.consumer.push import PushConsumer
from reliable.consumer.rebalance import (
    ConsistentHashAllocator,
    allocate_averagely,
    allocate_by_circle,
    allocate_consistent_hash,
)
from reliable.consumer.settings import ConsumerSettings
from reliable.consumer.simple import SimpleConsumer
from reliable.decorators import Handler, dlq_handler, handler
from reliable.errors import (
    BadRequest,
    BrokerBusy,
    BrokerCallError,
    BrokerUnavailable,
    ClientStateError,
    ConfigurationError,
    GroupResendRefused,
    GroupResendUnsupported,
    InvalidMessage,
    InvalidName,
    NoRoute,
    ReceiptHandleError,
    ReliableError,
    SendFailed,
    TransactionError,
    TransportError,
)
from reliable.idempotent import MessageGuard
from reliable.message import (
    ConsumeResult,
    Message,
    ReceivedMessage,
    SendReceipt,
    SendStatus,
    new_message_id,
)
from reliable.outcomes import Discard, Outcome, RetryLater
from reliable.producer import Producer, TransactionSendResult
from reliable.ratelimit import TokenBucket
from reliable.retry import Backoff
from reliable.transport import connect
from reliable.transport.base import (
    ConsumeFrom,
    QueueRef,
    TopicRoute,
    TransactionState,
    Transport,
)
from reliable.worker import Worker

__all__ = [  # noqa: RUF022 - grouped by concern, as the conventions ask
    # messages
    "ConsumeResult",
    "Message",
    "ReceivedMessage",
    "SendReceipt",
    "SendStatus",
    "new_message_id",
    # handlers and outcomes
    "Discard",
    "Handler",
    "MessageGuard",
    "Outcome",
    "RetryLater",
    "Worker",
    "dlq_handler",
    "handler",
    # producer
    "Backoff",
    "Producer",
    "TransactionSendResult",
    "TransactionState",
    # consumers
    "ConsistentHashAllocator",
    "ConsumeContext",
    "ConsumeFrom",
    "ConsumerSettings",
    "MessageListener",
    "MessageModel",
    "PushConsumer",
    "SimpleConsumer",
    "TokenBucket",
    "allocate_averagely",
    "allocate_by_circle",
    "allocate_consistent_hash",
    # transports
    "QueueRef",
    "TopicRoute",
    "Transport",
    "connect",
    # errors
    "BadRequest",
    "BrokerBusy",
    "BrokerCallError",
    "BrokerUnavailable",
    "ClientStateError",
    "ConfigurationError",
    "GroupResendRefused",
    "GroupResendUnsupported",
    "InvalidMessage",
    "InvalidName",
    "NoRoute",
    "ReceiptHandleError",
    "ReliableError",
    "SendFailed",
    "TransactionError",
    "TransportError",
]
__version__ = "0.1.0"
