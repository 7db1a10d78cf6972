"""Guard settings and the retry horizon they must outlive."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import timedelta

from broker.config import DEFAULT_DELAY_LEVELS, BrokerConfig, parse_delay_levels
from broker.sendback import retry_level
from idempotency.errors import DedupWindowTooShort, InvalidGuardConfig


def _retry_horizon(levels: str, retries: int) -> timedelta:
    """From the first delivery to the dead-letter queue: the sum of the delays of the
    `retries` retries on the broker's delay ladder (the broker's own rule for the level)."""
    ladder = parse_delay_levels(levels)
    return timedelta(
        milliseconds=sum(ladder[retry_level(0, r, len(ladder)) - 1] for r in range(retries))
    )


# The broker's defaults: 16 retries at levels 3..18 of its ladder, 4 h 45 min 40 s between
# the first delivery and the DLQ.
RETRY_HORIZON = _retry_horizon(DEFAULT_DELAY_LEVELS, BrokerConfig.default_retry_max_times)
# Dead letters stay replayable as long as the broker keeps the commitlog (72 h by default).
DLQ_REPLAY = timedelta(hours=72)


class MismatchPolicy(enum.Enum):
    """What to do when a known id arrives with another body (always reported as an event)."""

    REJECT = "reject"  # raise BodyMismatch: the consumer retries it, then dead-letters it
    ACKNOWLEDGE = "acknowledge"  # treat it as the duplicate it claims to be


@dataclass(frozen=True)
class GuardConfig:
    """Settings of an `IdempotencyGuard`.

    key_prefix: prefix of every Redis key (see `idempotency.leases` for the schema).
    lease: how long a worker holds a message (Redis PX and the DB lease); must exceed the
        handler's run time, else another worker may take over (and fencing stops this one).
    ttl: how long Redis remembers a processed message (a fast path only).
    db_retention: how long confirmation rows are kept (None: until purged by the operator).
    dlq_replay: how long after the last retry a dead letter may still be replayed.
    allow_short_window: accept a ttl / db_retention shorter than the retry horizon.
    wait_for_result: in-progress elsewhere: wait up to this long for the other worker's
        result instead of returning RECONSUME_LATER at once (None: do not wait).
    poll_interval: how often to look while waiting.
    on_body_mismatch: see `MismatchPolicy`.
    renew_lease: while the handler runs, extend both leases every lease/3, so a slow
        handler is not taken over (a stalled process stops renewing and is fenced).
    """

    key_prefix: str = "reliable:idem:"
    lease: timedelta = timedelta(seconds=60)
    ttl: timedelta = timedelta(days=4)
    db_retention: timedelta | None = None
    dlq_replay: timedelta = DLQ_REPLAY
    allow_short_window: bool = False
    wait_for_result: timedelta | None = None
    poll_interval: timedelta = timedelta(milliseconds=100)
    on_body_mismatch: MismatchPolicy = MismatchPolicy.REJECT
    renew_lease: bool = True

    @property
    def horizon(self) -> timedelta:
        """The window a redelivery may arrive in: 16 retries plus the DLQ replay window."""
        return RETRY_HORIZON + self.dlq_replay

    def validate(self) -> GuardConfig:
        """Refuse settings that would let a late redelivery run a handler twice."""
        if not self.key_prefix:
            raise InvalidGuardConfig("key_prefix", self.key_prefix, "must not be empty")
        if self.lease <= timedelta(0):
            raise InvalidGuardConfig("lease", self.lease, "must be positive")
        if self.poll_interval <= timedelta(0):
            raise InvalidGuardConfig("poll_interval", self.poll_interval, "must be positive")
        if not self.allow_short_window:
            if self.ttl < self.horizon:
                raise DedupWindowTooShort("Redis ttl", self.ttl, self.horizon)
            if self.db_retention is not None and self.db_retention < self.horizon:
                raise DedupWindowTooShort("db_retention", self.db_retention, self.horizon)
        return self
