"""What the servicer's handlers use of a call's context.

A gRPC call brings a `grpc.aio.ServicerContext`; a call of the native wire
(`broker.server.wire`) brings a `WireContext` with the same few members. The handlers are
written against these Protocols, so either fits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NoReturn, Protocol

import grpc


class CallContext(Protocol):
    """A unary (or server-streaming) call's context."""

    def invocation_metadata(self) -> Iterable[tuple[str, str | bytes]] | None: ...

    def peer(self) -> str: ...

    def time_remaining(self) -> float | None: ...

    def cancelled(self) -> bool: ...

    def add_done_callback(self, callback: Callable[[CallContext], None]) -> None: ...


class StreamContext(CallContext, Protocol):
    """A bidirectional stream's context (Telemetry): gRPC only, which can end it."""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn: ...
