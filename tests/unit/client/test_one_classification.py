"""One classification of a failure, whichever transport meets it.

The gRPC server answers a broker exception with a protocol code (`broker.server.status`);
the grpc transport turns the code into the client's error (`_grpc_convert.check_status`); the
embedded transport turns the same exception into the client's error directly
(`embedded.translate`). Both go through `protocol.codes.failure_kind`: the same failure is
retried, backed off from, resent or given up on alike, with the same code name.
"""

from __future__ import annotations

import pytest

from broker import errors as be
from broker.server.status import status_of
from broker.store import errors as se
from protocol.codes import Code, FailureKind, failure_kind
from protocol.pb import definition_pb2
from reliable.errors import (
    BadRequest,
    BrokerBusy,
    BrokerCallError,
    BrokerUnavailable,
    ReceiptHandleError,
)
from reliable.transport._grpc_convert import check_status
from reliable.transport.embedded import translate

R = be.ResponseCode
FAILURES: list[BaseException] = [
    be.InvalidTopicName("b@d", "bad characters"),
    be.InvalidGroupName("b@d", "bad characters"),
    be.SystemTopicReserved("SCHEDULE_TOPIC_XXXX"),
    be.TopicNotFound("Orders"),
    be.GroupNotFound("billing"),
    be.NoPermission("Orders", "written", 4),
    be.ConsumeDisabled("billing"),
    be.BodyOverLimit(10, 5),
    be.MessageTypeMismatch("Orders", "FIFO", "NORMAL"),
    be.MessageIllegal("no body"),
    be.InvalidReceiptHandle("h", "unknown"),
    be.TransactionNotFound("tx", 7, "gone"),
    be.TransactionAlreadyResolved("tx", "committed"),
    be.InvalidArgument("bad"),
    be.SendRejected("Orders", "OS_PAGE_CACHE_BUSY", R.SYSTEM_BUSY),
    be.SendRejected("Orders", "CREATE_MAPPED_FILE_FAILED", R.SYSTEM_ERROR),
    be.SendRejected("Orders", "MESSAGE_ILLEGAL", R.MESSAGE_ILLEGAL),
    be.SendRejected("Orders", "FLUSH_DISK_TIMEOUT", R.FLUSH_DISK_TIMEOUT),
    be.SendRejected("Orders", "FLUSH_SLAVE_TIMEOUT", R.FLUSH_SLAVE_TIMEOUT),
    be.SendRejected("Orders", "SLAVE_NOT_AVAILABLE", R.SLAVE_NOT_AVAILABLE),
    be.SendRejected("Orders", "DISK_FULL", R.SERVICE_NOT_AVAILABLE),
    se.MessageTooLarge(10, 5),
    se.InvalidMessage("no topic"),
    se.StoreNotRunning("/store"),
    se.StoreCorrupted("/store/commitlog/0", 12, "bad CRC"),
    ZeroDivisionError("unexpected"),
]


def _over_grpc(exc: BaseException) -> BaseException:
    status = definition_pb2.Status()
    status.CopyFrom(status_of(exc))
    with pytest.raises(Exception) as raised:
        check_status(status, "SendMessage")
    return raised.value


@pytest.mark.parametrize("exc", FAILURES, ids=lambda e: type(e).__name__)
def test_both_transports_classify_a_failure_alike(exc: BaseException) -> None:
    remote, embedded = _over_grpc(exc), translate(exc)
    if isinstance(remote, ReceiptHandleError):
        assert isinstance(embedded, ReceiptHandleError)
        return
    assert isinstance(remote, BrokerCallError) and isinstance(embedded, BrokerCallError)
    assert embedded.kind is remote.kind
    if isinstance(embedded, BrokerUnavailable):
        # the embedded transport also keeps the store's refusal (a full disk), which the
        # protocol has no code for
        assert remote.code == Code.INTERNAL_SERVER_ERROR.name
    else:
        assert type(embedded) is type(remote)
        assert embedded.code == remote.code


def test_the_table() -> None:
    assert failure_kind(Code.TOO_MANY_REQUESTS) is FailureKind.FLOW_CONTROL
    assert failure_kind(Code.MASTER_PERSISTENCE_TIMEOUT) is FailureKind.NOT_STORED_OK
    assert failure_kind(Code.SLAVE_PERSISTENCE_TIMEOUT) is FailureKind.NOT_REPLICATED
    assert failure_kind(Code.HA_NOT_AVAILABLE) is FailureKind.NOT_REPLICATED
    assert failure_kind(Code.TOPIC_NOT_FOUND) is FailureKind.TRY_ELSEWHERE
    assert failure_kind(Code.FORBIDDEN) is FailureKind.TRY_ELSEWHERE
    assert failure_kind(Code.INTERNAL_SERVER_ERROR) is FailureKind.TRY_ELSEWHERE
    assert failure_kind(Code.CODE_UNSPECIFIED) is FailureKind.TRY_ELSEWHERE
    assert failure_kind(Code.ILLEGAL_TOPIC) is FailureKind.BAD_REQUEST
    assert failure_kind(Code.MESSAGE_BODY_TOO_LARGE) is FailureKind.BAD_REQUEST
    # codes this server never answers with, from another server: by their class
    assert failure_kind(50502) is FailureKind.TRY_ELSEWHERE  # VERIFY_FIFO_MESSAGE_UNSUPPORTED
    assert failure_kind(42800) is FailureKind.BAD_REQUEST  # PRECONDITION_FAILED


def test_the_client_error_of_each_kind() -> None:
    busy = _over_grpc(be.SendRejected("t", "OS_PAGE_CACHE_BUSY", R.SYSTEM_BUSY))
    assert isinstance(busy, BrokerBusy) and busy.code == "TOO_MANY_REQUESTS"
    bad = translate(be.BodyOverLimit(10, 5))
    assert isinstance(bad, BadRequest) and bad.code == "MESSAGE_BODY_TOO_LARGE"
    assert not bad.retriable
