"""The RocketMQ 5 protocol modules for the gRPC transport.

The loader lives in `protocol.pb` (it keeps the official client package's
`__init__` from running); the grpc transport imports the generated modules from here, and
`protocol.pb` imports nothing else from `broker`. `protocol_ext` is the server's
batch receive (`reliable.v1.BatchMessaging`), which the transport prefers where offered.
"""

from __future__ import annotations

from protocol import ext as protocol_ext
from protocol.pb import definition_pb2, service_pb2, service_pb2_grpc

__all__ = ["definition_pb2", "protocol_ext", "service_pb2", "service_pb2_grpc"]
