"""OpenTelemetry spans around send, receive and handle, when OpenTelemetry is installed.

`pip install reliable[otel]` brings `opentelemetry-api`; the application configures the SDK
(a tracer provider and an exporter) as usual, and the framework's spans appear in its
traces. Without the package every `span()` is a no-op context manager: tracing is an
option, never a requirement. Spans are named `<topic> send`, `<topic> receive` and `<topic>
process` (the OpenTelemetry messaging conventions) and carry:

    messaging.system                "rocketmq"
    messaging.destination.name      the topic
    messaging.consumer.group.name   the consumer group (receive, process)
    messaging.message.id            the message id (send, process; receive: one message)
    messaging.batch.message_count   receive: how many messages the call returned

What a handler decided (success, retry, discard, dead_letter) is the process span's
`reliable.outcome` attribute: the framework catches the handler's exceptions, so they are
outcomes, not span errors. An exception leaving a span (a send that failed for good) is
recorded on it by OpenTelemetry.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span
    from opentelemetry.util.types import AttributeValue

SYSTEM = "rocketmq"
TRACER_NAME = "reliable"

_api: Any = None  # the opentelemetry.trace module, imported at the first span
_looked = False


def _trace() -> Any:
    """opentelemetry.trace, or None when the optional extra is not installed. Imported on
    first use, not with `reliable`: a program that never sends pays nothing for it."""
    global _api, _looked
    if not _looked:
        try:
            from opentelemetry import trace
        except ImportError:  # spans are no-ops
            trace = None  # type: ignore[assignment]
        _api, _looked = trace, True
    return _api


def enabled() -> bool:
    """True when opentelemetry-api is importable (spans go to the configured provider)."""
    return _trace() is not None


_provider: Any = None  # the application's tracer provider, once it has set one
_tracer_of: Any = None  # our tracer from it


_UNKNOWN = object()
_from_env: bool | None = None  # OTEL_PYTHON_TRACER_PROVIDER names a provider


def _configured(api: Any) -> bool:
    """True once the application has set a tracer provider. Until then OpenTelemetry
    hands out non-recording spans, and making one (context attach and detach included)
    costs more than the rest of a send: a send skips it. The global provider can be set
    only once, so a provider seen is kept; until one is, each span asks again.

    Asking is reading the API's global provider. `get_tracer_provider()` would tell the
    same, but it looks the environment up on every call while none is set (a fifth of a
    send's own time): the environment is looked at once, and the global read directly
    where the installed API has it (every 1.x release), publicly otherwise."""
    global _from_env
    if _provider is not None:
        return True
    if _from_env is None:
        _from_env = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
    current = _UNKNOWN if _from_env else getattr(api, "_TRACER_PROVIDER", _UNKNOWN)
    if current is _UNKNOWN:
        return not isinstance(api.get_tracer_provider(), api.ProxyTracerProvider)
    return current is not None


def _tracer(api: Any) -> Any:
    global _provider, _tracer_of
    provider = api.get_tracer_provider()
    if provider is not _provider:
        _provider, _tracer_of = provider, provider.get_tracer(TRACER_NAME)
    return _tracer_of


class _NoSpan:
    """What `span()` yields without OpenTelemetry: accepts and drops everything."""

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        pass


_NO_SPAN = _NoSpan()


class _Span:
    __slots__ = ("_span",)

    def __init__(self, span: Span) -> None:
        self._span = span

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        self._span.set_attribute(key, value)


_NO_SPAN_CONTEXT = contextlib.nullcontext(_NO_SPAN)  # reusable: it holds no state


def span(
    operation: str,
    topic: str,
    *,
    kind: str = "internal",
    group: str | None = None,
    message_id: str | None = None,
) -> contextlib.AbstractContextManager[_Span | _NoSpan]:
    """A span `<topic> <operation>` with the messaging attributes (no-op without OTel).

    `kind`: "producer" (send), "consumer" (receive, process) or "internal". An exception
    leaving the block is recorded on the span by OpenTelemetry itself."""
    api = _trace()
    if api is None or not _configured(api):
        return _NO_SPAN_CONTEXT
    return _recording(api, operation, topic, kind, group, message_id)


@contextlib.contextmanager
def _recording(
    api: Any,
    operation: str,
    topic: str,
    kind: str,
    group: str | None,
    message_id: str | None,
) -> Iterator[_Span | _NoSpan]:
    attributes: dict[str, str] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": topic,
        "messaging.operation.name": operation,
    }
    if group is not None:
        attributes["messaging.consumer.group.name"] = group
    if message_id is not None:
        attributes["messaging.message.id"] = message_id
    span_kind = {"producer": api.SpanKind.PRODUCER, "consumer": api.SpanKind.CONSUMER}.get(
        kind, api.SpanKind.INTERNAL
    )
    tracer = _tracer(api)
    with tracer.start_as_current_span(
        f"{topic} {operation}", kind=span_kind, attributes=attributes
    ) as s:
        yield _Span(s)


def received(topic: str, group: str, message_ids: Sequence[str], started_ns: int) -> None:
    """Record a `<topic> receive` span from `started_ns` (time.time_ns()) to now, after the
    fact and only when the call returned messages: an empty long poll makes no span."""
    api = _trace()
    if api is None or not message_ids or not _configured(api):
        return
    attributes: dict[str, AttributeValue] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": topic,
        "messaging.operation.name": "receive",
        "messaging.consumer.group.name": group,
        "messaging.batch.message_count": len(message_ids),
    }
    if len(message_ids) == 1:
        attributes["messaging.message.id"] = message_ids[0]
    tracer = _tracer(api)
    tracer.start_span(
        f"{topic} receive", kind=api.SpanKind.CONSUMER, attributes=attributes, start_time=started_ns
    ).end()


__all__ = ["SYSTEM", "TRACER_NAME", "enabled", "received", "span"]
