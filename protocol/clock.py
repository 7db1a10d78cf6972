"""Wall-clock time in the units the store and the protocol use."""

from __future__ import annotations

import time


def wall_ms() -> int:
    """Milliseconds since the Unix epoch (the store's timestamps, the index's time keys)."""
    return time.time_ns() // 1_000_000
