"""Delay-level tables and broker configuration checks."""

from __future__ import annotations

import pytest

from broker.config import DEFAULT_DELAY_LEVELS, BrokerConfig, parse_delay_levels
from broker.errors import ConfigError
from broker.sendback import retry_level


def test_default_table_is_rocketmqs_18_levels() -> None:
    levels = parse_delay_levels(DEFAULT_DELAY_LEVELS)
    assert len(levels) == 18
    assert levels[0] == 1_000
    assert levels[2] == 10_000  # level 3: the first retry
    assert levels[4] == 60_000
    assert levels[-1] == 2 * 3_600_000


def test_short_tables_for_tests() -> None:
    assert parse_delay_levels("100ms 200ms 1s 2m 1h 1d") == (
        100,
        200,
        1_000,
        120_000,
        3_600_000,
        86_400_000,
    )


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ("", "empty"),
        ("1s 5x", "level 2"),
        ("1s 500ms", "shorter than level 1"),
        ("0s", "positive"),
        ("s", "level 1"),
        (" ".join(["1s"] * 65), "at most 64"),
    ],
)
def test_bad_tables_are_rejected_with_the_level(table: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_delay_levels(table)
    assert fragment in str(info.value)


def test_broker_config_validation() -> None:
    BrokerConfig().validate()
    with pytest.raises(ConfigError):
        BrokerConfig(message_delay_level="1x").validate()
    with pytest.raises(ConfigError):
        BrokerConfig(default_queue_nums=0).validate()
    with pytest.raises(ConfigError):
        BrokerConfig(transaction_check_max=-1).validate()


def test_retry_ladder_levels() -> None:
    # reconsume 0 -> level 3, climbing one level per retry, clamped at the top
    assert [retry_level(0, r, 18) for r in range(0, 18)] == [min(3 + r, 18) for r in range(18)]
    assert retry_level(5, 0, 18) == 5  # an explicit level wins
    assert retry_level(0, 0, 2) == 2  # short tables clamp
