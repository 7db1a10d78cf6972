"""Every program in examples/ runs to completion (exit 0) on a fresh store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PROGRAMS = sorted(p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))
NEEDS = {"idempotent_handler.py": [pytest.mark.redis]}  # real services an example uses


def test_there_is_an_example_per_feature() -> None:
    assert {
        "handlers.py",
        "producer_modes.py",
        "ordered_messages.py",
        "delayed_messages.py",
        "transactional_send.py",
        "simple_consumer.py",
        "push_consumer.py",
        "idempotent_handler.py",
    } <= set(PROGRAMS)


@pytest.mark.parametrize("program", [pytest.param(p, marks=NEEDS.get(p, [])) for p in PROGRAMS])
def test_example_runs(program: str, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(EXAMPLES.parent))
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / program), str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, f"{program} failed:\n{done.stdout}\n{done.stderr}"
    assert done.stdout.strip(), f"{program} printed nothing"
