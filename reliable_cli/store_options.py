"""Command-line options of an embedded or served store that more than one command takes."""

from __future__ import annotations

import argparse
from typing import Any


def add_disk_arguments(parser: argparse.ArgumentParser) -> None:
    """`--disk-clean-ratio` and `--disk-full-ratio`: the store's disk watermarks."""
    parser.add_argument(
        "--disk-clean-ratio",
        type=float,
        default=None,
        metavar="RATIO",
        help="disk use above which the oldest files are deleted regardless of age (default 0.85)",
    )
    parser.add_argument(
        "--disk-full-ratio",
        type=float,
        default=None,
        metavar="RATIO",
        help="disk use above which puts are refused with DISK_FULL "
        "(default 0.90; 1.0 never refuses)",
    )


def disk_options(args: argparse.Namespace) -> dict[str, Any]:
    """StoreConfig keywords for the disk flags given; raises ValueError on a bad combination.

    A raised watermark lifts the lower ones with it (the "cleanup may start" ratio never
    exceeds the clean one, which never exceeds the full one), so one flag is enough."""
    from broker.store.config import StoreConfig

    clean, full = args.disk_clean_ratio, args.disk_full_ratio
    for flag, value in (("--disk-clean-ratio", clean), ("--disk-full-ratio", full)):
        if value is not None and not 0 < value <= 1:
            raise ValueError(f"{flag} must be in (0, 1], got {value}")
    if clean is None and full is None:
        return {}
    shipped = StoreConfig()
    full = shipped.disk_refuse_watermark if full is None else full
    clean = min(shipped.disk_clean_watermark, full) if clean is None else clean
    if clean > full:
        raise ValueError("--disk-clean-ratio must not exceed --disk-full-ratio")
    return {
        "disk_max_used_space_ratio": min(shipped.disk_max_used_space_ratio, clean),
        "disk_clean_watermark": clean,
        "disk_refuse_watermark": full,
    }
