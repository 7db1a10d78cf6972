"""Fixtures for the chaos suites that drive the server with the official RocketMQ 5 client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.grpc import official


@pytest.fixture(scope="module")
def client_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A temporary HOME for the official client's log directory, for one test module."""
    with official.client_home(tmp_path_factory.mktemp("client-home")) as home:
        yield home
