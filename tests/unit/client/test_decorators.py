"""Handler declaration (fail at definition time) and outcome mapping."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from reliable import (
    ConfigurationError,
    ConsumeContext,
    ConsumeResult,
    Discard,
    InvalidName,
    ReceivedMessage,
    RetryLater,
    dlq_handler,
    handler,
)


def _msg(reconsume: int = 0) -> ReceivedMessage:
    return ReceivedMessage(
        message_id="M1",
        topic="orders",
        body=b"{}",
        queue_id=0,
        queue_offset=0,
        reconsume_times=reconsume,
    )


def _run(h, msg: ReceivedMessage | None = None) -> tuple[ConsumeResult, ConsumeContext]:  # type: ignore[no-untyped-def]
    ctx = ConsumeContext(group=h.group)
    return h.listener([msg or _msg()], ctx), ctx


def test_return_means_success_and_the_function_stays_callable() -> None:
    @handler("orders", group="billing")
    def bill(message: ReceivedMessage) -> str:
        return message.message_id

    assert bill(_msg()) == "M1"
    assert _run(bill) == (ConsumeResult.SUCCESS, ConsumeContext(group="billing"))


def test_raise_means_reconsume_later_on_the_ladder() -> None:
    @handler("orders", group="billing")
    def bill(message: ReceivedMessage) -> None:
        raise RuntimeError("db down")

    result, ctx = _run(bill)
    assert result is ConsumeResult.RECONSUME_LATER
    assert ctx.delay_level_when_next_consume == 0


def test_retry_later_asks_for_a_delay_level() -> None:
    @handler("orders", group="billing")
    def bill(message: ReceivedMessage) -> None:
        raise RetryLater("not yet", delay_level=5)

    result, ctx = _run(bill)
    assert result is ConsumeResult.RECONSUME_LATER
    assert ctx.delay_level_when_next_consume == 5


def test_discard_finishes_without_retry() -> None:
    @handler("orders", group="billing")
    def bill(message: ReceivedMessage) -> None:
        raise Discard("order cancelled")

    result, ctx = _run(bill)
    assert result is ConsumeResult.SUCCESS and ctx.discarded


def test_ignore_on_discards_and_retry_on_dead_letters_the_rest() -> None:
    @handler(
        "orders",
        group="billing",
        retry_on=(ConnectionError,),
        dead_letter_other=True,
        ignore_on=KeyError,
    )
    def bill(message: ReceivedMessage) -> None:
        raise {b"conn": ConnectionError(), b"key": KeyError("x"), b"val": ValueError("bad")}[
            message.body
        ]

    def run(body: bytes) -> tuple[ConsumeResult, ConsumeContext]:
        m = _msg()
        m.body = body
        return _run(bill, m)

    assert run(b"conn") == (ConsumeResult.RECONSUME_LATER, ConsumeContext(group="billing"))
    result, ctx = run(b"key")
    assert result is ConsumeResult.SUCCESS and ctx.discarded
    result, ctx = run(b"val")
    assert result is ConsumeResult.RECONSUME_LATER and ctx.delay_level_when_next_consume == -1


def _outcome(h: object, exc: BaseException) -> tuple[ConsumeResult, int]:
    m = _msg()
    m.body = type(exc).__name__.encode()
    result, ctx = _run(h, m)  # type: ignore[arg-type]
    return result, ctx.delay_level_when_next_consume


def test_any_exception_is_retried_by_default() -> None:
    @handler("orders", group="billing")
    def bill(message: ReceivedMessage) -> None:
        raise ValueError("bad payload")

    assert _outcome(bill, ValueError()) == (ConsumeResult.RECONSUME_LATER, 0)


def test_dead_letter_on_names_what_skips_the_ladder() -> None:
    errors = {b"ValueError": ValueError("bad"), b"ConnectionError": ConnectionError()}

    @handler("orders", group="billing", dead_letter_on=ValueError)
    def bill(message: ReceivedMessage) -> None:
        raise errors[message.body]

    assert _outcome(bill, ValueError()) == (ConsumeResult.RECONSUME_LATER, -1)
    assert _outcome(bill, ConnectionError()) == (ConsumeResult.RECONSUME_LATER, 0)


def test_retry_on_alone_fails_at_declaration() -> None:
    with pytest.raises(ConfigurationError, match="dead_letter_other=True"):

        @handler("orders", group="billing", retry_on=(ConnectionError, TimeoutError))
        def bill(message: ReceivedMessage) -> None: ...

    with pytest.raises(ConfigurationError, match="needs retry_on"):

        @handler("orders", group="billing", dead_letter_other=True)
        def bill2(message: ReceivedMessage) -> None: ...

    with pytest.raises(ConfigurationError, match="both in retry_on and dead_letter_on"):

        @handler(
            "orders",
            group="billing",
            retry_on=KeyError,
            dead_letter_other=True,
            dead_letter_on=KeyError,
        )
        def bill3(message: ReceivedMessage) -> None: ...


def test_async_handlers_run() -> None:
    seen: list[str] = []

    @handler("orders", group="billing")
    async def bill(message: ReceivedMessage) -> None:
        seen.append(message.message_id)

    assert _run(bill)[0] is ConsumeResult.SUCCESS and seen == ["M1"]

    @handler("orders", group="billing2")
    async def fail(message: ReceivedMessage) -> None:
        raise RetryLater(delay_level=2)

    result, ctx = _run(fail)
    assert result is ConsumeResult.RECONSUME_LATER and ctx.delay_level_when_next_consume == 2


def test_unknown_option_fails_at_declaration_with_a_hint() -> None:
    with pytest.raises(ConfigurationError, match="did you mean 'retry_on'"):

        @handler("orders", group="billing", retry_onn=(KeyError,))
        def bill(message: ReceivedMessage) -> None: ...


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rate_limit": -1},
        {"rate_burst": 5},
        {"retry_on": "KeyError", "dead_letter_other": True},
        {"dead_letter_on": "KeyError"},
        {"dead_letter_other": "yes"},
        {"consume_threads": 0},
        {"consume_from": "yesterday"},
        {"max_reconsume_times": -1},
        {"tags": 3},
        {"idempotent": object()},
    ],
)
def test_bad_option_values_fail_at_declaration(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):

        @handler("orders", group="billing", **kwargs)
        def bill(message: ReceivedMessage) -> None: ...


@pytest.mark.parametrize("topic", ["", "a b", "x" * 200, "SCHEDULE_TOPIC_XXXX", "orders/eu"])
def test_bad_topic_names_fail_at_declaration(topic: str) -> None:
    with pytest.raises(InvalidName):
        handler(topic, group="billing")


def test_bad_group_name_fails_at_declaration() -> None:
    with pytest.raises(InvalidName):

        @handler("orders", group="bill ing")
        def bill(message: ReceivedMessage) -> None: ...


def test_a_group_the_broker_would_refuse_fails_at_declaration() -> None:
    """120 characters is the broker's limit (so %RETRY%<group> fits a topic name): a longer
    group is refused when the handler is declared, not by the broker at the first receive."""

    @handler("orders", group="g" * 120)
    def fits(message: ReceivedMessage) -> None: ...

    assert fits.group == "g" * 120
    with pytest.raises(InvalidName, match="at most 120"):

        @handler("orders", group="g" * 121)
        def too_long(message: ReceivedMessage) -> None: ...

    with pytest.raises(InvalidName, match="at most 120"):
        dlq_handler("g" * 121)


def test_a_default_group_fits_the_broker_limit() -> None:
    def deep() -> Callable[[ReceivedMessage], None]:
        def a_function_whose_qualified_name_goes_on_and_on_well_past_the_limit_of_what_a_broker_takes(  # noqa: E501
            message: ReceivedMessage,
        ) -> None: ...

        return a_function_whose_qualified_name_goes_on_and_on_well_past_the_limit_of_what_a_broker_takes  # noqa: E501

    h = handler("orders")(deep())
    assert len(h.group) == 120


def test_a_handler_needs_a_message_parameter() -> None:
    with pytest.raises(ConfigurationError):

        @handler("orders", group="billing")
        def bill() -> None: ...


def test_dlq_handler_consumes_the_groups_dead_letters() -> None:
    @dlq_handler("billing")
    def dead(message: ReceivedMessage) -> None: ...

    assert dead.topic == "%DLQ%billing" and dead.group == "billing-DLQ"


class _RecordingGuard:
    """A guard with the agreed interface; runs the handler with a session keyword."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def process(
        self, message: ReceivedMessage, group: str, invoke: Callable[..., object]
    ) -> ConsumeResult:
        self.calls.append((message.message_id, group))
        invoke(session="S")
        return ConsumeResult.SUCCESS


