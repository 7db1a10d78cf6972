"""Fixtures of the console's browser tests: one broker process and one headless Chromium
per module, consoles started per test (each with its own options)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.console.harness import PASSWORD, ConsoleProcess, browser_missing, chrome
from tests.e2e.grpc.conftest import FAST
from tests.e2e.grpc.server_process import ServerProcess


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tmp_path_factory.mktemp("store"), tmp_path_factory.mktemp("home"), *FAST
    ).start()
    yield proc
    assert proc.terminate() == 0, "".join(proc.output)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = browser_missing()
    if missing:
        pytest.fail(missing)  # a missing browser fails the run, as a missing service does
    with chrome() as driver:
        yield driver


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "console.pw"
    path.write_text(PASSWORD + "\n")
    return path


@pytest.fixture
def make_console(password_file: Path) -> Iterator[Callable[..., ConsoleProcess]]:
    made: list[ConsoleProcess] = []

    def make(endpoint: str, *extra: str, password: bool = True) -> ConsoleProcess:
        proc = ConsoleProcess(
            endpoint, *extra, password_file=password_file if password else None
        ).start()
        made.append(proc)
        return proc

    yield make
    for proc in made:
        assert proc.stop() == 0, "".join(proc.output)


@pytest.fixture
def shots() -> Path | None:
    """Where the tests save screenshots: RELIABLE_CONSOLE_SCREENSHOTS, else nowhere."""
    target = os.environ.get("RELIABLE_CONSOLE_SCREENSHOTS")
    return Path(target) if target else None
