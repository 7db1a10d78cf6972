"""Handler decorators: a plain function becomes a consumer.

    @handler("orders", group="billing")
    def bill(message: ReceivedMessage) -> None: ...

Outcome mapping (the function's result decides the message's fate):

| the handler                                   | the message                                  |
|-----------------------------------------------|----------------------------------------------|
| returns                                       | CONSUME_SUCCESS                              |
| raises `RetryLater(delay_level=n)`            | RECONSUME_LATER at delay level n             |
| raises `Discard(reason)`                      | finished, never retried (logged at info)     |
| raises an exception listed in `ignore_on`     | like `Discard` (logged as a warning)         |
| raises one listed in `dead_letter_on`         | dead-lettered now: retrying cannot help      |
| raises one not in `retry_on`, with            | dead-lettered now                            |
| `dead_letter_other=True`                      |                                              |
| raises anything else                          | RECONSUME_LATER on the ladder, DLQ past max  |

Any exception is retried by default: skipping the retry ladder is the choice a handler makes
explicitly, by naming what to dead-letter (`dead_letter_on=`) or by `retry_on=` together with
`dead_letter_other=True` (retry these, dead-letter everything else at once). `retry_on=`
alone is refused at declaration: it used to dead-letter every other exception silently.

Options are checked when the handler is declared: an unknown option, a bad topic or group
name, or an impossible value raises `ConfigurationError` there, not at the first message.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import functools
import inspect
import logging
import re
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from reliable import tracing
from reliable.consumer.listener import DLQ_NOW, ConsumeContext, MessageModel
from reliable.consumer.push import PushConsumer
from reliable.consumer.settings import ConsumerSettings
from reliable.errors import ConfigurationError
from reliable.handler_stats import HANDLER_STATS, HandlerOutcome
from reliable.idempotent import DeadLetterMarker, DefaultGuard, MessageGuard
from reliable.message import ConsumeResult, ReceivedMessage
from reliable.naming import (
    DLQ_GROUP_TOPIC_PREFIX,
    GROUP_MAX_LENGTH,
    check_group,
    check_topic,
    dlq_topic,
    is_dlq_topic,
)
from reliable.outcomes import Discard, RetryLater
from reliable.ratelimit import TokenBucket
from reliable.transport import Transport
from reliable.transport.base import ConsumeFrom

T = TypeVar("T")

log = logging.getLogger(__name__)


_SETTING_FIELDS = {f.name for f in dataclasses.fields(ConsumerSettings)}
_HANDLER_OPTIONS = {
    "group",
    "tags",
    "orderly",
    "broadcasting",
    "max_reconsume_times",
    "retry_on",
    "dead_letter_other",
    "dead_letter_on",
    "ignore_on",
    "rate_limit",
    "rate_burst",
    "idempotent",
    "consume_from",
    "max_cached_messages",
    "mark_dead_letters",
}
OPTIONS = frozenset(
    _HANDLER_OPTIONS
    | (_SETTING_FIELDS - {"message_model", "allocate", "pull_threshold_for_queue"})
    | {"allocate"}
)


def _exceptions(name: str, value: object) -> tuple[type[BaseException], ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list | tuple | set | frozenset) else (value,)
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise ConfigurationError(f"{name} must be exception classes, got {item!r}")
    return tuple(items)


def _default_group(fn: Callable[..., Any]) -> str:
    return re.sub(r"[^a-zA-Z0-9_-]", "_", f"{fn.__module__}.{fn.__qualname__}")[:GROUP_MAX_LENGTH]


class _AsyncRunner:
    """One background event loop running every `async def` handler of the process."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def run(cls, coro: Coroutine[Any, Any, T]) -> T:
        with cls._lock:
            if cls._loop is None or cls._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=loop.run_forever, name="reliable-async", daemon=True
                ).start()
                cls._loop = loop
            loop = cls._loop
        return asyncio.run_coroutine_threadsafe(coro, loop).result()


