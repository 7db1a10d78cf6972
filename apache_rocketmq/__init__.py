"""Apache RocketMQ 5 on this machine, from Maven Central's jars (see docs/rocketmq.md).

For the interop tests and for trying the framework against the real thing by hand
(`scripts/rocketmq-cluster.sh start`). Run from a checkout, like `bench`; not installed.
"""

import protocol  # noqa: F401  (gRPC's fork handlers off before grpc loads: see there)
from apache_rocketmq.admin import AdminError, MessageType
from apache_rocketmq.cluster import (
    ClusterError,
    NotStarted,
    Ports,
    RocketMQCluster,
    running_cluster,
)
from apache_rocketmq.runtime import RuntimeUnavailable, ensure_lib, pinned_version

__all__ = [
    "AdminError",
    "ClusterError",
    "MessageType",
    "NotStarted",
    "Ports",
    "RocketMQCluster",
    "RuntimeUnavailable",
    "ensure_lib",
    "pinned_version",
    "running_cluster",
]
