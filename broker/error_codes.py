"""The protocol code of each of the broker's exceptions: the delivery layer's and the store's.

One table, read by the gRPC server (`broker.server.status`, which adds its own
`ServerError`s, each carrying its code) and by the embedded transport, which classifies an
exception as the gRPC transport classifies the code the server would answer with
(`protocol.codes.failure_kind`).
"""

from __future__ import annotations

from broker import errors as be
from broker.store import errors as se
from protocol.codes import Code

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
    """The protocol code for a delivery-layer or store exception; INTERNAL_ERROR for any
    other (a server's own errors carry theirs: `broker.server.status.code_of`)."""
    if isinstance(exc, be.SendRejected):
        return _BY_RESPONSE_CODE.get(exc.code, Code.INTERNAL_ERROR)
    for cls, code in _BY_CLASS:
        if isinstance(exc, cls):
            return code
    if isinstance(exc, be.BrokerError) and not isinstance(exc, se.StoreError):
        return _BY_RESPONSE_CODE.get(exc.code, Code.INTERNAL_ERROR)
    return Code.INTERNAL_ERROR
