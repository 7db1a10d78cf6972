"""docs/client.md states defaults; they must be the code's defaults."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

from reliable import ConsumerSettings, Producer

DOC = (Path(__file__).resolve().parents[3] / "docs" / "client.md").read_text()
ROW = re.compile(r"^\| `([a-z_]+)`(?:, `([a-z_]+)`)? \| ([^|]+) \|", re.M)


def _documented() -> dict[str, str]:
    out: dict[str, str] = {}
    for first, second, default in ROW.findall(DOC):
        values = [v.strip(" `") for v in default.split(",")]
        for i, name in enumerate(n for n in (first, second) if n):
            out[name] = values[min(i, len(values) - 1)]
    return out


def _same(doc: str, value: object) -> bool:
    if isinstance(value, bool):
        return doc == str(value)
    if isinstance(value, int | float):
        return float(doc) == float(value)
    if hasattr(value, "name"):
        return doc in (value.name, getattr(value, "__name__", None))  # type: ignore[attr-defined]
    return True


def test_consumer_defaults_in_the_docs_match_the_code() -> None:
    documented = _documented()
    checked = 0
    for f in dataclasses.fields(ConsumerSettings):
        if f.name in documented and f.default is not dataclasses.MISSING:
            assert _same(documented[f.name], f.default), (f.name, documented[f.name], f.default)
            checked += 1
    assert checked >= 10


def test_producer_defaults_in_the_docs_match_the_code() -> None:
    documented = _documented()
    params = inspect.signature(Producer.__init__).parameters
    checked = 0
    for name, p in params.items():
        if name in documented and p.default is not inspect.Parameter.empty:
            if name == "group":
                assert documented[name] == p.default
            else:
                assert _same(documented[name], p.default), (name, documented[name], p.default)
            checked += 1
    assert checked >= 5
