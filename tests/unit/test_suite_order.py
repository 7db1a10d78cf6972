"""The units tests/conftest.py hands to pytest-xdist first must exist: a renamed module
would silently drop out of the order and could end the run alone on one worker."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import LONGEST_FIRST

ROOT = Path(__file__).resolve().parents[2]


def test_every_unit_named_longest_first_exists_once() -> None:
    assert [m for m in LONGEST_FIRST if not (ROOT / m).exists()] == []
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
