"""Request bodies that do not parse: a value the handler refuses, never a parser exception.

gRPC's own handling of a deserializer that raises logs a ~760-byte traceback per call,
before any authentication, and answers `UNKNOWN`. `parser(message_type, method)` returns a
deserializer that never raises: what does not parse arrives at the handler as an
`Undecodable`, which the handler refuses (after checking the caller's signature, as for any
request) with `BAD_REQUEST`, logging at most one line per RPC a minute.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from google.protobuf.message import Message

from broker.server.calls import CallContext
from broker.server.errors import BadRequest
from broker.server.ratelimit import LogLimiter

log = logging.getLogger(__name__)
_limited = LogLimiter(log)


Parsed = TypeVar("Parsed", bound=Message)


class Undecodable:
    """A request body that does not parse as the message its RPC takes."""

    __slots__ = ("method", "reason", "size")

    def __init__(self, method: str, reason: str, size: int) -> None:
        self.method, self.reason, self.size = method, reason, size

    def refuse(self, context: CallContext | None) -> BadRequest:
        """The error to answer with; logs one line per RPC a minute at most."""
        peer = context.peer() if context is not None else "?"
        _limited.log(
            logging.WARNING,
            self.method,
            "undecodable %s request of %d bytes from %s: %s",
            self.method,
            self.size,
            peer,
            self.reason[:200],
        )
        return BadRequest(f"request body is not a valid {self.method} request")


def parser(message_type: type[Parsed], method: str) -> Callable[[bytes], Parsed | Undecodable]:
    def parse(raw: bytes) -> Parsed | Undecodable:
        try:
            return message_type.FromString(raw)
        except Exception as exc:  # DecodeError, or a nesting too deep to parse
            return Undecodable(method, str(exc) or type(exc).__name__, len(raw))

    return parse