def test_idempotent_guard_wraps_the_handler_and_exceptions_map_as_usual() -> None:
    guard = _RecordingGuard()
    sessions: list[str] = []

    @handler("orders", group="billing", idempotent=guard)
    def bill(message: ReceivedMessage, session: str) -> None:
        sessions.append(session)
        if message.reconsume_times == 0:
            raise RetryLater(delay_level=4)

    result, ctx = _run(bill)
    assert result is ConsumeResult.RECONSUME_LATER and ctx.delay_level_when_next_consume == 4
    assert _run(bill, _msg(reconsume=1))[0] is ConsumeResult.SUCCESS
    assert guard.calls == [("M1", "billing"), ("M1", "billing")] and sessions == ["S", "S"]


def test_rate_limit_throttles_by_waiting() -> None:
    @handler("orders", group="billing", rate_limit=1000, rate_burst=1)
    def bill(message: ReceivedMessage) -> None: ...

    assert all(_run(bill)[0] is ConsumeResult.SUCCESS for _ in range(5))


def test_a_failing_batch_reports_how_many_at_its_head_succeeded() -> None:
    seen: list[int] = []

    @handler("orders", group="billing")
    def bill(message: ReceivedMessage) -> None:
        seen.append(message.queue_offset)
        if message.queue_offset == 1:
            raise RuntimeError("second one fails")

    batch = [
        ReceivedMessage(message_id=f"M{i}", topic="orders", body=b"x", queue_id=0, queue_offset=i)
        for i in range(3)
    ]
    ctx = ConsumeContext(group="billing")
    assert bill.listener(batch, ctx) is ConsumeResult.RECONSUME_LATER
    assert ctx.succeeded == 1 and seen == [0, 1]  # the third is not run after a failure
