"""The tree is formatted by `ruff format` and clean under `ruff check`, as `make lint` says.

CI runs `make test` alone, so the suite checks the style too; a change that is not
formatted fails here with the files named.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = (
    "broker",
    "reliable",
    "reliable_cli",
    "outbox",
    "idempotency",
    "bench",
    "tests",
    "examples",
    "scripts",
)


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, *TREES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_tree_is_formatted() -> None:
    done = _ruff("format", "--check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_tree_is_lint_clean() -> None:
    done = _ruff("check")
    assert done.returncode == 0, done.stdout + done.stderr
