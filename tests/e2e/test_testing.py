"""reliable.testing: the real retry ladder played out on a virtual clock."""

from __future__ import annotations

from reliable import ConsumeResult, Discard, Message, ReceivedMessage, Worker, handler
from reliable.testing import TestBroker, run_handler
from tests.e2e.helpers import FAST, stays, wait_until


def test_virtual_clock_plays_the_real_ladder_without_waiting() -> None:
    attempts: list[int] = []

    @handler("orders", group="billing-vt", max_reconsume_times=1, **FAST)
    def bill(message: ReceivedMessage) -> None:
        attempts.append(message.reconsume_times)
        raise RuntimeError("gateway down")

    with TestBroker() as tb, Worker(bill, transport=tb.transport):
        with tb.producer() as producer:
            producer.send(Message("orders", b"42"))
        wait_until(lambda: attempts == [0], what="the first attempt")
        tb.advance(9)  # retry 1 waits at level 3: 10 s with the default table
        assert stays(lambda: attempts == [0], 0.5)
        tb.advance(1)
        wait_until(lambda: attempts == [0, 1], what="the retry")
        wait_until(lambda: len(tb.messages("%DLQ%billing-vt")) == 1, what="the dead letter")
    assert attempts == [0, 1]


def test_run_handler_without_a_broker() -> None:
    @handler("orders", group="billing-unit")
    def bill(message: ReceivedMessage) -> None:
        if message.body == b"cancelled":
            raise Discard("cancelled")

    assert run_handler(bill, Message("orders", b"ok"))[0] is ConsumeResult.SUCCESS
    result, ctx = run_handler(bill, Message("orders", b"cancelled"))
    assert result is ConsumeResult.SUCCESS and ctx.discarded
