"""The server's status-code enum is the protocol's, number for number."""

from __future__ import annotations

from broker import errors as be
from broker.server.codes import Code
from broker.server.errors import IllegalTopic, ServerError
from broker.server.status import code_of, status_of
from protocol.pb import definition_pb2


def test_codes_match_the_generated_protocol() -> None:
    for code in Code:
        assert definition_pb2.Code.Value(code.name) == code.value, code.name


def test_one_mapping_for_every_exception() -> None:
    assert code_of(IllegalTopic("x")) is Code.ILLEGAL_TOPIC
    assert code_of(be.InvalidReceiptHandle("h", "bad")) is Code.INVALID_RECEIPT_HANDLE
    assert code_of(be.ReceiptHandleExpired("h", "late")) is Code.INVALID_RECEIPT_HANDLE
    assert code_of(be.TopicNotFound("t")) is Code.TOPIC_NOT_FOUND
    assert code_of(be.BodyOverLimit(10, 5)) is Code.MESSAGE_BODY_TOO_LARGE
    assert (
        code_of(be.SendRejected("t", "OS_PAGE_CACHE_BUSY", be.ResponseCode.SYSTEM_BUSY))
        is Code.TOO_MANY_REQUESTS
    )
    assert code_of(ServerError("x", Code.FORBIDDEN)) is Code.FORBIDDEN
    unexpected = status_of(ZeroDivisionError("secret detail"))
    assert unexpected.code == Code.INTERNAL_ERROR
    assert "secret detail" not in unexpected.message  # details go to the log, not the wire
