"""`reliable broker start`'s limit options default to `ServerConfig`'s values (the command
line keeps its own copy so that `--help` does not load the server)."""

from __future__ import annotations

from broker.server.config import ServerConfig
from reliable_cli.broker import SERVER_LIMITS


def test_the_command_line_limits_are_the_server_configs_defaults() -> None:
    config = ServerConfig()
    assert {name: getattr(config, name) for name in SERVER_LIMITS} == SERVER_LIMITS
