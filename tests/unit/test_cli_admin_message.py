"""`reliable admin message`'s time arguments and tables."""

from __future__ import annotations

import pytest

from reliable_cli.admin_call import CommandFailed, table
from reliable_cli.admin_message import parse_time
from reliable_cli.exit_codes import ExitCode

NOW = 1_795_478_400_000  # 2026-11-24T00:00:00Z


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1795478400000", NOW),
        ("2026-11-24T00:00:00Z", NOW),
        ("2026-11-24T00:00:00", NOW),  # no offset: UTC
        ("2026-11-24T01:00:00+01:00", NOW),
        ("2026-11-24T00:00:00.250Z", NOW + 250),
        ("2026-11-24", NOW),
        ("30m", NOW - 30 * 60_000),
        ("2h", NOW - 2 * 3_600_000),
        ("1d", NOW - 86_400_000),
        ("15s", NOW - 15_000),
    ],
)
def test_times_are_iso_epoch_ms_or_relative(text: str, ms: int) -> None:
    assert parse_time(text, now_ms=NOW) == ms


@pytest.mark.parametrize("text", ["yesterday", "", "10 minutes", "2026-13-01", "-5m"])
def test_anything_else_is_a_usage_error(text: str) -> None:
    with pytest.raises(CommandFailed) as failed:
        parse_time(text, now_ms=NOW)
    assert failed.value.exit_code == ExitCode.USAGE and "is not a time" in str(failed.value)


def test_table_columns_are_aligned_and_empty_cells_shown() -> None:
    assert table([("a", None, 3), ("long value", "", 12345)], ("X", "Y", "LAST")) == [
        "X           Y  LAST",
        "a           -  3",
        "long value  -  12345",
    ]
