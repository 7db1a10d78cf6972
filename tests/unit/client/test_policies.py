"""Retry and backoff policies, latency fault tolerance and the token bucket, on injected time."""

from __future__ import annotations

import random

import pytest

from reliable.errors import (
    BadRequest,
    BrokerBusy,
    BrokerCallError,
    FailureKind,
    NoRoute,
    TransportError,
)
from reliable.latency import LatencyFaultTolerance, not_available_duration_ms
from reliable.ratelimit import TokenBucket
from reliable.retry import Backoff, FailoverPatience, SendPolicy, call_with_policy


def test_backoff_curve_is_1s_times_1_6_capped_at_120s() -> None:
    b = Backoff()
    assert [round(b.base_delay(n), 4) for n in range(1, 6)] == [1.0, 1.6, 2.56, 4.096, 6.5536]
    assert b.base_delay(30) == 120.0


def test_backoff_jitter_stays_within_20_percent() -> None:
    b = Backoff()
    rng = random.Random(7)
    for n in range(1, 20):
        d = b.delay(n, rng)
        assert 0.8 * b.base_delay(n) <= d <= 1.2 * b.base_delay(n)


def test_flow_control_retries_sleep_along_the_curve_then_succeed() -> None:
    slept: list[float] = []
    policy = SendPolicy(
        retry_times=2, flow_control_retries=5, sleep=slept.append, rng=random.Random(3)
    )
    calls: list[int] = []

    def send(i: int) -> str:
        calls.append(i)
        if len(calls) <= 4:
            raise BrokerBusy("busy")
        return "ok"

    assert call_with_policy(policy, send) == "ok"
    assert len(calls) == 5
    expected = [1.0, 1.6, 2.56, 4.096]
    assert len(slept) == 4
    for got, base in zip(slept, expected, strict=True):
        assert base * 0.8 <= got <= base * 1.2


def test_flow_control_gives_up_after_its_budget() -> None:
    slept: list[float] = []
    policy = SendPolicy(flow_control_retries=3, sleep=slept.append)
    calls = []

    def send(i: int) -> None:
        calls.append(i)
        raise BrokerBusy("busy")

    with pytest.raises(BrokerBusy):
        call_with_policy(policy, send)
    assert len(calls) == 4 and len(slept) == 3


def test_transport_errors_retry_immediately_retry_times_then_fail() -> None:
    slept: list[float] = []
    policy = SendPolicy(retry_times=2, sleep=slept.append, patience=FailoverPatience(0))
    calls: list[int] = []

    def send(i: int) -> None:
        calls.append(i)
        raise TransportError("connection reset")

    with pytest.raises(TransportError):
        call_with_policy(policy, send)
    assert calls == [0, 1, 2]  # 1 + retry_times attempts
    assert all(s == 0 for s in slept)


class _Clock:
    """Virtual time: `sleep` advances it, each call costs `call_s`."""

    def __init__(self, call_s: float = 0.0) -> None:
        self.now = 100.0
        self.call_s = call_s
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_a_failover_is_waited_out_after_the_immediate_retries() -> None:
    clock = _Clock()
    policy = SendPolicy(retry_times=2, sleep=clock.sleep, clock=clock, rng=random.Random(1))
    calls: list[int] = []
    # the master is gone (no answer), then its slave refuses until promoted 2.5 s later
    promoted_at = clock.now + 2.5

    def send(i: int) -> str:
        calls.append(i)
        if i == 0:
            raise TransportError("connection refused")
        if clock.now < promoted_at:
            raise BrokerCallError(FailureKind.TRY_ELSEWHERE, "a slave", code="FORBIDDEN")
        return "stored on the new master"

    assert call_with_policy(policy, send) == "stored on the new master"
    assert clock.slept[:2] == [0.0, 0.0]  # the immediate retries first
    patient = clock.slept[2:]
    assert all(0 < s <= 1.2 for s in patient)  # 0.1 s doubling, capped at 1 s (+-20%)
    assert patient[0] == pytest.approx(0.1, rel=0.2) and patient[1] == pytest.approx(0.2, rel=0.2)
    assert promoted_at <= clock.now < promoted_at + 1.2  # the first retry after the promotion


