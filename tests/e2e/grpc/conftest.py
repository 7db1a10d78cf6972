"""Fixtures for driving our gRPC server with the official RocketMQ 5 Python client.

The official client writes its log under `$HOME/logs/rocketmq_python/` from the moment it is
imported; these tests point HOME at a temporary directory first and import it lazily.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import reliable
from reliable import Transport
from tests.e2e.grpc import official
from tests.e2e.grpc.server_process import ServerProcess
from tests.e2e.helpers import broker_config, store_config

# fast enough for tests, otherwise the defaults: redelivery after 1-2 s instead of >= 10 s
FAST = (
    "--min-invisible-ms",
    "1000",
    "--long-polling-ms",
    "5000",
    "--min-long-polling-ms",
    "1000",
    "--delay-levels",
    "1s 1s 1s 2s 2s",
    "--transaction-timeout-ms",
    "1000",
    "--transaction-check-interval-ms",
    "1000",
    "--default-invisible-ms",
    "15000",
)


@pytest.fixture(scope="session")
def client_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with official.client_home(tmp_path_factory.mktemp("client-home")) as home:
        yield home


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, client_home: Path) -> Iterator[ServerProcess]:
    """One server for a test module (tests use distinct topics and groups); its native
    wire is on, used only by transports that ask for it (`wire="native"`)."""
    proc = ServerProcess(
        tmp_path_factory.mktemp("store"), client_home, *FAST, "--wire-port", "0"
    ).start()
    yield proc
    code = proc.terminate()
    assert code == 0, "".join(proc.output)


@pytest.fixture
def make_server(tmp_path: Path, client_home: Path) -> Iterator[Callable[..., ServerProcess]]:
    made: list[ServerProcess] = []

    def make(*extra: str, store: Path | None = None) -> ServerProcess:
        proc = ServerProcess(
            store or tmp_path / f"store{len(made)}", client_home, *FAST, *extra
        ).start()
        made.append(proc)
        return proc

    yield make
    for proc in made:
        proc.kill()


def open_transport(
    request: pytest.FixtureRequest, name: str, tmp_path: Path
) -> Iterator[Transport]:
    """A started transport of `name`: the in-process broker over a store in `tmp_path`, or
    the grpc transport to the module's server process, its unary calls over gRPC
    ("grpc") or over the server's native wire ("wire", docs/wire.md)."""
    if name == "embedded":
        t = reliable.connect(
            "embedded", store_config=store_config(tmp_path / "store"), broker_config=broker_config()
        )
    else:
        served: ServerProcess = request.getfixturevalue("server")
        wire = "native" if name == "wire" else "grpc"
        t = reliable.connect("grpc", endpoint=served.endpoint, wire=wire)
    t.start()
    yield t
    if name == "wire":  # the calls did go over the wire, not silently over gRPC
        assert t.stub.native is True  # type: ignore[attr-defined]
    t.close()


@pytest.fixture(params=["embedded", "grpc"])
def transport(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Transport]:
    """The same test over both transports."""
    yield from open_transport(request, request.param, tmp_path)
