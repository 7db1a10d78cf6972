"""Retry policies as values (tenacity): the producer's send retries and flow-control backoff.

- Send retries: `1 + retry_times` attempts, no wait, each on another queue, only for failures
  that mean "try elsewhere" (transport errors, system error/busy, no permission, topic missing,
  service unavailable) and for a sync-master's "stored, not replicated" answers
  (`FailureKind.NOT_REPLICATED`: a failover under way; the resend carries the same message
  id, which the server de-duplicates). Bad requests are never retried.
- Flow control (the broker is busy): exponential backoff, initial 1 s, x1.6, jitter +-0.2,
  capped at 120 s, with its own attempt budget.

Time is injected: tests pass a recording `sleep` and a seeded `random.Random`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import tenacity
from tenacity import RetryCallState
from tenacity.wait import wait_base

from reliable.errors import BrokerCallError, FailureKind

Sleep = Callable[[float], None]


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff: `initial * multiplier**n`, capped at `maximum`, then +-`jitter`."""

    initial_s: float = 1.0
    multiplier: float = 1.6
    jitter: float = 0.2
    maximum_s: float = 120.0

    def __post_init__(self) -> None:
        if self.initial_s <= 0 or self.multiplier < 1 or not 0 <= self.jitter < 1:
            raise ValueError(f"invalid backoff {self}")
        if self.maximum_s < self.initial_s:
            raise ValueError("maximum_s must be >= initial_s")

    def base_delay(self, retry_number: int) -> float:
        """Delay before retry `retry_number` (1-based), without jitter."""
        return min(self.initial_s * self.multiplier ** (retry_number - 1), self.maximum_s)

    def delay(self, retry_number: int, rng: random.Random) -> float:
        base = self.base_delay(retry_number)
        return base * (1 + rng.uniform(-self.jitter, self.jitter))


class wait_backoff(wait_base):  # tenacity naming style
    """tenacity wait strategy for a `Backoff`, counting only the attempts `counts` accepts."""

    def __init__(
        self,
        backoff: Backoff,
        rng: random.Random,
        counts: Callable[[BaseException], bool] = lambda e: True,
    ) -> None:
        self.backoff = backoff
        self.rng = rng
        self.counts = counts
        self.retries = 0

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        if exc is None or not self.counts(exc):
            return 0.0
        self.retries += 1
        return self.backoff.delay(self.retries, self.rng)


def is_flow_control(exc: BaseException) -> bool:
    return isinstance(exc, BrokerCallError) and exc.kind is FailureKind.FLOW_CONTROL


def is_try_elsewhere(exc: BaseException, *, not_stored_ok: bool = False) -> bool:
    if not isinstance(exc, BrokerCallError):
        return False
    kinds = {FailureKind.TRANSPORT, FailureKind.TRY_ELSEWHERE, FailureKind.NOT_REPLICATED}
    if not_stored_ok:
        kinds.add(FailureKind.NOT_STORED_OK)
    return exc.kind in kinds


@dataclass
class _Budget:
    """Two attempt budgets: immediate retries elsewhere, and flow-control retries."""

    retry_times: int
    flow_control_retries: int
    not_stored_ok: bool
    elsewhere: int = 0
    busy: int = 0

    def retriable(self, exc: BaseException) -> bool:
        if is_flow_control(exc):
            self.busy += 1
            return self.busy <= self.flow_control_retries
        if is_try_elsewhere(exc, not_stored_ok=self.not_stored_ok):
            self.elsewhere += 1
            return self.elsewhere <= self.retry_times
        return False


@dataclass
class SendPolicy:
    """How many times, and how patiently, the producer retries one send."""

    retry_times: int = 2
    flow_control_retries: int = 5
    backoff: Backoff = field(default_factory=Backoff)
    retry_not_stored_ok: bool = False  # retry_another_broker_when_not_store_ok
    sleep: Sleep = time.sleep
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if self.retry_times < 0 or self.flow_control_retries < 0:
            raise ValueError("retry counts must be >= 0")

    def retrying(self) -> tenacity.Retrying:
        """A fresh `tenacity.Retrying` for one send (budgets are per send)."""
        budget = _Budget(self.retry_times, self.flow_control_retries, self.retry_not_stored_ok)
        return tenacity.Retrying(
            retry=tenacity.retry_if_exception(budget.retriable),
            wait=wait_backoff(self.backoff, self.rng, is_flow_control),
            stop=tenacity.stop_never,  # the budget in `retry` decides
            sleep=self.sleep,
            reraise=True,
        )


def call_with_policy(policy: SendPolicy, fn: Callable[[int], Any]) -> Any:
    """Run `fn(attempt_index)` under `policy`; the last error propagates.

    The first attempt runs before any retry machinery is built: most sends succeed at
    once, and building tenacity's state costs a sizeable part of a send. When it fails,
    tenacity takes over with that failure as its own first attempt (the same budget,
    waits and errors as if it had run it)."""
    try:
        return fn(0)
    except Exception as exc:
        first: Exception = exc
    for attempt in policy.retrying():
        with attempt:
            index = attempt.retry_state.attempt_number - 1
            if index == 0:
                raise first
            return fn(index)
    raise AssertionError("unreachable")  # pragma: no cover