def test_patience_ends_with_its_window_and_reports_the_last_failure() -> None:
    clock = _Clock(call_s=0.0)
    policy = SendPolicy(
        retry_times=2, sleep=clock.sleep, clock=clock, patience=FailoverPatience(window_s=4.0)
    )
    started = clock.now
    calls: list[float] = []

    def send(i: int) -> None:
        calls.append(clock.now)
        raise TransportError(f"refused #{i}")

    with pytest.raises(TransportError, match="refused"):
        call_with_policy(policy, send)
    assert clock.now == pytest.approx(started + 4.0)  # the last wait ends at the window's close
    assert calls[-1] == pytest.approx(started + 4.0)
    assert 8 <= len(calls) <= 12


@pytest.mark.parametrize(
    "error",
    [
        BrokerCallError(FailureKind.TRY_ELSEWHERE, "no such topic", code="TOPIC_NOT_FOUND"),
        BrokerCallError(FailureKind.NOT_STORED_OK, "flush timed out"),
        NoRoute("never-writable"),
    ],
    ids=["missing-topic", "not-flushed", "never-routed"],
)
def test_what_no_failover_explains_is_not_waited_for(error: Exception) -> None:
    clock = _Clock()
    policy = SendPolicy(retry_times=2, sleep=clock.sleep, clock=clock)

    def send(i: int) -> None:
        raise error

    with pytest.raises(type(error)):
        call_with_policy(policy, send)
    assert sum(clock.slept) == 0


def test_a_topic_seen_writable_then_without_route_is_waited_for() -> None:
    clock = _Clock()
    policy = SendPolicy(retry_times=0, sleep=clock.sleep, clock=clock)
    calls: list[int] = []

    def send(i: int) -> str:
        calls.append(i)
        if clock.now < 101.0:
            raise NoRoute("t", transitional=True)
        return "ok"

    assert call_with_policy(policy, send) == "ok"
    assert len(calls) >= 3 and sum(clock.slept) >= 1.0


def test_bad_requests_are_never_retried() -> None:
    calls: list[int] = []

    def send(i: int) -> None:
        calls.append(i)
        raise BadRequest("body too large")

    with pytest.raises(BadRequest):
        call_with_policy(SendPolicy(sleep=lambda s: None), send)
    assert calls == [0]


def test_latency_thresholds_map_to_avoidance_durations() -> None:
    assert [not_available_duration_ms(x) for x in (10, 60, 120, 600, 1500, 2500, 3500, 20000)] == [
        0,
        0,
        0,
        30_000,
        60_000,
        120_000,
        180_000,
        600_000,
    ]


def test_slow_or_failed_broker_is_avoided_until_its_penalty_ends() -> None:
    now = [0.0]
    lft = LatencyFaultTolerance(clock_ms=lambda: now[0])
    lft.update("a", 20)
    lft.update("b", 600)  # 30 s
    lft.update("c", 0, isolation=True)  # failed: 600 s
    assert lft.is_available("a") and not lft.is_available("b") and not lft.is_available("c")
    assert lft.pick_least_bad(["b", "c"]) == "b"
    now[0] = 30_000
    assert lft.is_available("b") and not lft.is_available("c")
    now[0] = 600_000
    assert lft.is_available("c")


def test_token_bucket_waits_instead_of_failing() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    bucket = TokenBucket(rate=10, burst=2, clock=lambda: now[0], sleep=sleep)
    waits = [bucket.acquire() for _ in range(6)]
    assert waits[:2] == [0.0, 0.0]  # the burst
    assert all(w == pytest.approx(0.1) for w in waits[2:])  # then 10 per second
    assert now[0] == pytest.approx(0.4)
    assert not bucket.try_acquire()
    now[0] += 0.1
    assert bucket.try_acquire()


def test_token_bucket_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate=0)
    with pytest.raises(ValueError):
        TokenBucket(rate=1, burst=2).acquire(3)
