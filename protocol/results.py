"""Values both ends of a pull share.

`PullStatus` is what a pull found: the broker's answer (`broker.results`) and the client's
transports (`reliable.transport.base`) use this one enum as it is.
"""

from __future__ import annotations

import enum


class PullStatus(enum.Enum):
    """What a pull found: the one enum for it (the client's transports use it as it is)."""

    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"  # units read, none passed the tag filter: advance
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"  # below min or past max: continue at next_begin_offset
