"""The official clients' tests again, through the gateway (docs/gateway.md).

`server` here is the module's broker (the parent conftest's `server`) behind a gateway
(`reliable gateway start`): each test module of this package imports test functions
written for a `ServerProcess` and they run unchanged, their calls served by the gateway
and passed to the broker over its native wire (the admin calls, Telemetry and the health
service relayed over gRPC). `broker` and `gateway` are the two processes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.grpc.gateway_process import Fronted, GatewayProcess
from tests.e2e.grpc.server_process import ServerProcess


@pytest.fixture(scope="module")
def server(server: ServerProcess) -> Iterator[Fronted]:
    proc = GatewayProcess(server.endpoint).start()
    yield Fronted(server, proc)
    code = proc.terminate()
    assert code == 0, "".join(proc.output)


@pytest.fixture(scope="module")
def broker(server: Fronted) -> ServerProcess:
    return server.broker


@pytest.fixture(scope="module")
def gateway(server: Fronted) -> GatewayProcess:
    return server.gateway
