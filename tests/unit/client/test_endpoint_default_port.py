"""An endpoint without a port means the broker's documented default port (8081), in the
client as on the command line, never gRPC's 443."""

from __future__ import annotations

import pytest

from broker.config import DEFAULT_PORT
from reliable.transport.grpc import GrpcTransport


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        ("localhost", f"localhost:{DEFAULT_PORT}"),
        ("127.0.0.1", f"127.0.0.1:{DEFAULT_PORT}"),
        ("127.0.0.1:9000", "127.0.0.1:9000"),
        ("10.0.0.1;10.0.0.2:9000", f"10.0.0.1:{DEFAULT_PORT};10.0.0.2:9000"),
    ],
)
def test_a_bare_host_gets_the_default_port(given: str, meant: str) -> None:
    transport = GrpcTransport(endpoint=given)
    try:
        assert transport.endpoint == meant
    finally:
        transport.close()


def test_the_demo_takes_a_bare_host_too() -> None:
    from reliable_cli import build_parser

    args = build_parser().parse_args(["demo", "--endpoint", "localhost"])
    assert args.endpoint == f"localhost:{DEFAULT_PORT}"
