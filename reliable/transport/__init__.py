"""Transports: how the client reaches a broker. The choice is configuration.

- `"embedded"` (default): an in-process broker over a store directory (shared by every client
  in the process that names the same directory), or an explicit `broker=` object.
- `"grpc"`: a RocketMQ 5 gRPC endpoint (`endpoint="host:port"`).
"""

from __future__ import annotations

import importlib
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

TRANSPORTS = ("embedded", "grpc")  # the names `connect` knows


# each transport's module (and class) by its name: the chosen one is imported when a
# transport is built, so a remote client never loads the in-process broker that the
# embedded transport runs (pyproject's contract on the remote client checks the rest)
_CLASSES = {
    "embedded": ("reliable.transport.embedded", "EmbeddedTransport"),
    "grpc": ("reliable.transport.grpc", "GrpcTransport"),
}


def connect(transport: str = "embedded", **options: Any) -> Transport:
    """Build a transport from configuration (not started)."""
    if transport not in _CLASSES:
        raise ConfigurationError(f"unknown transport {transport!r}; choose one of {TRANSPORTS}")
    module_name, class_name = _CLASSES[transport]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"the {transport} transport is not available in this version"
        ) from exc
    built: Transport = getattr(module, class_name)(**options)
    return built


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
