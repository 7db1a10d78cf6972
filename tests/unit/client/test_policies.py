"""Retry and backoff policies, latency fault tolerance and the token bucket, on injected time."""

from __future__ import annotations

import random

import pytest

from reliable.errors import BadRequest, BrokerBusy, TransportError
from reliable.latency import LatencyFaultTolerance, not_available_duration_ms
from reliable.ratelimit import TokenBucket
from reliable.retry import Backoff, SendPolicy, call_with_policy


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
    policy = SendPolicy(retry_times=2, sleep=slept.append)
    calls: list[int] = []

    def send(i: int) -> None:
        calls.append(i)
        raise TransportError("connection reset")

    with pytest.raises(TransportError):
        call_with_policy(policy, send)
    assert calls == [0, 1, 2]  # 1 + retry_times attempts
    assert all(s == 0 for s in slept)


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
