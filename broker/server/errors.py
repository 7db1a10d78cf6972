"""The server's exceptions: one root carrying the protocol code it answers with.

Handlers raise these at the edge (validation, lookups); `broker.server.status.status_of` is
the one place that turns any exception into a response `Status`.
"""

from __future__ import annotations

from broker.server.codes import Code


class ServerError(Exception):
    """Root of every error the gRPC server raises; `code` is what the client receives."""

    code: Code = Code.INTERNAL_ERROR

    def __init__(self, message: str, code: Code | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class BadRequest(ServerError):
    """The request is malformed or breaks a documented limit."""

    code = Code.BAD_REQUEST


class IllegalTopic(BadRequest):
    """A topic name breaks the naming rules or names a system topic."""

    code = Code.ILLEGAL_TOPIC


class IllegalConsumerGroup(BadRequest):
    """A consumer group name breaks the naming rules or names a system group."""

    code = Code.ILLEGAL_CONSUMER_GROUP


class IllegalMessage(BadRequest):
    """One field of a message is invalid; `code` says which (tag, key, group, id, ...)."""


class MessageBodyEmpty(IllegalMessage):
    """The message has no body."""

    code = Code.MESSAGE_BODY_EMPTY


class MessageBodyTooLarge(IllegalMessage):
    """The body exceeds the server's maximum."""

    code = Code.MESSAGE_BODY_TOO_LARGE


class PayloadTooLarge(BadRequest):
    """A request carries more than the server accepts at once (e.g. a huge batch)."""

    code = Code.PAYLOAD_TOO_LARGE


class IllegalInvisibleTime(BadRequest):
    """An invisible duration outside the accepted range."""

    code = Code.ILLEGAL_INVISIBLE_TIME


class IllegalPollingTime(BadRequest):
    """The call's deadline leaves no room for the minimum long-polling time."""

    code = Code.ILLEGAL_POLLING_TIME


class IllegalFilterExpression(BadRequest):
    """A filter expression this server cannot evaluate (SQL92) or that is malformed."""

    code = Code.ILLEGAL_FILTER_EXPRESSION


class InvalidReceiptHandle(BadRequest):
    """A receipt handle that is empty, unknown, expired or superseded."""

    code = Code.INVALID_RECEIPT_HANDLE


class InvalidTransactionId(BadRequest):
    """A transaction id that does not name a half message of this server."""

    code = Code.INVALID_TRANSACTION_ID


class ClientIdRequired(BadRequest):
    """The call lacks the `x-mq-client-id` header."""

    code = Code.CLIENT_ID_REQUIRED


class UnrecognizedClientType(BadRequest):
    """The client type is missing or does not fit the call."""

    code = Code.UNRECOGNIZED_CLIENT_TYPE


class Unauthorized(ServerError):
    """Authentication is on and the call's signature is missing or wrong."""

    code = Code.UNAUTHORIZED


class Forbidden(ServerError):
    """The resource exists but does not permit this operation."""

    code = Code.FORBIDDEN


class TopicNotFound(ServerError):
    """The topic does not exist and auto-creation is off."""

    code = Code.TOPIC_NOT_FOUND


class ConsumerGroupNotFound(ServerError):
    """The consumer group does not exist and auto-creation is off."""

    code = Code.CONSUMER_GROUP_NOT_FOUND


class OffsetNotFound(ServerError):
    """The consumer group has no committed offset on the queue (GetOffset)."""

    code = Code.OFFSET_NOT_FOUND


class IllegalOffset(BadRequest):
    """A queue or offset query names a queue the topic does not have."""

    code = Code.ILLEGAL_OFFSET


class TooManyRequests(ServerError):
    """The server is overloaded (e.g. too many parked long polls): back off."""

    code = Code.TOO_MANY_REQUESTS


class NotImplementedByServer(ServerError):
    """A protocol feature this server does not offer."""

    code = Code.NOT_IMPLEMENTED
