"""The one place where an outcome becomes a protocol `Status`.

`status_of(exc)` maps every exception a handler can meet (this server's own, the delivery
layer's, the store's, anything unexpected) to a code and a message. Unexpected exceptions
become `INTERNAL_ERROR` with a generic message; their details go to the log, not the wire:
the first of each exception class with its traceback, then at most one line per class a
minute (`broker.server.ratelimit`), so no client can flood the log.
"""

from __future__ import annotations

import logging
from typing import Any

from broker import errors as be
from broker.protocol_pb import definition_pb2
from broker.server.codes import Code
from broker.server.errors import ServerError
from broker.server.ratelimit import LogLimiter
from broker.store import errors as se

log = logging.getLogger(__name__)
_limited = LogLimiter(log)

# most specific classes first: the first isinstance match wins
_BY_CLASS: tuple[tuple[type[BaseException], Code], ...] = (
    (be.InvalidTopicName, Code.ILLEGAL_TOPIC),
    (be.SystemTopicReserved, Code.ILLEGAL_TOPIC),
    (be.InvalidGroupName, Code.ILLEGAL_CONSUMER_GROUP),
    (be.TopicNotFound, Code.TOPIC_NOT_FOUND),
    (be.GroupNotFound, Code.CONSUMER_GROUP_NOT_FOUND),
    (be.NoPermission, Code.FORBIDDEN),
    (be.ConsumeDisabled, Code.FORBIDDEN),
    (be.BodyOverLimit, Code.MESSAGE_BODY_TOO_LARGE),
    (be.MessageTypeMismatch, Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (be.MessageIllegal, Code.BAD_REQUEST),
    (be.ReceiptHandleError, Code.INVALID_RECEIPT_HANDLE),
    (be.TransactionNotFound, Code.INVALID_TRANSACTION_ID),
    (be.TransactionAlreadyResolved, Code.INVALID_TRANSACTION_ID),
    (be.BrokerNotRunning, Code.INTERNAL_SERVER_ERROR),
    (be.InvalidArgument, Code.BAD_REQUEST),
    (se.MessageTooLarge, Code.MESSAGE_BODY_TOO_LARGE),
    (se.InvalidMessage, Code.BAD_REQUEST),
    (se.StoreNotRunning, Code.INTERNAL_SERVER_ERROR),
)

# a store refusal, by the delivery layer's response code
_BY_RESPONSE_CODE: dict[be.ResponseCode, Code] = {
    be.ResponseCode.SYSTEM_BUSY: Code.TOO_MANY_REQUESTS,
    be.ResponseCode.FLUSH_DISK_TIMEOUT: Code.MASTER_PERSISTENCE_TIMEOUT,
    be.ResponseCode.FLUSH_SLAVE_TIMEOUT: Code.SLAVE_PERSISTENCE_TIMEOUT,
    be.ResponseCode.SLAVE_NOT_AVAILABLE: Code.HA_NOT_AVAILABLE,
    be.ResponseCode.SERVICE_NOT_AVAILABLE: Code.INTERNAL_SERVER_ERROR,
    be.ResponseCode.MESSAGE_ILLEGAL: Code.BAD_REQUEST,
    be.ResponseCode.NO_PERMISSION: Code.FORBIDDEN,
    be.ResponseCode.TOPIC_NOT_EXIST: Code.TOPIC_NOT_FOUND,
    be.ResponseCode.INVALID_PARAMETER: Code.BAD_REQUEST,
    be.ResponseCode.MESSAGE_TYPE_MISMATCH: Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
    be.ResponseCode.QUERY_NOT_FOUND: Code.MESSAGE_NOT_FOUND,
    be.ResponseCode.REQUEST_CODE_NOT_SUPPORTED: Code.NOT_IMPLEMENTED,
}


def code_of(exc: BaseException) -> Code:
    """The protocol code for an exception."""
    if isinstance(exc, ServerError):
        return exc.status_code
    if isinstance(exc, be.SendRejected):
        return _BY_RESPONSE_CODE.get(exc.code, Code.INTERNAL_ERROR)
    for cls, code in _BY_CLASS:
        if isinstance(exc, cls):
            return code
    if isinstance(exc, be.BrokerError) and not isinstance(exc, se.StoreError):
        return _BY_RESPONSE_CODE.get(exc.code, Code.INTERNAL_ERROR)
    return Code.INTERNAL_ERROR


def make_status(code: Code, message: str = "") -> Any:
    status = definition_pb2.Status()
    status.code = int(code)
    status.message = message or code.name
    return status


def ok() -> Any:
    return make_status(Code.OK, "OK")


def status_of(exc: BaseException) -> Any:
    """The `Status` a response carries for `exc` (logged when it is not the client's fault)."""
    code = code_of(exc)
    # a store failure not mapped above is as unexpected as any other exception: its details
    # go to the log, not to the wire
    if code is Code.INTERNAL_ERROR and (
        not isinstance(exc, be.BrokerError) or isinstance(exc, se.StoreError)
    ):
        _limited.log(
            logging.ERROR,
            f"unexpected {type(exc).__qualname__}",
            "unexpected error while serving a request",
            exc_info=exc,
        )
        return make_status(code, f"internal error ({type(exc).__name__})")
    if code >= Code.INTERNAL_ERROR:  # 5xxxx: the server failed, not the request
        _limited.log(logging.WARNING, f"failed {type(exc).__qualname__}", "request failed: %s", exc)
    return make_status(code, str(exc)[:1024])
