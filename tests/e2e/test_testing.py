"""reliable.testing: the real retry ladder played out on a virtual clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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


def test_settle_plays_the_whole_ladder_out_into_the_dlq() -> None:
    attempts: list[int] = []

    @handler("orders", group="billing-settle", max_reconsume_times=3, **FAST)
    def bill(message: ReceivedMessage) -> None:
        attempts.append(message.reconsume_times)
        raise RuntimeError("gateway down")

    with TestBroker() as tb, Worker(bill, transport=tb.transport):
        with tb.producer() as producer:
            producer.send(Message("orders", b"42"))
        waited = tb.settle()
        assert attempts == [0, 1, 2, 3]
        [dead] = tb.messages("%DLQ%billing-settle")
        assert dead.body == b"42"
        assert waited == 10 + 30 + 60  # levels 3, 4 and 5 of the default ladder
        assert tb.settle() == 0  # settled: nothing more happens by time alone


def test_settle_stops_when_a_retry_succeeds_and_delivers_delayed_messages() -> None:
    attempts: list[tuple[bytes, int]] = []

    @handler("orders", group="billing-settle-ok", **FAST)
    def bill(message: ReceivedMessage) -> None:
        attempts.append((message.body, message.reconsume_times))
        if message.body == b"flaky" and message.reconsume_times == 0:
            raise RuntimeError("once")

    with TestBroker() as tb, Worker(bill, transport=tb.transport):
        with tb.producer() as producer:
            producer.send(Message("orders", b"flaky"))
            producer.send(Message("orders", b"later", delay_level=18))  # 2 h
            at = tb.clock.now_ms() + 3 * 3600_000 + 1  # a timer: any time, not a level
            producer.send(Message("orders", b"timed", deliver_at_ms=at))
        waited = tb.settle()
    assert sorted(attempts) == [(b"flaky", 0), (b"flaky", 1), (b"later", 0), (b"timed", 0)]
    assert waited == 3 * 3600 + 0.001  # the retry (10 s) and the 2 h level came due on the way


def test_the_testing_example_in_the_client_docs_runs_and_checks_the_handler() -> None:
    """docs/client.md's example, as written: it passes, and its assertion fails when the
    handler does nothing (it asserts what the handler did, not only what is absent)."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "client.md").read_text()
    section = doc.split("## Testing your handlers", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    ns: dict[str, Any] = {}
    exec(compile(code, "docs/client.md", "exec"), ns)
    ns["test_billing_gives_up_into_the_dlq"]()
    ns["test_cancelled_orders_are_discarded"]()

    @handler("orders", group="billing", max_reconsume_times=2)
    def idle(message: ReceivedMessage) -> None:
        """A handler that does nothing: every message succeeds at once."""

    ns["bill"] = idle
    with pytest.raises(ValueError):  # `[dead] = ...` finds no dead letter
        ns["test_billing_gives_up_into_the_dlq"]()
