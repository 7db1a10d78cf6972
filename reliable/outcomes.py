"""Typed handler outcomes: control flow, not failure (never logged as errors).

A handler returns normally for success and raises anything else for "retry later". These two
exceptions say more:

- `RetryLater(delay_level=5)`: retry, and not sooner than that delay level.
- `Discard("order cancelled")`: the message is done; retrying cannot help (a business condition
  such as a cancelled order). It is acknowledged, confirmed, and never retried.
"""

from __future__ import annotations


class Outcome(Exception):  # control flow, not an error
    """Root of the control-flow outcomes a handler may raise."""


class RetryLater(Outcome):
    """Ask for redelivery, optionally at a specific delay level (1..18)."""

    def __init__(self, reason: str = "", *, delay_level: int | None = None) -> None:
        if delay_level is not None and not 1 <= delay_level <= 18:
            raise ValueError(f"delay_level must be within 1..18, got {delay_level}")
        self.reason = reason
        self.delay_level = delay_level
        super().__init__(reason or "retry later")


class Discard(Outcome):
    """The message is finished without success; never retry it."""

    def __init__(self, reason: str = "") -> None:
        self.reason = reason
        super().__init__(reason or "discarded")
