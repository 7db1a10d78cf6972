"""The one place where an outcome becomes a protocol `Status`.

`status_of(exc)` maps every exception a handler can meet (this server's own, the delivery
layer's and the store's by `broker.error_codes`, anything unexpected) to a code and a
message. Unexpected exceptions become `INTERNAL_ERROR` with a generic message; their
details go to the log, not the wire: the first of each exception class with its
traceback, then at most one line per class a minute (`broker.server.ratelimit`), so no
client can flood the log.
"""

from __future__ import annotations

import logging

from broker import error_codes
from broker import errors as be
from broker.server.codes import Code
from broker.server.errors import ServerError
from broker.server.ratelimit import LogLimiter
from broker.store import errors as se
from protocol.pb import definition_pb2

log = logging.getLogger(__name__)
_limited = LogLimiter(log)


def code_of(exc: BaseException) -> Code:
    """The protocol code for an exception: a server error's own, else the broker's table
    (`broker.error_codes`)."""
    if isinstance(exc, ServerError):
        return exc.status_code
    return error_codes.code_of(exc)


def make_status(code: Code, message: str = "") -> definition_pb2.Status:
    status = definition_pb2.Status()
    status.code = definition_pb2.Code.ValueType(code)
    status.message = message or code.name
    return status


def ok() -> definition_pb2.Status:
    return make_status(Code.OK, "OK")


def status_of(exc: BaseException) -> definition_pb2.Status:
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
