"""Retry policies as values (tenacity): the producer's send retries and flow-control backoff.

- Send retries: `1 + retry_times` attempts, no wait, each on another queue, only for failures
  that mean "try elsewhere" (transport errors, system error/busy, no permission, topic missing,
  service unavailable) and for a sync-master's "stored, not replicated" answers
  (`FailureKind.NOT_REPLICATED`: a failover under way; the resend carries the same message
  id, which the server de-duplicates). Bad requests are never retried.
- Failover patience: when those immediate retries are spent on failures a failover causes
  (`is_failover_like`: the broker unreachable, not replicated, a slave or a server refusing,
  a topic that had writable queues and has none for the moment; not a full disk), the send
  goes on with a short backoff (0.1 s, x2, capped at 1 s) until `FailoverPatience.window_s`
  (10 s) has passed since its first failure: long enough for an automatic promotion (about
  2.5 s) and the route to name the new master. A missing topic or group is not waited for.
- Flow control (the broker is busy): exponential backoff, initial 1 s, x1.6, jitter +-0.2,
  capped at 120 s, with its own attempt budget.

Time is injected: tests pass a recording `sleep` and a seeded `random.Random`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import tenacity
from tenacity import RetryCallState
from tenacity.wait import wait_base

from reliable.errors import BrokerCallError, BrokerUnavailable, FailureKind, NoRoute

R = TypeVar("R")

Sleep = Callable[[float], None]
Clock = Callable[[], float]

# refusals that waiting cannot change: the resource is not there (a failover does not
# remove topics or groups); every other "try elsewhere" answer may be a failover's
_MISSING = frozenset({"NOT_FOUND", "TOPIC_NOT_FOUND", "CONSUMER_GROUP_NOT_FOUND"})


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
        if retry_number > 64 and self.multiplier > 1:  # long past the cap: no float overflow
            return self.maximum_s
        return min(self.initial_s * self.multiplier ** (retry_number - 1), self.maximum_s)

    def delay(self, retry_number: int, rng: random.Random) -> float:
        base = self.base_delay(retry_number)
        return base * (1 + rng.uniform(-self.jitter, self.jitter))


class _wait_budget(wait_base):  # tenacity naming style
    """tenacity wait strategy: the wait the send's `_Budget` chose for its last failure."""

    def __init__(self, budget: _Budget) -> None:
        self.budget = budget

    def __call__(self, retry_state: RetryCallState) -> float:
        return self.budget.wait_s


def is_flow_control(exc: BaseException) -> bool:
    return isinstance(exc, BrokerCallError) and exc.kind is FailureKind.FLOW_CONTROL


def is_try_elsewhere(exc: BaseException, *, not_stored_ok: bool = False) -> bool:
    if not isinstance(exc, BrokerCallError):
        return False
    kinds = {FailureKind.TRANSPORT, FailureKind.TRY_ELSEWHERE, FailureKind.NOT_REPLICATED}
    if not_stored_ok:
        kinds.add(FailureKind.NOT_STORED_OK)
    return exc.kind in kinds


def is_failover_like(exc: BaseException) -> bool:
    """A failure a failover causes, worth waiting out: no answer, not replicated, a refusal
    by a slave or a server in trouble, or a topic whose writable queues went away for the
    moment (`NoRoute.transitional`). A missing topic or group is not one, nor a full disk
    (it fails fast and names the disk: an operator's matter, docs/operations.md)."""
    if isinstance(exc, NoRoute):
        return exc.transitional
    if not isinstance(exc, BrokerCallError):
        return False
    if isinstance(exc, BrokerUnavailable) and exc.disk_full:
        return False
    if exc.kind in (FailureKind.TRANSPORT, FailureKind.NOT_REPLICATED):
        return True
    return exc.kind is FailureKind.TRY_ELSEWHERE and exc.code not in _MISSING


@dataclass(frozen=True)
class FailoverPatience:
    """How long a send waits out a failover once its immediate retries are spent: retried
    after `backoff`'s waits until `window_s` has passed since its first failure (0: never)."""

    window_s: float = 10.0
    backoff: Backoff = field(
        default_factory=lambda: Backoff(initial_s=0.1, multiplier=2.0, jitter=0.2, maximum_s=1.0)
    )

    def __post_init__(self) -> None:
        if self.window_s < 0:
            raise ValueError(f"window_s must be >= 0, got {self.window_s}")

    def wait(self, failed_at: float, now: float, retry_number: int, rng: random.Random) -> float:
        """The wait before patient retry `retry_number` (1-based), or -1 when the window is
        over: never past the window's end, so the last retry comes at its close."""
        left = failed_at + self.window_s - now
        if left <= 0:
            return -1.0
        return min(self.backoff.delay(retry_number, rng), left)


@dataclass
class _Budget:
    """One send's budgets: immediate retries elsewhere, flow-control retries, and failover
    patience; `wait_s` is the wait before the retry it last allowed."""

    policy: SendPolicy
    failed_at: float
    elsewhere: int = 0
    busy: int = 0
    patient: int = 0
    wait_s: float = 0.0

    def retriable(self, exc: BaseException) -> bool:
        policy = self.policy
        if is_flow_control(exc):
            self.busy += 1
            self.wait_s = policy.backoff.delay(self.busy, policy.rng)
            return self.busy <= policy.flow_control_retries
        self.wait_s = 0.0
        if is_try_elsewhere(exc, not_stored_ok=policy.retry_not_stored_ok):
            self.elsewhere += 1
            if self.elsewhere <= policy.retry_times:
                return True
        if not is_failover_like(exc):
            return False
        self.patient += 1
        wait = policy.patience.wait(self.failed_at, policy.clock(), self.patient, policy.rng)
        if wait < 0:
            return False
        self.wait_s = wait
        return True


@dataclass
class SendPolicy:
    """How many times, and how patiently, the producer retries one send."""

    retry_times: int = 2
    flow_control_retries: int = 5
    backoff: Backoff = field(default_factory=Backoff)
    retry_not_stored_ok: bool = False  # retry_another_broker_when_not_store_ok
    sleep: Sleep = time.sleep
    rng: random.Random = field(default_factory=random.Random)
    patience: FailoverPatience = field(default_factory=FailoverPatience)
    clock: Clock = time.monotonic

    def __post_init__(self) -> None:
        if self.retry_times < 0 or self.flow_control_retries < 0:
            raise ValueError("retry counts must be >= 0")

    def retrying(self) -> tenacity.Retrying:
        """A fresh `tenacity.Retrying` for one send (budgets are per send)."""
        budget = _Budget(self, failed_at=self.clock())
        return tenacity.Retrying(
            retry=tenacity.retry_if_exception(budget.retriable),
            wait=_wait_budget(budget),
            stop=tenacity.stop_never,  # the budget in `retry` decides
            sleep=self.sleep,
            reraise=True,
        )


def call_with_policy(policy: SendPolicy, fn: Callable[[int], R]) -> R:
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
