"""The protocol's status codes, and the one table of what each means to a client.

`Code` is the RocketMQ 5 gRPC protocol's `apache.rocketmq.v2.Code`, number for number (a test
checks them against the generated stubs). `failure_kind(code)` says what a client does with
a response that carries a code other than success: retry elsewhere, back off, resend, or
give up; `FailureKind` names the answers. The server answers with these codes
(`broker.server.status`, from `broker.error_codes.code_of`), the grpc transport reads them
(`reliable.transport._grpc_convert.check_status`), and the embedded transport classifies the
broker's exceptions by the same two steps, so that a failure is retried, or not, the same
way whichever transport met it. `reliable.errors` re-exports `FailureKind` (one enum).

This module imports nothing: a gRPC client may import it without loading the broker.
"""

from __future__ import annotations

import enum


class Code(enum.IntEnum):
    """What a response's `Status.code` says. Success is 20000; 4xxxx blame the request."""

    CODE_UNSPECIFIED = 0  # a response without a status
    OK = 20000
    MULTIPLE_RESULTS = 30000
    BAD_REQUEST = 40000
    ILLEGAL_ACCESS_POINT = 40001
    ILLEGAL_TOPIC = 40002
    ILLEGAL_CONSUMER_GROUP = 40003
    ILLEGAL_MESSAGE_TAG = 40004
    ILLEGAL_MESSAGE_KEY = 40005
    ILLEGAL_MESSAGE_GROUP = 40006
    ILLEGAL_MESSAGE_PROPERTY_KEY = 40007
    INVALID_TRANSACTION_ID = 40008
    ILLEGAL_MESSAGE_ID = 40009
    ILLEGAL_FILTER_EXPRESSION = 40010
    ILLEGAL_INVISIBLE_TIME = 40011
    ILLEGAL_DELIVERY_TIME = 40012
    INVALID_RECEIPT_HANDLE = 40013
    MESSAGE_PROPERTY_CONFLICT_WITH_TYPE = 40014
    UNRECOGNIZED_CLIENT_TYPE = 40015
    MESSAGE_CORRUPTED = 40016
    CLIENT_ID_REQUIRED = 40017
    ILLEGAL_POLLING_TIME = 40018
    ILLEGAL_OFFSET = 40019
    UNAUTHORIZED = 40100
    FORBIDDEN = 40300
    NOT_FOUND = 40400
    MESSAGE_NOT_FOUND = 40401
    TOPIC_NOT_FOUND = 40402
    CONSUMER_GROUP_NOT_FOUND = 40403
    OFFSET_NOT_FOUND = 40404
    REQUEST_TIMEOUT = 40800
    PAYLOAD_TOO_LARGE = 41300
    MESSAGE_BODY_TOO_LARGE = 41301
    MESSAGE_BODY_EMPTY = 41302
    TOO_MANY_REQUESTS = 42900
    MESSAGE_PROPERTIES_TOO_LARGE = 43101
    INTERNAL_ERROR = 50000
    INTERNAL_SERVER_ERROR = 50001
    HA_NOT_AVAILABLE = 50002
    NOT_IMPLEMENTED = 50100
    PROXY_TIMEOUT = 50400
    MASTER_PERSISTENCE_TIMEOUT = 50401
    SLAVE_PERSISTENCE_TIMEOUT = 50402
    UNSUPPORTED = 50500

    @property
    def success(self) -> bool:
        """Codes the official client treats as success."""
        return self in (Code.OK, Code.MULTIPLE_RESULTS, Code.MESSAGE_NOT_FOUND)


class FailureKind(enum.Enum):
    """How a failed call should be treated by the producer's retry policy."""

    TRANSPORT = "transport"  # the call did not reach the broker or got no answer: retry elsewhere
    TRY_ELSEWHERE = "try_elsewhere"  # system error/busy, no permission, topic missing, unavailable
    FLOW_CONTROL = "flow_control"  # the broker is busy: back off, then retry
    BAD_REQUEST = "bad_request"  # the request itself is wrong: never retry
    NOT_STORED_OK = "not_stored_ok"  # stored, but not flushed as asked: retried when asked
    # stored on a master that no slave confirmed it to (HA_NOT_AVAILABLE,
    # SLAVE_PERSISTENCE_TIMEOUT; a failover under way): resent with the same message id
    NOT_REPLICATED = "not_replicated"


# the codes a client lets pass (the official client's view of success)
SUCCESS_CODES = frozenset({Code.OK, Code.MULTIPLE_RESULTS, Code.MESSAGE_NOT_FOUND})

# every code not listed: 5xxxx (the server failed) tries elsewhere, 4xxxx (the request is
# wrong) is never retried
_KIND_OF_CODE: dict[int, FailureKind] = {
    Code.CODE_UNSPECIFIED: FailureKind.TRY_ELSEWHERE,  # no status at all
    Code.TOO_MANY_REQUESTS: FailureKind.FLOW_CONTROL,
    Code.MASTER_PERSISTENCE_TIMEOUT: FailureKind.NOT_STORED_OK,
    # a sync-master stored it, no slave confirmed it (docs/ha.md): resent by default
    Code.SLAVE_PERSISTENCE_TIMEOUT: FailureKind.NOT_REPLICATED,
    Code.HA_NOT_AVAILABLE: FailureKind.NOT_REPLICATED,
    # 4xxxx that another broker, or the same one a moment later, may answer otherwise
    Code.FORBIDDEN: FailureKind.TRY_ELSEWHERE,
    Code.NOT_FOUND: FailureKind.TRY_ELSEWHERE,
    Code.TOPIC_NOT_FOUND: FailureKind.TRY_ELSEWHERE,
    Code.CONSUMER_GROUP_NOT_FOUND: FailureKind.TRY_ELSEWHERE,
    Code.REQUEST_TIMEOUT: FailureKind.TRY_ELSEWHERE,
}


def failure_kind(code: int) -> FailureKind:
    """What a client does with a response of `code`, a code other than success (any
    number: a server may answer with codes this enum does not list)."""
    kind = _KIND_OF_CODE.get(code)
    if kind is not None:
        return kind
    return FailureKind.TRY_ELSEWHERE if code >= Code.INTERNAL_ERROR else FailureKind.BAD_REQUEST