class Handler:
    """A declared consumer. Calling it calls the function; `consumer()` builds the
    `PushConsumer` that feeds it; `listener` is what that consumer calls."""

    def __init__(self, fn: Callable[..., Any], topic: str, options: dict[str, Any]) -> None:
        check_topic(topic, allow_system=False)
        unknown = set(options) - OPTIONS
        if unknown:
            hints = {u: difflib.get_close_matches(u, sorted(OPTIONS), n=1) for u in unknown}
            detail = ", ".join(
                f"{u!r}" + (f" (did you mean {h[0]!r}?)" if h else "")
                for u, h in sorted(hints.items())
            )
            raise ConfigurationError(f"unknown handler option(s) for {fn.__qualname__}: {detail}")
        if not callable(fn):
            raise ConfigurationError(f"{fn!r} is not callable")
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if not params:
            raise ConfigurationError(
                f"{fn.__qualname__} must take the message as its first argument"
            )
        self.fn = fn
        # keyword arguments the guard may offer (e.g. `session=`) reach the function only
        # when it declares them, or takes **kwargs
        every = inspect.signature(fn).parameters.values()
        self._takes_any_kw = any(p.kind is p.VAR_KEYWORD for p in every)
        self._kw_names = frozenset(
            p.name for p in every if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ) - {params[0].name}
        self.topic = topic
        self.group = check_group(options.get("group") or _default_group(fn))
        self.tags: str | None = options.get("tags")
        if self.tags is not None and not isinstance(self.tags, str):
            raise ConfigurationError("tags must be a string such as 'a || b'")
        self.is_async = inspect.iscoroutinefunction(fn)
        self.retry_on = _exceptions("retry_on", options.get("retry_on"))
        self.dead_letter_on = _exceptions("dead_letter_on", options.get("dead_letter_on"))
        self.ignore_on = _exceptions("ignore_on", options.get("ignore_on"))
        self.dead_letter_other = options.get("dead_letter_other", False)
        if not isinstance(self.dead_letter_other, bool):
            raise ConfigurationError("dead_letter_other must be True or False")
        if self.retry_on and not self.dead_letter_other:
            raise ConfigurationError(
                f"{fn.__qualname__}: retry_on= would dead-letter every other exception on "
                "its first failure; every exception is retried by default, so either drop "
                "retry_on=, name what to dead-letter at once with dead_letter_on=, or keep "
                "retry_on= and add dead_letter_other=True"
            )
        if self.dead_letter_other and not self.retry_on:
            raise ConfigurationError(
                "dead_letter_other=True needs retry_on= (the exceptions still retried)"
            )
        both = set(self.retry_on) & set(self.dead_letter_on)
        if both:
            raise ConfigurationError(
                f"{sorted(c.__name__ for c in both)} both in retry_on and dead_letter_on"
            )
        rate = options.get("rate_limit")
        if rate is not None and (not isinstance(rate, int | float) or rate <= 0):
            raise ConfigurationError(f"rate_limit must be a positive number, got {rate!r}")
        burst = options.get("rate_burst")
        if burst is not None and rate is None:
            raise ConfigurationError("rate_burst needs rate_limit")
        self.bucket = TokenBucket(rate, burst) if rate is not None else None
        self.guard = self._guard(options.get("idempotent"))
        self.marker = self._marker(options.get("mark_dead_letters"), topic)
        settings: dict[str, Any] = {k: v for k, v in options.items() if k in _SETTING_FIELDS}
        settings["orderly"] = bool(options.get("orderly", False))
        if options.get("broadcasting"):
            settings["message_model"] = MessageModel.BROADCASTING
        where = options.get("consume_from")
        if where is not None:
            try:
                settings["consume_from"] = (
                    where if isinstance(where, ConsumeFrom) else ConsumeFrom[str(where).upper()]
                )
            except KeyError:
                raise ConfigurationError(
                    f"consume_from must be one of {[c.name for c in ConsumeFrom]}"
                ) from None
        if options.get("max_cached_messages") is not None:
            settings["pull_threshold_for_queue"] = options["max_cached_messages"]
        try:
            self.settings = ConsumerSettings(**settings)
        except TypeError as exc:
            raise ConfigurationError(str(exc)) from exc
        functools.update_wrapper(self, fn)

    @staticmethod
    def _guard(value: object) -> MessageGuard | None:
        if value is None or value is False:
            return None
        if value is True:
            return DefaultGuard()  # built from the environment when the consumer starts
        if not callable(getattr(value, "process", None)):
            raise ConfigurationError(
                "idempotent= takes True or a guard object with process(message, group, invoke)"
            )
        return value  # type: ignore[return-value]

    def _marker(self, value: object, topic: str) -> DeadLetterMarker | DefaultGuard | None:
        if value is None or value is False:
            return None
        if not is_dlq_topic(topic):
            raise ConfigurationError(
                "mark_dead_letters= is for dead-letter handlers: "
                "@dlq_handler(group, mark_dead_letters=guard)"
            )
        if value is True:  # the default guard, shared with idempotent=True
            return self.guard if isinstance(self.guard, DefaultGuard) else DefaultGuard()
        if not callable(getattr(value, "mark_dead_lettered", None)):
            raise ConfigurationError(
                "mark_dead_letters= takes True or a guard object with "
                "mark_dead_lettered(message, group)"
            )
        return value  # type: ignore[return-value]

    @property
    def dead_letter_group(self) -> str | None:
        """The group whose dead letters this handler consumes (None for other topics)."""
        if not is_dlq_topic(self.topic):
            return None
        return self.topic[len(DLQ_GROUP_TOPIC_PREFIX) :]

    def _mark_dead_lettered(self, message: ReceivedMessage) -> None:
        marker = self.marker
        if isinstance(marker, DefaultGuard):
            marker = marker.ensure()
        assert marker is not None
        marker.mark_dead_lettered(message, self.dead_letter_group)

    # --- direct use
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Handler {self.fn.__qualname__} topic={self.topic!r} group={self.group!r}>"

    # --- consumption
    def _invoke(self, message: ReceivedMessage, **kwargs: Any) -> object:
        if kwargs and not self._takes_any_kw:
            kwargs = {k: v for k, v in kwargs.items() if k in self._kw_names}
        if self.is_async:
            return _AsyncRunner.run(self.fn(message, **kwargs))
        return self.fn(message, **kwargs)

    def handle(self, message: ReceivedMessage, ctx: ConsumeContext) -> ConsumeResult:
        """Run the handler for one message and map its outcome (see the module table);
        timed and counted in `reliable.metrics.HANDLER_STATS`, traced by `reliable.tracing`."""
        discarded_before, ctx.discarded = ctx.discarded, False
        started = time.perf_counter()
        with tracing.span(
            "process",
            message.topic,
            kind="consumer",
            group=self.group,
            message_id=message.message_id,
        ) as span:
            result = self._handle(message, ctx)
            if result is ConsumeResult.SUCCESS:
                outcome = HandlerOutcome.DISCARD if ctx.discarded else HandlerOutcome.SUCCESS
            elif ctx.delay_level_when_next_consume == DLQ_NOW:
                outcome = HandlerOutcome.DEAD_LETTER
            else:
                outcome = HandlerOutcome.RETRY
            span.set_attribute("reliable.outcome", outcome.value)
        HANDLER_STATS.record(self.group, time.perf_counter() - started, outcome)
        ctx.discarded = ctx.discarded or discarded_before
        return result

    def _handle(self, message: ReceivedMessage, ctx: ConsumeContext) -> ConsumeResult:
        if self.bucket is not None:
            self.bucket.acquire()  # throttled by waiting, never by failing the message
        if self.marker is not None:
            # before the user's function, so the dead letter is on record even if it fails
            try:
                self._mark_dead_lettered(message)
            except Exception as exc:  # database down: not the message's fault, retry it
                log.warning(
                    "%s: recording dead letter %s failed; will retry: %r",
                    self.group,
                    message.message_id,
                    exc,
                    exc_info=log.isEnabledFor(logging.DEBUG),
                )
                return ConsumeResult.RECONSUME_LATER
        try:
            if self.guard is not None:
                result = self.guard.process(
                    message, self.group, lambda **kw: self._invoke(message, **kw)
                )
                return result if isinstance(result, ConsumeResult) else ConsumeResult.SUCCESS
            outcome = self._invoke(message)
        except RetryLater as exc:
            if exc.delay_level is not None:
                ctx.delay_level_when_next_consume = exc.delay_level
            log.info("%s asks to retry %s later: %s", self.group, message.message_id, exc)
            return ConsumeResult.RECONSUME_LATER
        except Discard as exc:
            log.info("%s discards %s: %s", self.group, message.message_id, exc)
            ctx.discarded = True
            return ConsumeResult.SUCCESS
        except Exception as exc:
            if self.ignore_on and isinstance(exc, self.ignore_on):
                log.warning("%s ignores %r for %s (ignore_on)", self.group, exc, message.message_id)
                ctx.discarded = True
                return ConsumeResult.SUCCESS
            if self.dead_letter_on and isinstance(exc, self.dead_letter_on):
                why = "dead_letter_on"
            elif self.dead_letter_other and not isinstance(exc, self.retry_on):
                why = "not in retry_on, dead_letter_other"
            else:
                why = ""
            if why:
                log.warning(
                    "%s: %r is not retriable (%s); dead-lettering %s",
                    self.group,
                    exc,
                    why,
                    message.message_id,
                    exc_info=True,
                )
                ctx.delay_level_when_next_consume = DLQ_NOW
                return ConsumeResult.RECONSUME_LATER
            # an exception the handler declared retriable is expected: one line, no traceback
            # (unless debugging); anything else may be a bug, and gets its traceback
            expected = bool(self.retry_on) and isinstance(exc, self.retry_on)
            log.warning(
                "%s failed on %s (attempt %d); will retry: %r",
                self.group,
                message.message_id,
                message.delivery_attempt,
                exc,
                exc_info=not expected or log.isEnabledFor(logging.DEBUG),
            )
            return ConsumeResult.RECONSUME_LATER
        if isinstance(outcome, ConsumeResult):
            return outcome
        return ConsumeResult.SUCCESS

    def listener(self, messages: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        """The `MessageListener` for this handler: a batch stops at its first failure, and
        only that message and the ones after it are retried."""
        for i, m in enumerate(messages):
            if self.handle(m, ctx) is not ConsumeResult.SUCCESS:
                ctx.succeeded = i
                return ConsumeResult.RECONSUME_LATER
        return ConsumeResult.SUCCESS

    def prepare(self, messages: Sequence[ReceivedMessage]) -> None:
        """A received batch, before `listener` sees its messages: a guard that offers
        `prepare(messages, group)` (`idempotency.IdempotencyGuard`) takes the batch's
        leases together. Not under a rate limit: the messages would wait for it, leased."""
        prepare = getattr(self.guard, "prepare", None)
        if prepare is not None and self.bucket is None:
            prepare(messages, self.group)

    def consumer(self, transport: Transport | str = "embedded", **options: Any) -> PushConsumer:
        """A (not started) `PushConsumer` feeding this handler."""
        for guard in (self.guard, self.marker):
            if isinstance(guard, DefaultGuard):
                guard.ensure()  # configuration errors surface now, not at the first message
        return PushConsumer(
            self.group,
            _PreparingListener(self) if self.guard is not None else self.listener,
            {self.topic: self.tags},
            transport=transport,
            settings=self.settings,
            **options,
        )


@dataclass(frozen=True, slots=True)
class _PreparingListener:
    """A guarded handler's listener: `Handler.listener`, and `Handler.prepare` for each
    received batch (`PreparingListener`)."""

    handler: Handler

    def __call__(self, messages: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        return self.handler.listener(messages, ctx)

    def prepare(self, messages: Sequence[ReceivedMessage]) -> None:
        self.handler.prepare(messages)


def handler(topic: str, **options: Any) -> Callable[[Callable[..., Any]], Handler]:
    """Declare a consumer of `topic` (options: see `OPTIONS` and `ConsumerSettings`)."""

    def decorate(fn: Callable[..., Any]) -> Handler:
        return Handler(fn, topic, options)

    check_topic(topic, allow_system=False)
    return decorate


def dlq_handler(group: str, **options: Any) -> Callable[[Callable[..., Any]], Handler]:
    """Declare a consumer of `%DLQ%<group>`: the messages `group` gave up on.

    It consumes as its own group (default `<group>-DLQ`), from the first dead letter (on a
    server that cannot set a new group's start, such as an Apache RocketMQ proxy: where
    the server starts a new group, logged; set its offsets with mqadmin resetOffsetByTime).
    `mark_dead_letters=guard` (an `idempotency.IdempotencyGuard`, or True for the default
    guard) stamps `dead_lettered_at` on the consumption-log row of (original message id,
    `group`) before the function runs, so reconciliation sees the message as dead-lettered.
    """
    check_group(group)
    options.setdefault("group", f"{group}-DLQ")
    if "consume_from" not in options:
        # from the first dead letter where the server can set a group's start; elsewhere
        # (an Apache RocketMQ proxy) where its default puts a new group, logged
        options.update(consume_from=ConsumeFrom.FIRST, consume_from_preferred=True)
    return handler(dlq_topic(group), **options)
