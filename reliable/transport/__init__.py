"""Transports: how the client reaches a broker. The choice is configuration.

- `"embedded"` (default): an in-process broker over a store directory (shared by every client
  in the process that names the same directory), or an explicit `broker=` object.
- `"grpc"`: a RocketMQ 5 gRPC endpoint (`endpoint="host:port"`).
"""

from __future__ import annotations

from typing import Any

from reliable.errors import ConfigurationError
from reliable.transport.base import (
    Capability,
    ConsumeFrom,
    PullTransport,
    QueueRef,
    TopicRoute,
    TransactionState,
    Transport,
)

TRANSPORTS = ("embedded", "grpc")


def connect(transport: str = "embedded", **options: Any) -> Transport:
    """Build a transport from configuration (not started)."""
    if transport == "embedded":
        from reliable.transport.embedded import EmbeddedTransport

        return EmbeddedTransport(**options)
    if transport == "grpc":
        try:
            from reliable.transport.grpc import GrpcTransport
        except ImportError as exc:
            raise ConfigurationError("the grpc transport is not available in this version") from exc
        return GrpcTransport(**options)
    raise ConfigurationError(f"unknown transport {transport!r}; choose one of {TRANSPORTS}")


__all__ = [
    "TRANSPORTS",
    "Capability",
    "ConsumeFrom",
    "PullTransport",
    "QueueRef",
    "TopicRoute",
    "TransactionState",
    "Transport",
    "connect",
]
