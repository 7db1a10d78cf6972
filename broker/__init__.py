"""The broker core: a RocketMQ-style store, delivery semantics, the gRPC server, admin.

Nothing in this package imports `reliable`, `outbox` or `idempotency`.
"""

import protocol  # noqa: F401  (gRPC's fork handlers off before grpc loads: see there)
