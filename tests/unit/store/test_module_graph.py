"""The store's modules import one another one way: no import cycle between them.

Every import statement counts, those under `if TYPE_CHECKING:` too: a cycle only typing
sees still ties two modules' jobs together. Read from the source with `ast`, nothing is
imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import broker.store
from tests.unit.source_tree import parse_source

PACKAGE = "broker.store"
STORE_DIR = Path(broker.store.__file__).parent


def store_import_graph() -> dict[str, set[str]]:
    modules = {f"{PACKAGE}.{p.stem}": p for p in STORE_DIR.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(parse_source(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                # `from broker.store import query` names a module as an attribute
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_no_import_cycle_between_store_modules() -> None:
    graph = store_import_graph()
    assert len(graph) > 20  # the package was found and read
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_cycle_is_found_when_there_is_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_store_imports_nothing_above_the_broker_core() -> None:
    for path in STORE_DIR.glob("*.py"):
        for node in ast.walk(parse_source(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                top = name.split(".")[0]
                assert top not in {"reliable", "reliable_cli", "outbox", "idempotency"}, (
                    f"{path.name} imports {name}"
                )
                if top == "broker":
                    assert name.startswith(
                        (
                            "broker.store",
                            "broker.errors",
                            "broker.names",  # the validators; the rules are protocol.names
                            "broker.futures",
                        )
                    ), f"{path.name} imports {name}"
