"""Broker groups as real processes on loopback: each group a master and a slave, all
started with one cluster file (docs/ha.md, Broker groups)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.grpc.server_process import ServerProcess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Group:
    name: str
    master: ServerProcess
    slaves: list[ServerProcess] = field(default_factory=list)
    ha_port: int = 0


class Cluster:
    """`groups` broker groups named broker-a, broker-b, ...; each a master of `role` and
    `slaves` slaves, with their gRPC ports fixed in the cluster file before they start."""

    def __init__(
        self,
        root: Path,
        home: Path,
        *extra: str,
        groups: int = 2,
        slaves: int = 1,
        role: str = "async-master",
        probe_ms: int = 300,
        master_extra: Sequence[str] = (),
    ) -> None:
        self.root = root
        self.file = root / "cluster.json"
        self.groups: list[Group] = []
        document: dict[str, list[dict[str, object]]] = {"groups": []}
        root.mkdir(parents=True, exist_ok=True)
        for g in range(groups):
            name = f"broker-{chr(ord('a') + g)}"
            ha_port = free_port()
            common = ("--broker-name", name, "--cluster", str(self.file))
            common += ("--cluster-probe-ms", str(probe_ms))
            master = ServerProcess(
                root / name / "m",
                home,
                *extra,
                *common,
                "--role",
                role,
                "--ha-port",
                str(ha_port),
                *master_extra,
                port=free_port(),
            )
            group = Group(name, master, ha_port=ha_port)
            for s in range(1, slaves + 1):
                group.slaves.append(
                    ServerProcess(
                        root / name / f"s{s}",
                        home,
                        *extra,
                        *common,
                        "--role",
                        "slave",
                        "--broker-id",
                        str(s),
                        "--master",
                        f"127.0.0.1:{ha_port}",
                        "--ha-port",
                        str(free_port()),
                        port=free_port(),
                    )
                )
            self.groups.append(group)
            document["groups"].append(
                {
                    "name": name,
                    "master": master.endpoint,
                    "slaves": [p.endpoint for p in group.slaves],
                }
            )
        self.file.write_text(json.dumps(document, indent=2))

    @property
    def processes(self) -> list[ServerProcess]:
        return [p for g in self.groups for p in (g.master, *g.slaves)]

    @property
    def endpoint(self) -> str:
        """The access point an official client is given: every master, ';'-separated."""
        return ";".join(g.master.endpoint for g in self.groups)

    def start(self) -> Cluster:
        for proc in self.processes:
            proc.start()
        self.wait_routed()
        return self

    def masters_routed(self, endpoint: str, topic: str = "cluster-ready") -> set[str]:
        """The groups whose master queues (writable) `endpoint`'s QueryRoute names."""
        import grpc

        from protocol.pb import service_pb2, service_pb2_grpc

        with grpc.insecure_channel(endpoint) as channel:
            request = service_pb2.QueryRouteRequest()
            request.topic.name = topic
            response = service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(
                request, metadata=[("x-mq-client-id", "cluster-ready")], timeout=10
            )
        return {mq.broker.name for mq in response.message_queues if mq.permission == 4}

    def wait_routed(self, timeout_s: float = 30.0) -> None:
        """Until every server routes every group's master: a server probes the others
        once per interval, and the ones started after it were down at its first probe."""
        everyone = {g.name for g in self.groups}
        deadline = time.monotonic() + timeout_s
        for proc in self.processes:
            while self.masters_routed(proc.endpoint) != everyone:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{proc.endpoint} does not route every group")
                time.sleep(0.05)

    def kill(self) -> None:
        for proc in self.processes:
            proc.kill()

    def terminate(self) -> list[int]:
        return [proc.terminate() for proc in self.processes if proc.alive()]

    def finish(self, min_offset: int) -> None:
        """A module's teardown: every group's master stored more than `min_offset` bytes
        (the scenarios reached both groups), then a clean stop of every server, which
        happens even when that check fails (else the servers outlive the run)."""
        from reliable.admin import AdminClient

        try:
            for group in self.groups:
                admin = AdminClient(group.master.endpoint)
                try:
                    assert admin.ha_status()["max_offset"] > min_offset, group.name
                finally:
                    admin.close()
        finally:
            codes = self.terminate()
        assert codes == [0] * len(codes), "".join(o for p in self.processes for o in p.output)
