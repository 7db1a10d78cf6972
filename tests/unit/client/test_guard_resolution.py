"""`idempotent=True` finds its guard through the `reliable.guards` entry point, never by
importing the idempotency package from the client core."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

import reliable.idempotent as idem
from reliable import ConfigurationError, ReceivedMessage, handler
from reliable.idempotent import DEFAULT_GUARD, GUARD_ENTRY_POINTS, DefaultGuard


class _Guard:
    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)

    def process(self, message: Any, group: str, invoke: Any) -> Any:
        return invoke()


def _points(value: str | None) -> Any:
    def entry_points(*, group: str, name: str) -> list[EntryPoint]:
        assert (group, name) == (GUARD_ENTRY_POINTS, DEFAULT_GUARD)
        return [] if value is None else [EntryPoint(name=name, value=value, group=group)]

    return entry_points


@pytest.fixture
def factory_module(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "guard_factory_for_test.py").write_text(
        "def make(env):\n    return ('guard', dict(env))\n"
    )
    sys.path.insert(0, str(tmp_path))
    yield "guard_factory_for_test"
    sys.path.remove(str(tmp_path))
    sys.modules.pop("guard_factory_for_test", None)


def test_the_distribution_declares_the_default_guard() -> None:
    from importlib.metadata import entry_points

    (point,) = entry_points(group=GUARD_ENTRY_POINTS, name=DEFAULT_GUARD)
    assert point.value == "idempotency.environment:guard_from_environment"


def test_the_entry_point_is_called_with_the_environment(
    monkeypatch: pytest.MonkeyPatch, factory_module: str
) -> None:
    monkeypatch.setattr(idem, "entry_points", _points(f"{factory_module}:make"))
    assert idem.build_default_guard({"RELIABLE_DATABASE_URL": "sqlite://"}) == (
        "guard",
        {"RELIABLE_DATABASE_URL": "sqlite://"},
    )


def test_no_entry_point_is_one_line_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idem, "entry_points", _points(None))
    with pytest.raises(ConfigurationError) as info:
        idem.build_default_guard({})
    text = str(info.value)
    assert "\n" not in text
    assert "pip install reliable" in text and "idempotent=guard" in text


@pytest.mark.parametrize("value", ["no_such_module_anywhere:factory", "sys:no_such_factory"])
def test_an_entry_point_that_does_not_load_is_one_line_naming_the_fix(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setattr(idem, "entry_points", _points(value))
    with pytest.raises(ConfigurationError) as info:
        idem.build_default_guard({})
    text = str(info.value)
    assert "\n" not in text and value in text
    assert "pip install reliable" in text and "idempotent=guard" in text


def test_idempotent_true_resolves_when_the_consumer_starts_not_at_declaration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(idem, "entry_points", _points(None))

    @handler("orders", group="billing", idempotent=True)
    def bill(message: ReceivedMessage) -> None: ...

    assert isinstance(bill.guard, DefaultGuard)
    with pytest.raises(ConfigurationError, match="default guard"):
        bill.consumer(transport="embedded")
