"""Broker groups (docs/ha.md "Broker groups"): the cluster file, and who serves each group.

A cluster file names every broker group: its name, its master's gRPC endpoint and its
slaves' endpoints (slave N is the group's broker id N, in the order listed). JSON or TOML:

    {"groups": [{"name": "broker-a", "master": "10.0.0.1:8081", "slaves": ["10.0.0.2:8081"]},
                {"name": "broker-b", "master": "10.0.0.3:8081", "slaves": ["10.0.0.4:8081"]}]}

    [[groups]]
    name = "broker-a"
    master = "10.0.0.1:8081"
    slaves = ["10.0.0.2:8081"]

Every server of the cluster is started with the same file (`reliable broker start --cluster
FILE`) and answers QueryRoute and QueryAssignment with the queues of every group. Which
server of a group serves it comes from `ClusterView`: each server probes every other one
with the standard gRPC health service, once per probe interval, and caches the answer:

- `MASTER_SERVICE` SERVING: a master taking writes (the file's master, or a slave an
  operator promoted); the group's queues are READ_WRITE at its endpoint, broker id 0;
- NOT_SERVING: reachable but not taking writes (a slave, or a master whose disk is full);
- no answer: down.

A group with no master up is served by its first slave that answers, READ only (that slave
serves the group's receives, `broker.acting`; the routes name its queues under broker id 0,
so the official clients read from them, and never send there as they are not writable); a
group none of whose servers answers is left out. A server not probed yet counts as up.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.errors import ConfigError
from broker.server.health import MASTER_SERVICE
from protocol.names import topic_name_problem

if TYPE_CHECKING:
    from protocol.pb import service_pb2

log = logging.getLogger(__name__)

# reconnect within a probe interval; `min_reconnect_backoff_ms` is the time one connection
# attempt may take (gRPC's MIN_CONNECT_TIMEOUT): at 100 ms a busy host took live peers for
# dead (the probe's own deadline still bounds each probe)
PROBE_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 5_000),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]


class ClusterFileError(ConfigError):
    """The cluster file cannot be read or does not describe broker groups."""


def _endpoint(text: object, where: str) -> tuple[str, int]:
    if not isinstance(text, str):
        raise ClusterFileError(f"{where}: an endpoint is a 'HOST:PORT' string, not {text!r}")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ClusterFileError(f"{where}: {text!r} is not HOST:PORT (port 1..65535)")
    return host, int(port)


@dataclass(frozen=True)
class BrokerGroup:
    """One broker group: endpoints[0] is the master (broker id 0), endpoints[i] slave i."""

    name: str
    endpoints: tuple[tuple[str, int], ...]

    @property
    def master(self) -> tuple[str, int]:
        return self.endpoints[0]


@dataclass(frozen=True)
class ClusterConfig:
    groups: tuple[BrokerGroup, ...]

    def group(self, name: str) -> BrokerGroup | None:
        return next((g for g in self.groups if g.name == name), None)

    @classmethod
    def parse(cls, document: Any) -> ClusterConfig:
        if not isinstance(document, dict) or not isinstance(document.get("groups"), list):
            raise ClusterFileError('a cluster file holds a list "groups"')
        groups: list[BrokerGroup] = []
        seen: dict[tuple[str, int], str] = {}
        for i, entry in enumerate(document["groups"]):
            where = f"groups[{i}]"
            if not isinstance(entry, dict):
                raise ClusterFileError(f"{where}: a group is a table with name, master, slaves")
            unknown = set(entry) - {"name", "master", "slaves"}
            if unknown:
                raise ClusterFileError(f"{where}: unknown keys {sorted(unknown)}")
            name = entry.get("name")
            problem = topic_name_problem(name)
            if problem is not None:
                raise ClusterFileError(f"{where}: broker name: {problem}")
            assert isinstance(name, str)
            if any(g.name == name for g in groups):
                raise ClusterFileError(f"{where}: broker group {name!r} is named twice")
            if "master" not in entry:
                raise ClusterFileError(f"{where}: group {name!r} has no master endpoint")
            slaves = entry.get("slaves", [])
            if not isinstance(slaves, list):
                raise ClusterFileError(f"{where}: slaves is a list of 'HOST:PORT'")
            endpoints = tuple(_endpoint(e, f"{where} ({name})") for e in [entry["master"], *slaves])
            for endpoint in endpoints:
                if endpoint in seen:
                    raise ClusterFileError(
                        f"{where}: {endpoint[0]}:{endpoint[1]} also serves {seen[endpoint]!r}"
                    )
                seen[endpoint] = name
            groups.append(BrokerGroup(name, endpoints))
        if not groups:
            raise ClusterFileError("a cluster file names at least one broker group")
        return cls(tuple(groups))

    @classmethod
    def load(cls, path: Path) -> ClusterConfig:
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ClusterFileError(f"cannot read the cluster file {path}: {exc}") from None
        try:
            if path.suffix.lower() == ".toml":
                document: Any = tomllib.loads(raw.decode())
            else:
                document = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            kind = "TOML" if path.suffix.lower() == ".toml" else "JSON"
            raise ClusterFileError(f"{path} is not valid {kind}: {exc}") from None
        return cls.parse(document)


class State(enum.Enum):
    UNKNOWN = "unknown"  # not probed yet: counts as up
    MASTER = "master"  # takes writes
    REPLICA = "replica"  # answers, takes no writes
    DOWN = "down"  # no answer


@dataclass(frozen=True, slots=True)
class Server:
    """Who serves one group: where, under which broker id, and whether it takes writes."""

    group: str
    broker_id: int
    host: str
    port: int
    writable: bool


class ClusterView:
    """The cached liveness and role of every server of the cluster, refreshed by `probe_loop`.

    `me` is this server's place in the file ((group, index)); its own state comes from
    `local_master()` (called at each lookup), never from a probe."""

    def __init__(
        self,
        config: ClusterConfig,
        me: tuple[str, int],
        local_master: Callable[[], bool],
        *,
        probe_interval_ms: int = 1000,
        probe_timeout_ms: int = 1000,
    ) -> None:
        group = config.group(me[0])
        if group is None:
            raise ClusterFileError(f"the cluster file has no broker group {me[0]!r}")
        if not 0 <= me[1] < len(group.endpoints):
            raise ClusterFileError(
                f"broker group {me[0]!r} has no broker id {me[1]} in the cluster file "
                f"(it lists {len(group.endpoints) - 1} slaves)"
            )
        self.config = config
        self.me = me
        self._local_master = local_master
        self.probe_interval_s = probe_interval_ms / 1000
        self.probe_timeout_s = probe_timeout_ms / 1000
        self._states: dict[tuple[str, int], State] = {}
        self._changed: dict[tuple[str, int], float] = {}
        self.probes = 0
        self._forwarding: dict[tuple[str, int], Any] = {}  # channels of forwarded calls

    def state(self, group: BrokerGroup, index: int) -> State:
        if (group.name, index) == self.me:
            return State.MASTER if self._local_master() else State.REPLICA
        return self._states.get(group.endpoints[index], State.UNKNOWN)

    def serving(self, group: BrokerGroup) -> Server | None:
        """The server of `group` clients use: a master that is up (the file's first),
        else its first slave that answers (read only), else None."""
        states = [self.state(group, i) for i in range(len(group.endpoints))]
        for i, state in enumerate(states):
            if state is State.MASTER or (i == 0 and state is State.UNKNOWN):
                host, port = group.endpoints[i]
                return Server(group.name, 0, host, port, True)
        for i, state in enumerate(states[1:], start=1):
            if state in (State.REPLICA, State.UNKNOWN):
                host, port = group.endpoints[i]
                return Server(group.name, i, host, port, False)
        return None

    def snapshot(self) -> list[dict[str, object]]:
        """Every server's state, for the admin view and logs."""
        out = []
        for group in self.config.groups:
            for i, (host, port) in enumerate(group.endpoints):
                out.append(
                    {
                        "group": group.name,
                        "broker_id": i,
                        "endpoint": f"{host}:{port}",
                        "state": self.state(group, i).value,
                        "self": (group.name, i) == self.me,
                    }
                )
        return out

    async def forward_recall(
        self, group: str, request: service_pb2.RecallMessageRequest, metadata: dict[str, str]
    ) -> service_pb2.RecallMessageResponse:
        """RecallMessage for a message another group holds: asked of that group's master,
        with the caller's metadata (its client id and signature), answered as it answers."""
        from broker.server.errors import BadRequest, ServerError
        from protocol.pb import service_pb2_grpc

        found = self.config.group(group)
        if found is None:
            raise BadRequest(f"the recall handle names broker group {group!r}, not in the cluster")
        server = self.serving(found)
        if server is None or not server.writable:
            raise ServerError(f"broker group {group!r} has no master up to recall the message from")
        channel = self._channel((server.host, server.port))
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        forwarded = tuple(
            (k, v) for k, v in metadata.items() if k.startswith("x-mq-") or k == "authorization"
        )
        try:
            return await stub.RecallMessage(request, metadata=forwarded, timeout=10)
        except grpc.aio.AioRpcError as exc:
            raise ServerError(
                f"RecallMessage to {group} ({server.host}:{server.port}): {exc.code().name}"
            ) from None

    def _channel(self, endpoint: tuple[str, int]) -> grpc.aio.Channel:
        channel = self._forwarding.get(endpoint)
        if channel is None:
            channel = grpc.aio.insecure_channel(f"{endpoint[0]}:{endpoint[1]}", PROBE_OPTIONS)
            self._forwarding[endpoint] = channel
        return channel

    def _others(self) -> list[tuple[str, int]]:
        return [
            endpoint
            for group in self.config.groups
            for i, endpoint in enumerate(group.endpoints)
            if (group.name, i) != self.me
        ]

    async def probe_loop(self) -> None:
        """Probe every other server each interval, concurrently; runs until cancelled."""
        channels = {
            ep: grpc.aio.insecure_channel(f"{ep[0]}:{ep[1]}", PROBE_OPTIONS)
            for ep in self._others()
        }
        stubs = {ep: health_pb2_grpc.HealthStub(ch) for ep, ch in channels.items()}
        try:
            while True:
                started = time.monotonic()
                await asyncio.gather(*(self._probe(ep, stub) for ep, stub in stubs.items()))
                self.probes += 1
                await asyncio.sleep(max(0.0, self.probe_interval_s - (time.monotonic() - started)))
        finally:
            for channel in [*channels.values(), *self._forwarding.values()]:
                with contextlib.suppress(Exception):
                    await channel.close()

    async def _probe(self, endpoint: tuple[str, int], stub: Any) -> None:
        request = health_pb2.HealthCheckRequest(service=MASTER_SERVICE)
        try:
            response = await stub.Check(request, timeout=self.probe_timeout_s)
            state = (
                State.MASTER
                if response.status == health_pb2.HealthCheckResponse.SERVING
                else State.REPLICA
            )
        except grpc.aio.AioRpcError as exc:
            # NOT_FOUND: a server without the master service (an older one): it answers
            state = State.REPLICA if exc.code() is grpc.StatusCode.NOT_FOUND else State.DOWN
        except Exception:
            state = State.DOWN
        before = self._states.get(endpoint, State.UNKNOWN)
        if state is not before:
            self._states[endpoint] = state
            self._changed[endpoint] = time.monotonic()
            log.log(
                logging.INFO if before is State.UNKNOWN else logging.WARNING,
                "cluster: %s:%d is %s (was %s)",
                endpoint[0],
                endpoint[1],
                state.value,
                before.value,
            )
