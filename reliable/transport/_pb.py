"""The RocketMQ 5 protocol modules for the gRPC transport.

The loader lives in `broker.protocol_pb` (it keeps the official client package's
`__init__` from running); this is the one place where `reliable.transport` imports from
`broker`, and that module imports nothing else from `broker`.
"""

from __future__ import annotations

from broker.protocol_pb import definition_pb2, service_pb2, service_pb2_grpc

__all__ = ["definition_pb2", "service_pb2", "service_pb2_grpc"]
