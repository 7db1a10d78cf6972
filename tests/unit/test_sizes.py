"""Every module and every function is small enough to read in one sitting.

No Python file over 700 lines and no function over 120, anywhere in the project's own code
and its tests, except `bench/` (programs that measure, each a whole scenario) and generated
code (`*_pb2.py`, `*_pb2_grpc.py`, stubs). A file that must grow past the limit is split by
what its parts do; a function, into named stages.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.unit.source_tree import ROOT, parse_source, python_files

SOURCES = (
    "protocol",
    "broker",
    "reliable",
    "outbox",
    "idempotency",
    "reliable_cli",
    "apache_rocketmq",
    "scripts",
    "examples",
    "tests",
)
MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 120


def _files() -> Iterator[Path]:
    return python_files(*SOURCES)


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def test_the_walk_sees_the_tree() -> None:
    """The limits below are checked on the project, not on an empty list."""
    seen = {p.relative_to(ROOT).parts[0] for p in _files()}
    assert seen == set(SOURCES)
    assert sum(1 for _ in _files()) > 300


def test_no_file_over_700_lines() -> None:
    over = {
        str(p.relative_to(ROOT)): n
        for p in _files()
        if (n := p.read_text().count("\n")) > MAX_FILE_LINES
    }
    assert over == {}, f"split these by what their parts do: {over}"


def test_no_function_over_120_lines() -> None:
    over = {}
    for path in _files():
        for fn in _functions(parse_source(path.read_text(), str(path))):
            length = (fn.end_lineno or fn.lineno) - fn.lineno + 1
            if length > MAX_FUNCTION_LINES:
                over[f"{path.relative_to(ROOT)}:{fn.lineno} {fn.name}"] = length
    assert over == {}, f"split these into named stages: {over}"
