"""The disk-watermark flags shared by `reliable broker start` and `reliable consume`."""

from __future__ import annotations

import argparse

import pytest

from broker.store.config import StoreConfig
from reliable_cli.store_options import add_disk_arguments, disk_options


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_disk_arguments(parser)
    return parser.parse_args(argv)


def test_no_flag_keeps_the_shipped_watermarks() -> None:
    assert disk_options(parse()) == {}
    shipped = StoreConfig()
    assert (
        shipped.disk_max_used_space_ratio,
        shipped.disk_clean_watermark,
        shipped.disk_refuse_watermark,
    ) == (0.75, 0.85, 0.90)


def test_full_ratio_alone_keeps_the_lower_watermarks_below_it() -> None:
    assert disk_options(parse("--disk-full-ratio", "0.97")) == {
        "disk_max_used_space_ratio": 0.75,
        "disk_clean_watermark": 0.85,
        "disk_refuse_watermark": 0.97,
    }
    assert disk_options(parse("--disk-full-ratio", "0.8")) == {
        "disk_max_used_space_ratio": 0.75,
        "disk_clean_watermark": 0.8,
        "disk_refuse_watermark": 0.8,
    }
    assert disk_options(parse("--disk-full-ratio", "0.5")) == {
        "disk_max_used_space_ratio": 0.5,
        "disk_clean_watermark": 0.5,
        "disk_refuse_watermark": 0.5,
    }


def test_both_at_one_switch_the_watermarks_off() -> None:
    options = disk_options(parse("--disk-clean-ratio", "1", "--disk-full-ratio", "1"))
    assert options == {
        "disk_max_used_space_ratio": 0.75,
        "disk_clean_watermark": 1.0,
        "disk_refuse_watermark": 1.0,
    }
    StoreConfig(**options)  # a valid store configuration


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (("--disk-full-ratio", "0"), "--disk-full-ratio must be in (0, 1]"),
        (("--disk-full-ratio", "1.01"), "--disk-full-ratio must be in (0, 1]"),
        (("--disk-clean-ratio", "-0.2"), "--disk-clean-ratio must be in (0, 1]"),
        (("--disk-clean-ratio", "0.95"), "must not exceed --disk-full-ratio"),
        (("--disk-clean-ratio", "0.9", "--disk-full-ratio", "0.8"), "must not exceed"),
    ],
)
def test_bad_ratios_are_refused(argv: tuple[str, ...], error: str) -> None:
    with pytest.raises(
        ValueError, match=error.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")
    ):
        disk_options(parse(*argv))
