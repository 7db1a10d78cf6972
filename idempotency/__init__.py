"""Idempotent consumption: Redis SET NX leases backed by the database.

`guard_from_environment` builds the default guard of `@handler(idempotent=True)` (the
entry point `reliable.guards:default`).
"""

from idempotency.config import (
    DLQ_REPLAY,
    RETRY_HORIZON,
    GuardConfig,
    MismatchPolicy,
)
from idempotency.environment import guard_from_environment
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
    "guard_from_environment",
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
