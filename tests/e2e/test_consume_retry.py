"""Retries, dead letters and orderly consumption through the public API."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import defaultdict

import pytest

from reliable import (
    Message,
    Producer,
    ReceivedMessage,
    RetryLater,
    Transport,
    Worker,
    dlq_handler,
    handler,
)
from tests.e2e.helpers import FAST, LEVEL_MS, stays, wait_until


@pytest.mark.parametrize("engine", ["pull", "receive"])
def test_fails_three_times_then_succeeds_with_growing_delays(
    transport: Transport, engine: str
) -> None:
    deliveries: list[tuple[int, float, str]] = []

    @handler("ladder", group="ladder-g", receive_long_poll_ms=50, **FAST)
    def flaky(message: ReceivedMessage) -> None:
        deliveries.append((message.reconsume_times, time.monotonic(), message.message_id))
        if len(deliveries) <= 3:
            raise RuntimeError("not yet")

    with (
        Worker(flaky, transport=transport, consumer_options={"engine": engine}),
        Producer(transport) as producer,
    ):
        receipt = producer.send(Message("ladder", b"pay order 42"))
        wait_until(lambda: len(deliveries) >= 4, what="4 deliveries")
        assert stays(lambda: len(deliveries) == 4, 1.5), "delivered again after success"

    assert [d[0] for d in deliveries] == [0, 1, 2, 3]
    assert {d[2] for d in deliveries} == {receipt.message_id}  # same id on every attempt
    gaps_ms = [(b[1] - a[1]) * 1000 for a, b in itertools.pairwise(deliveries)]
    # retry k waits at level 3 + (k - 1): 300, 500, 800 ms with the test table
    expected = [LEVEL_MS[2], LEVEL_MS[3], LEVEL_MS[4]]
    for gap, at_least in zip(gaps_ms, expected, strict=True):
        assert gap >= at_least - 5, (gaps_ms, expected)


def test_retry_later_asks_for_a_level(transport: Transport) -> None:
    deliveries: list[float] = []

    @handler("level", group="level-g", **FAST)
    def wants_level_6(message: ReceivedMessage) -> None:
        deliveries.append(time.monotonic())
        if len(deliveries) == 1:
            raise RetryLater("stock not reserved yet", delay_level=6)

    with Worker(wants_level_6, transport=transport), Producer(transport) as producer:
        producer.send(Message("level", b"x"))
        wait_until(lambda: len(deliveries) == 2, what="the retry")
    assert (deliveries[1] - deliveries[0]) * 1000 >= LEVEL_MS[5] - 5


@pytest.mark.parametrize("engine", ["pull", "receive"])
def test_always_failing_goes_to_dlq_after_exactly_max_retries(
    transport: Transport, engine: str
) -> None:
    attempts: list[int] = []
    dead: list[ReceivedMessage] = []

    @handler("doomed", group="doomed-g", max_reconsume_times=3, receive_long_poll_ms=50, **FAST)
    def never(message: ReceivedMessage) -> None:
        attempts.append(message.reconsume_times)
        raise ValueError("cannot parse")

    @dlq_handler("doomed-g", **FAST)
    def dead_letters(message: ReceivedMessage) -> None:
        dead.append(message)

    with (
        Worker(never, transport=transport, consumer_options={"engine": engine}),
        Worker(dead_letters, transport=transport),
        Producer(transport) as producer,
    ):
        receipt = producer.send(Message("doomed", b"poison", keys=["order-7"]))
        wait_until(lambda: len(dead) == 1, what="the dead letter")
        assert stays(lambda: len(attempts) == 4 and len(dead) == 1, 1.0)

    assert attempts == [0, 1, 2, 3]  # the first delivery and exactly 3 retries
    assert dead[0].message_id == receipt.message_id
    assert dead[0].topic == "%DLQ%doomed-g"
    assert dead[0].keys == ["order-7"] and dead[0].body == b"poison"


@pytest.mark.parametrize(
    "choice",
    [{"dead_letter_on": ValueError}, {"retry_on": ConnectionError, "dead_letter_other": True}],
)
def test_dead_letter_choice_skips_the_ladder_and_ignore_on_discards(
    transport: Transport, choice: dict[str, object]
) -> None:
    calls: defaultdict[bytes, int] = defaultdict(int)
    dead: list[bytes] = []

    @handler("filters", group="filters-g", ignore_on=LookupError, **choice, **FAST)
    def h(message: ReceivedMessage) -> None:
        calls[message.body] += 1
        if message.body == b"missing":
            raise KeyError("no such order")  # ignored: done
        if message.body == b"broken":
            raise ValueError("bad payload")  # not retriable: dead letter now

    @dlq_handler("filters-g", **FAST)
    def dlq(message: ReceivedMessage) -> None:
        dead.append(message.body)

    with Worker(h, dlq, transport=transport), Producer(transport) as producer:
        for body in (b"missing", b"broken", b"fine"):
            producer.send(Message("filters", body))
        wait_until(lambda: dead == [b"broken"] and calls[b"fine"] == 1, what="outcomes")
        assert stays(lambda: dict(calls) == {b"missing": 1, b"broken": 1, b"fine": 1}, 0.8)


@pytest.mark.parametrize(("engine", "batch"), [("pull", 1), ("pull", 4), ("receive", 1)])
def test_orderly_keeps_each_groups_order_under_failures(
    transport: Transport, seed: int, engine: str, batch: int
) -> None:
    rng = random.Random(seed)
    lock = threading.Lock()
    done: defaultdict[str, list[int]] = defaultdict(list)
    fail_once = {(g, i) for g in "ABCD" for i in range(25) if rng.random() < 0.2}
    failed: set[tuple[str, int]] = set()

    @handler(
        "fifo",
        group="fifo-g",
        orderly=True,
        consume_batch_size=batch,
        receive_long_poll_ms=50,
        **FAST,
    )
    def step(message: ReceivedMessage) -> None:
        key = (message.message_group or "", int(message.body))
        with lock:
            if key in fail_once and key not in failed:
                failed.add(key)
                raise RuntimeError("transient")
            done[key[0]].append(key[1])

    with (
        Worker(step, transport=transport, consumer_options={"engine": engine}),
        Producer(transport) as producer,
    ):
        for i in range(25):
            for g in "ABCD":
                producer.send(Message("fifo", str(i).encode(), message_group=g))
        wait_until(lambda: sum(len(v) for v in done.values()) == 100, what="100 messages")

    assert failed == fail_once
    for g in "ABCD":
        assert done[g] == list(range(25)), (g, done[g])


def test_orderly_parks_only_the_poisoned_group(transport: Transport) -> None:
    done: defaultdict[str, list[int]] = defaultdict(list)
    parked: list[tuple[str, int]] = []

    @handler("fifo-poison", group="fifo-p", orderly=True, max_reconsume_times=2, **FAST)
    def step(message: ReceivedMessage) -> None:
        if message.message_group == "B" and message.body == b"3":
            raise RuntimeError("poison")
        done[message.message_group or ""].append(int(message.body))

    @dlq_handler("fifo-p", **FAST)
    def dlq(message: ReceivedMessage) -> None:
        parked.append((message.message_group or "", int(message.body)))

    with Worker(step, dlq, transport=transport), Producer(transport) as producer:
        for i in range(8):
            for g in "AB":
                producer.send(Message("fifo-poison", str(i).encode(), message_group=g))
        wait_until(lambda: len(done["A"]) == 8 and len(parked) == 5, what="parking")

    assert done["A"] == list(range(8))
    assert done["B"] == [0, 1, 2]  # nothing of B after its poison message
    assert sorted(parked) == [("B", i) for i in range(3, 8)]
