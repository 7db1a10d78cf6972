"""The project's own Python files, as the tree-wide checks read them (sizes, limits)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = re.compile(r"_pb2(_grpc)?\.py$")  # generated code: not held to the checks


def python_files(*tops: str) -> Iterator[Path]:
    """Every `*.py` under each of `tops` (folders of ROOT), in order, generated code and
    virtualenvs left out."""
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not GENERATED.search(rel) and "/.venv/" not in rel:
                yield path
