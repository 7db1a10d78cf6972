"""The broker as an Apache RocketMQ 5 gRPC server (`apache.rocketmq.v2.MessagingService`).

Official RocketMQ 5 clients work against it unchanged. `MessagingServer` binds and serves;
`ServerConfig` holds address, TLS, access keys and the protocol's limits.
"""

from broker.server.config import ServerConfig
from broker.server.errors import ServerStartError
from broker.server.server import MessagingServer

__all__ = ["MessagingServer", "ServerConfig", "ServerStartError"]
