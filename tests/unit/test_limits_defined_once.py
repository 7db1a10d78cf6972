"""The shared limits are written once (`protocol.limits`): the 4 MiB body limit, the 16 retries
before the dead-letter queue, the 12 h invisible-time cap.

The test reads every Python file outside `tests/` and finds each integer literal (a
constant, or constant arithmetic such as `4 * 1024 * 1024` or `4 << 20`) with a limit's
value. For the body limit and the invisible-time cap every such literal counts, except where
the names around it say it is something else of the same size; for the retry maximum (16 is
a common number) only a literal bound to a name that speaks of retries counts: an
assignment, a parameter's default, a keyword, a dict entry or a call beside a string naming
it (`add_argument("--max-retries", default=16)`, `params.get("retryMaxTimes", 16)`).
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from protocol import limits
from tests.unit.source_tree import ROOT, parse_source, python_files

SOURCES = (
    "protocol",
    "broker",
    "reliable",
    "outbox",
    "idempotency",
    "reliable_cli",
    "bench",
    "scripts",
)
HOME = "protocol/limits.py"


@dataclass(frozen=True)
class Limit:
    value: int
    counts: Callable[[set[str]], bool]  # given the names around a literal of this value


# names of things that are 4 MiB but not the body limit
_OTHER_4_MIB = re.compile(r"(?i)reserve_chunk|commitlog|file_size|mapped_file")
LIMITS = {
    "DEFAULT_MAX_BODY_SIZE": Limit(
        limits.DEFAULT_MAX_BODY_SIZE, lambda names: not any(_OTHER_4_MIB.search(n) for n in names)
    ),
    "DEFAULT_RETRY_MAX_TIMES": Limit(
        limits.DEFAULT_RETRY_MAX_TIMES,
        lambda names: any(re.search(r"(?i)retr|reconsume", n) for n in names),
    ),
    "MAX_INVISIBLE_MS": Limit(limits.MAX_INVISIBLE_MS, lambda names: True),
}

_OPS: dict[type[ast.operator], Callable[[int, int], int]] = {
    ast.Mult: operator.mul,
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.LShift: operator.lshift,
    ast.Pow: operator.pow,
    ast.FloorDiv: operator.floordiv,
}


def _value(node: ast.AST) -> int | None:
    """The integer a constant expression evaluates to, or None if it is not one."""
    if isinstance(node, ast.Constant):
        v = node.value
        return v if isinstance(v, int) and not isinstance(v, bool) else None
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left), _value(node.right)
        if left is None or right is None or (isinstance(node.op, ast.Pow) and right > 64):
            return None
        if isinstance(node.op, ast.FloorDiv) and right == 0:
            return None
        return _OPS[type(node.op)](left, right)
    return None


def _target_names(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    if isinstance(node, ast.Tuple | ast.List):
        return {n for e in node.elts for n in _target_names(e)}
    return set()


def _names_around(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> set[str]:
    """The names a literal is bound to or written beside."""
    names: set[str] = set()
    child, parent = node, parents.get(node)
    while parent is not None and isinstance(parent, ast.BinOp | ast.UnaryOp):
        child, parent = parent, parents.get(parent)
    if isinstance(parent, ast.Assign):
        names |= {n for t in parent.targets for n in _target_names(t)}
    elif isinstance(parent, ast.AnnAssign | ast.AugAssign):
        names |= _target_names(parent.target)
    elif isinstance(parent, ast.keyword) and parent.arg:
        names.add(parent.arg)
        call = parents.get(parent)
        if isinstance(call, ast.Call):
            names |= _strings(call.args)
    elif isinstance(parent, ast.Call):  # max(4 << 20, x), get("key", 16): and its binding
        names |= _strings(parent.args) | _names_around(parent, parents)
    elif isinstance(parent, ast.Dict):
        for key, value in zip(parent.keys, parent.values, strict=True):
            if value is child and isinstance(key, ast.Constant) and isinstance(key.value, str):
                names.add(key.value)
    elif isinstance(parent, ast.arguments):
        names |= _defaulted(parent, child)
    return names


def _strings(nodes: list[ast.expr]) -> set[str]:
    return {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _defaulted(args: ast.arguments, default: ast.AST) -> set[str]:
    positional = args.posonlyargs + args.args
    for arg, value in zip(
        positional[len(positional) - len(args.defaults) :], args.defaults, strict=True
    ):
        if value is default:
            return {arg.arg}
    for arg, kw_value in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        if kw_value is default:
            return {arg.arg}
    return set()


def definitions(source: str, path: str) -> Iterator[tuple[str, str]]:
    """(limit name, 'path:line') for each literal of a limit in `source`."""
    parents: dict[ast.AST, ast.AST] = {}
    candidates: list[ast.AST] = []
    stack: list[ast.AST] = [parse_source(source)]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Constant | ast.BinOp):
            candidates.append(node)
        for child in ast.iter_child_nodes(node):
            parents[child] = node
            stack.append(child)
    for node in candidates:
        if isinstance(parents.get(node), ast.BinOp) and _value(parents[node]) is not None:
            continue  # part of a larger constant expression: that one is judged
        value = _value(node)
        if value is None:
            continue
        for name, limit in LIMITS.items():
            if value == limit.value and limit.counts(_names_around(node, parents)):
                yield name, f"{path}:{getattr(node, 'lineno', 0)}"


def _tree() -> Iterator[tuple[str, str]]:
    for file in python_files(*SOURCES):
        yield from definitions(file.read_text(), file.relative_to(ROOT).as_posix())


def test_each_limit_is_written_once_in_broker_limits() -> None:
    found: dict[str, list[str]] = {name: [] for name in LIMITS}
    for name, where in _tree():
        found[name].append(where)
    for name, places in found.items():
        assert len(places) == 1 and places[0].startswith(f"{HOME}:"), (
            f"{name} is written {len(places)} times: {places}; "
            "import it from protocol.limits instead"
        )


def test_a_second_definition_is_found() -> None:
    snippet = """
MAX = 4 * 1024 * 1024
LIMIT = 4 << 20
_RESERVE_CHUNK = 4 * 1024 * 1024
def create_group(name, retry_max_times=16, queues=16): ...
cap = {"max_invisible_ms": 12 * 3600 * 1000, "retryMaxTimes": 16, "width": 16}
parser.add_argument("--max-retries", type=int, default=16)
params.get("retryMaxTimes", 16)
if attempts <= 16: pass
"""
    found = sorted(definitions(snippet, "x.py"))
    assert found == [
        ("DEFAULT_MAX_BODY_SIZE", "x.py:2"),
        ("DEFAULT_MAX_BODY_SIZE", "x.py:3"),
        ("DEFAULT_RETRY_MAX_TIMES", "x.py:5"),
        ("DEFAULT_RETRY_MAX_TIMES", "x.py:6"),
        ("DEFAULT_RETRY_MAX_TIMES", "x.py:7"),
        ("DEFAULT_RETRY_MAX_TIMES", "x.py:8"),
        ("MAX_INVISIBLE_MS", "x.py:6"),
    ]
