"""Idempotent consumption: Redis SET NX leases backed by the database."""

from idempotency.config import (
    DLQ_REPLAY,
    RETRY_HORIZON,
    GuardConfig,
    MismatchPolicy,
)
from idempotency.errors import (
    BodyMismatch,
    DedupWindowTooShort,
    IdempotencyError,
    InvalidGuardConfig,
    NotADeadLetter,
)
from idempotency.guard import (
    EventKind,
    GuardEvent,
    GuardStats,
    IdempotencyGuard,
    dead_letter_origin,
)
from idempotency.leases import RedisLike

__all__ = [  # noqa: RUF022 - grouped by concept
    # the guard
    "IdempotencyGuard",
    "GuardConfig",
    "MismatchPolicy",
    "RedisLike",
    "DLQ_REPLAY",
    "dead_letter_origin",
    "RETRY_HORIZON",
    # what it reports
    "EventKind",
    "GuardEvent",
    "GuardStats",
    # errors
    "BodyMismatch",
    "DedupWindowTooShort",
    "IdempotencyError",
    "InvalidGuardConfig",
    "NotADeadLetter",
]
