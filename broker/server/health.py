"""The standard gRPC health service (`grpc.health.v1.Health`) on the broker's port.

SERVING while the broker runs and its store accepts writes; NOT_SERVING when the disk is
above the refuse watermark, a commitlog flush has failed, or the server is stopping. The
overall status ("") and `apache.rocketmq.v2.MessagingService` are reported alike. The server
re-evaluates every upkeep pass (1 s) and at shutdown; like other probes the service needs
no credentials.
"""

from __future__ import annotations

from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from broker.broker import Broker

MESSAGING_SERVICE = "apache.rocketmq.v2.MessagingService"
SERVICES = ("", MESSAGING_SERVICE)


def store_writable(broker: Broker) -> bool:
    """The broker runs, its disk is below the refuse mark and no flush has failed."""
    store = broker.store
    return (
        broker.running and not store.is_disk_full() and store.commitlog.flush_service.failed is None
    )


class BrokerHealth:
    """Keeps the health servicer's statuses in step with the broker."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self.servicer = HealthServicer()
        self._serving: bool | None = None

    def add_to(self, server: object) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    async def update(self) -> None:
        serving = store_writable(self._broker)
        if serving == self._serving:
            return
        self._serving = serving
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in SERVICES:
            await self.servicer.set(service, status)

    async def shutdown(self) -> None:
        self._serving = False
        await self.servicer.enter_graceful_shutdown()
