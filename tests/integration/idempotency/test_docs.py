"""docs/outbox.md's state machine is the guard's own: the two cannot drift apart."""

from __future__ import annotations

from pathlib import Path

import idempotency.guard as guard_module
from idempotency import EventKind

DOC = Path(__file__).resolve().parents[3] / "docs" / "outbox.md"


def _diagram(text: str) -> str:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "deliver (message, group)" in line)
    end = next(
        i
        for i in range(start, len(lines))
        if "──► SUCCESS" in lines[i] and "only while still ours" in lines[i]
    )
    return "\n".join(lines[start : end + 1])


def test_documented_state_machine_is_the_code_s() -> None:
    assert guard_module.__doc__ is not None
    assert _diagram(DOC.read_text()) == _diagram(guard_module.__doc__)


def test_every_event_kind_is_documented() -> None:
    doc = DOC.read_text()
    assert [k.value for k in EventKind if f"`{k.value}`" not in doc] == []
