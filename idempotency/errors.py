"""The idempotency package's exceptions: one root, narrow subclasses with the data to act."""

from __future__ import annotations

from datetime import timedelta


class IdempotencyError(Exception):
    """Root of every error raised by the idempotency package."""


class DedupWindowTooShort(IdempotencyError):
    """A dedup window (Redis TTL or DB retention) is shorter than the retry horizon."""

    def __init__(self, setting: str, configured: timedelta, required: timedelta) -> None:
        self.setting = setting
        self.configured = configured
        self.required = required
        super().__init__(
            f"{setting} of {configured} is shorter than the retry horizon {required} "
            "(16 retries plus DLQ replay): a late redelivery would run the handler again; "
            "raise it, or pass allow_short_window=True if you accept that"
        )


class InvalidGuardConfig(IdempotencyError):
    """A guard setting is out of range (non-positive lease, empty key prefix, ...)."""

    def __init__(self, setting: str, value: object, rule: str) -> None:
        self.setting = setting
        self.value = value
        self.rule = rule
        super().__init__(f"{setting} {rule}" + (f", got {value}" if value != "" else ""))


class BodyMismatch(IdempotencyError):
    """The same message id arrived with a different body than the one already known."""

    def __init__(
        self, message_id: str, group: str, known_digest: str, got_digest: str, source: str
    ) -> None:
        self.message_id = message_id
        self.group = group
        self.known_digest = known_digest
        self.got_digest = got_digest
        self.source = source  # "confirmation" or "stub"
        super().__init__(
            f"message {message_id!r} for group {group!r} arrived with body digest "
            f"{got_digest[:12]}..., but the {source} has {known_digest[:12]}...: "
            "a reused id or a corrupted message; not processed"
        )


class NotADeadLetter(IdempotencyError):
    """`mark_dead_lettered` got a message that is not from `%DLQ%<group>` of the group."""

    def __init__(self, topic: str, group: str | None) -> None:
        self.topic = topic
        self.group = group
        super().__init__(
            f"a message from {topic!r} is not a dead letter"
            + (f" of group {group!r}" if group else "; name its group explicitly")
        )
