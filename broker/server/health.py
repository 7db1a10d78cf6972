"""The standard gRPC health service (`grpc.health.v1.Health`) on the broker's port.

SERVING while the broker runs and its store accepts writes; NOT_SERVING when the disk is
above the refuse watermark, a commitlog flush has failed, or the server is stopping. The
overall status ("") and `apache.rocketmq.v2.MessagingService` are reported alike.
`reliable.broker.Master` is SERVING only when, in addition, the broker takes writes (no
replication role, or a master: not a slave); broker groups (`broker.server.cluster`) probe
it to learn which server of a group is its master. The server
re-evaluates every upkeep pass (1 s) and at shutdown; like other probes the service needs
no credentials.
"""

from __future__ import annotations

from collections.abc import Callable

from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from broker.broker import Broker

MESSAGING_SERVICE = "apache.rocketmq.v2.MessagingService"
MASTER_SERVICE = "reliable.broker.Master"  # SERVING: takes writes (see broker.server.cluster)
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
        self._serving: tuple[bool, bool] | None = None
        # whether this broker takes writes (a slave does not); the server sets it
        self.is_master: Callable[[], bool] = lambda: True

    def add_to(self, server: object) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    async def update(self) -> None:
        serving = store_writable(self._broker)
        master = serving and self.is_master()
        if (serving, master) == self._serving:
            return
        self._serving = (serving, master)
        for service in SERVICES:
            await self.servicer.set(service, _status(serving))
        await self.servicer.set(MASTER_SERVICE, _status(master))

    async def shutdown(self) -> None:
        self._serving = (False, False)
        await self.servicer.enter_graceful_shutdown()


def _status(serving: bool) -> int:
    return int(
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
