"""The server's exceptions: `ServerError`, under the package root `BrokerError`, carrying the
protocol code it answers with.

Handlers raise these at the edge (validation, lookups); `broker.server.status.status_of` is
the one place that turns any exception into a response `Status`. A missing topic is the
delivery layer's `broker.errors.TopicNotFound`, raised by the server too.
"""

from __future__ import annotations

from broker.errors import BrokerError
from broker.server.codes import Code


class ServerError(BrokerError):
    """Root of every error the gRPC server raises; `status_code` is what the client receives."""

    # the protocol's Code; `code`, inherited from BrokerError, is the delivery layer's
    # ResponseCode and is not what a server error answers with
    status_code: Code = Code.INTERNAL_ERROR

    def __init__(self, message: str, code: Code | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.status_code = code


class BadRequest(ServerError):
    """The request is malformed or breaks a documented limit."""

    status_code = Code.BAD_REQUEST


class IllegalTopic(BadRequest):
    """A topic name breaks the naming rules or names a system topic."""

    status_code = Code.ILLEGAL_TOPIC


class IllegalConsumerGroup(BadRequest):
    """A consumer group name breaks the naming rules or names a system group."""

    status_code = Code.ILLEGAL_CONSUMER_GROUP


class IllegalMessage(BadRequest):
    """One field of a message is invalid; `status_code` says which (tag, key, group, id, ...)."""


class MessageBodyEmpty(IllegalMessage):
    """The message has no body."""

    status_code = Code.MESSAGE_BODY_EMPTY


class MessageBodyTooLarge(IllegalMessage):
    """The body exceeds the server's maximum."""

    status_code = Code.MESSAGE_BODY_TOO_LARGE


class PayloadTooLarge(BadRequest):
    """A request carries more than the server accepts at once (e.g. a huge batch)."""

    status_code = Code.PAYLOAD_TOO_LARGE


class IllegalInvisibleTime(BadRequest):
    """An invisible duration outside the accepted range."""

    status_code = Code.ILLEGAL_INVISIBLE_TIME


class IllegalPollingTime(BadRequest):
    """The call's deadline leaves no room for the minimum long-polling time."""

    status_code = Code.ILLEGAL_POLLING_TIME


class IllegalFilterExpression(BadRequest):
    """A filter expression this server cannot evaluate (SQL92) or that is malformed."""

    status_code = Code.ILLEGAL_FILTER_EXPRESSION


class MissingReceiptHandle(BadRequest):
    """An ack or change-invisible entry carries an empty receipt handle."""

    status_code = Code.INVALID_RECEIPT_HANDLE


class InvalidTransactionId(BadRequest):
    """A transaction id that does not name a half message of this server."""

    status_code = Code.INVALID_TRANSACTION_ID


class ClientIdRequired(BadRequest):
    """The call lacks the `x-mq-client-id` header."""

    status_code = Code.CLIENT_ID_REQUIRED


class UnrecognizedClientType(BadRequest):
    """The client type is missing or does not fit the call."""

    status_code = Code.UNRECOGNIZED_CLIENT_TYPE


class Unauthorized(ServerError):
    """Authentication is on and the call's signature is missing or wrong."""

    status_code = Code.UNAUTHORIZED


class Forbidden(ServerError):
    """The resource exists but does not permit this operation."""

    status_code = Code.FORBIDDEN


class ReadOnlySlave(Forbidden):
    """This broker is a slave: its commitlog is its master's copy and takes no writes."""

    def __init__(self) -> None:
        super().__init__(
            "this broker is a slave (read-only replica of its master): "
            "send to the master of its broker group (a slave serves receives only while "
            "its master is down)"
        )


class ConsumerGroupNotFound(ServerError):
    """The consumer group does not exist and auto-creation is off."""

    status_code = Code.CONSUMER_GROUP_NOT_FOUND


class OffsetNotFound(ServerError):
    """The consumer group has no committed offset on the queue (GetOffset)."""

    status_code = Code.OFFSET_NOT_FOUND


class IllegalOffset(BadRequest):
    """A queue or offset query names a queue the topic does not have."""

    status_code = Code.ILLEGAL_OFFSET


class TooManyRequests(ServerError):
    """The server is overloaded (e.g. too many parked long polls): back off."""

    status_code = Code.TOO_MANY_REQUESTS


class Abandoned(Exception):
    """The call's client gave up on it (its deadline passed) before it was served: it is
    not answered (`broker.server.overload`). Control flow, never logged as an error."""


class NotImplementedByServer(ServerError):
    """A protocol feature this server does not offer."""

    status_code = Code.NOT_IMPLEMENTED


class ServerStartError(ServerError):
    """The server did not start: port not bound, TLS files unreadable, already started."""
