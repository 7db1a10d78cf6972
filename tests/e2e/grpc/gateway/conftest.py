"""The official clients' tests again, through the gateway (docs/gateway.md).

`server` here is the module's broker behind a gateway (`reliable gateway start`): each test
module of this package imports test functions written for a `ServerProcess` and they run
unchanged, their calls served by the gateway and passed to the broker over its native
wire (the admin calls, Telemetry and the health service relayed over gRPC).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.grpc.conftest import FAST
from tests.e2e.grpc.gateway_process import Fronted, GatewayProcess
from tests.e2e.grpc.server_process import ServerProcess


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, client_home: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tmp_path_factory.mktemp("store"), client_home, *FAST, "--wire-port", "0"
    ).start()
    yield proc
    code = proc.terminate()
    assert code == 0, "".join(proc.output)


@pytest.fixture(scope="module")
def gateway(broker: ServerProcess) -> Iterator[GatewayProcess]:
    proc = GatewayProcess(broker.endpoint).start()
    yield proc
    code = proc.terminate()
    assert code == 0, "".join(proc.output)


@pytest.fixture(scope="module")
def server(broker: ServerProcess, gateway: GatewayProcess) -> Fronted:
    return Fronted(broker, gateway)
