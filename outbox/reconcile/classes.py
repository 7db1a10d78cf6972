"""What the job says about each stub and each consumption-log row.

A stub gets exactly one class, the first that applies, in this order:

    VOID            status VOID: cancelled by an operator, never resent, never lost
    CONFIRMED       status CONFIRMED, or every expected group has a confirmation row
    DEAD_LETTERED   a group still missing it marked its log row dead-lettered (in %DLQ%<group>)
    EXHAUSTED       would be LOST, but max_sends is reached; or it was escalated (also a
                    send the broker refused for good): manual
    LOST            a missing group without a log row has passed the stub's offset; or
                    the copy's queue is unknown (gRPC) and the stub is older than the
                    group's expected latency; or it was never sent and is older than the
                    grace period: resend due. Also a stub a repair marked due, until it
                    is confirmed (unaccounted, but not marked again)
    IN_PROCESSING   a group still missing it holds a log row (a row left behind by a group
                    that confirmed does not count): a consumer is working on it
    BACKLOGGED      no missing group has reached its offset yet (or it awaits its first send)

A log row is ORPHAN (no stub with its id), STALE (its group confirmed the message, or the
stub is CONFIRMED: the row was left behind) or MATCHED.
"""

from __future__ import annotations

import enum


class StubClass(enum.Enum):
    """Verdict on one message stub."""

    CONFIRMED = "CONFIRMED"
    IN_PROCESSING = "IN_PROCESSING"
    LOST = "LOST"  # resend due
    BACKLOGGED = "BACKLOGGED"
    EXHAUSTED = "EXHAUSTED"  # max sends reached: manual handling
    DEAD_LETTERED = "DEAD_LETTERED"
    VOID = "VOID"


class LogClass(enum.Enum):
    """Verdict on one consumption-log row."""

    MATCHED = "MATCHED"
    ORPHAN = "ORPHAN"
    STALE = "STALE"


class RepairAction(enum.Enum):
    """What a repair changed (the audit table's `action`)."""

    MARK_RESEND_DUE = "MARK_RESEND_DUE"  # stub.next_resend_at := now
    CLOSE_STALE_LOG = "CLOSE_STALE_LOG"  # stale consumption-log row deleted


# Stub classes that are not accounted for: a clean window has none of these.
UNACCOUNTED: frozenset[StubClass] = frozenset({StubClass.LOST})

# Human labels, in report order.
STUB_LABELS: dict[StubClass, str] = {
    StubClass.CONFIRMED: "confirmed",
    StubClass.IN_PROCESSING: "in processing",
    StubClass.BACKLOGGED: "backlogged",
    StubClass.LOST: "lost (resend due)",
    StubClass.EXHAUSTED: "exhausted (manual)",
    StubClass.DEAD_LETTERED: "dead-lettered",
    StubClass.VOID: "void",
}
LOG_LABELS: dict[LogClass, str] = {
    LogClass.MATCHED: "matched",
    LogClass.ORPHAN: "orphan (no stub)",
    LogClass.STALE: "stale (confirmed, row left)",
}
