"""Answers held while the server's loop is busy (`broker.server.answers`): the rules on a
virtual clock and a real event loop, the selector's `before_select` called by hand (the
server loop's own selector releasing them is tested in
tests/integration/broker/test_server_loop_dispatch.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from broker.server.answers import HeldAnswers, check_batch, check_linger_ms

WAITING = None  # the timeout of a select about to block
READY = 0.0  # the timeout of a select with calls ready


class Clock:
    """A virtual `perf_counter_ns` that moves only when told."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def busy(answers: HeldAnswers) -> None:
    """The loop turns with calls ready: it has not waited since the last answer."""
    answers.before_select(READY)


def test_an_answer_made_after_the_loop_waited_leaves_at_once(
    loop: asyncio.AbstractEventLoop,
) -> None:
    answers = HeldAnswers(batch=4, linger_ms=5)
    answers.install()

    async def main() -> None:
        for _ in range(3):  # one call at a time: the loop waits between them
            assert answers.hold() is None
            answers.before_select(WAITING)
        assert answers.held_total == 0

    loop.run_until_complete(main())


def test_answers_made_while_the_loop_is_busy_wait_for_a_full_batch(
    loop: asyncio.AbstractEventLoop,
) -> None:
    answers = HeldAnswers(batch=4, linger_ms=5)
    answers.install()

    async def main() -> None:
        answers.before_select(WAITING)
        assert answers.hold() is None  # the first of the burst: the loop was idle
        held = []
        for _ in range(3):
            busy(answers)
            future = answers.hold()
            assert future is not None and not future.done()
            held.append(future)
        assert answers.held == 3 and answers.rounds == 0
        busy(answers)
        fourth = answers.hold()  # the batch is full: all four go
        assert fourth is not None
        assert all(f.done() for f in [*held, fourth])
        assert answers.held == 0 and answers.rounds == 1 and answers.held_total == 4

    loop.run_until_complete(main())


def test_held_answers_leave_when_the_loop_is_about_to_wait(
    loop: asyncio.AbstractEventLoop,
) -> None:
    answers = HeldAnswers(batch=64, linger_ms=5)
    answers.install()

    async def main() -> None:
        assert answers.hold() is None
        busy(answers)
        first, second = answers.hold(), answers.hold()
        assert first is not None and second is not None
        assert answers.before_select(READY) is False  # calls still ready: kept
        assert not first.done()
        assert answers.before_select(WAITING) is True  # nothing more: out, no blocking
        assert first.done() and second.done()
        assert answers.before_select(WAITING) is False  # nothing held
        assert answers.hold() is None  # the loop waited: the next one leaves at once

    loop.run_until_complete(main())


def test_a_loop_that_never_waits_lets_no_answer_wait_past_the_linger(
    loop: asyncio.AbstractEventLoop,
) -> None:
    clock = Clock()
    answers = HeldAnswers(batch=64, linger_ms=2, clock=clock)
    answers.install()

    async def main() -> None:
        assert answers.hold() is None
        busy(answers)
        oldest = answers.hold()
        assert oldest is not None
        clock.now += 1_500_000
        younger = answers.hold()
        assert younger is not None
        assert answers.before_select(READY) is False  # the oldest has waited 1.5 ms
        clock.now += 500_000
        assert answers.before_select(READY) is True  # 2 ms: both go
        assert oldest.done() and younger.done()

    loop.run_until_complete(main())


def test_nothing_is_held_with_batch_zero_or_before_a_selector_releases(
    loop: asyncio.AbstractEventLoop,
) -> None:
    off = HeldAnswers(batch=0, linger_ms=5)
    off.install()
    not_installed = HeldAnswers(batch=4, linger_ms=5)

    async def main() -> None:
        for answers in (off, not_installed):
            for _ in range(5):
                busy(answers)
                assert answers.hold() is None
            assert answers.held_total == 0

    loop.run_until_complete(main())


def test_uninstall_releases_what_is_held_and_a_cancelled_call_is_skipped(
    loop: asyncio.AbstractEventLoop,
) -> None:
    answers = HeldAnswers(batch=8, linger_ms=5)
    answers.install()

    async def main() -> None:
        assert answers.hold() is None
        busy(answers)
        cancelled, kept = answers.hold(), answers.hold()
        assert cancelled is not None and kept is not None
        cancelled.cancel()  # its call went away while held
        answers.uninstall()
        assert kept.done() and kept.result() is None and cancelled.cancelled()
        busy(answers)
        assert answers.hold() is None  # no selector: nothing held any more

    loop.run_until_complete(main())


@pytest.mark.parametrize("batch", [-1, 4097, 1.5, True, "8"])
def test_a_bad_batch_is_refused(batch: object) -> None:
    with pytest.raises(ValueError, match="answer batch"):
        check_batch(batch)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="answer batch"):
        HeldAnswers(batch=batch)  # type: ignore[arg-type]


@pytest.mark.parametrize("linger", [-0.1, 1000.5, float("nan"), False, "1"])
def test_a_bad_linger_is_refused(linger: object) -> None:
    with pytest.raises(ValueError, match="answer linger"):
        check_linger_ms(linger)  # type: ignore[arg-type]
