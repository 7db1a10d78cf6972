"""The project's own Python files, as the tree-wide checks read them (sizes, limits)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
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


def parse_source(source: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse`, again on a fresh thread when CPython 3.11 raises its spurious "AST
    constructor recursion depth mismatch" SystemError (its depth bookkeeping goes wrong
    deep in a worker's stack, or beside another thread compiling; a fresh thread starts
    from a shallow one). Every tree-wide check parses through here."""
    try:
        return ast.parse(source, filename)
    except SystemError:
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(ast.parse, source, filename).result()
