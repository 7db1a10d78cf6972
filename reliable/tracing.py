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

A handler that raises records the exception on its span and sets the status to ERROR;
`RetryLater` and `Discard` are outcomes, recorded as the `reliable.outcome` attribute.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

try:
    from opentelemetry import trace as _trace
except ImportError:  # the optional extra is not installed: spans are no-ops
    _trace = None  # type: ignore[assignment]

SYSTEM = "rocketmq"
TRACER_NAME = "reliable"


def enabled() -> bool:
    """True when opentelemetry-api is importable (spans go to the configured provider)."""
    return _trace is not None


class _NoSpan:
    """What `span()` yields without OpenTelemetry: accepts and drops everything."""

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def record_exception(self, exc: BaseException) -> None:
        pass

    def set_error(self, description: str) -> None:
        pass


_NO_SPAN = _NoSpan()


class _Span:
    __slots__ = ("_span",)

    def __init__(self, span: Any) -> None:
        self._span = span

    def set_attribute(self, key: str, value: Any) -> None:
        self._span.set_attribute(key, value)

    def record_exception(self, exc: BaseException) -> None:
        self._span.record_exception(exc)

    def set_error(self, description: str) -> None:
        assert _trace is not None
        self._span.set_status(_trace.Status(_trace.StatusCode.ERROR, description))


@contextlib.contextmanager
def span(operation: str, topic: str, *, kind: str = "internal", group: str | None = None,
         message_id: str | None = None) -> Iterator[_Span | _NoSpan]:
    """A span `<topic> <operation>` with the messaging attributes (no-op without OTel).

    `kind`: "producer" (send), "consumer" (receive, process) or "internal". An exception
    leaving the block is recorded on the span by OpenTelemetry itself."""
    if _trace is None:
        yield _NO_SPAN
        return
    attributes: dict[str, str] = {"messaging.system": SYSTEM,
                                  "messaging.destination.name": topic,
                                  "messaging.operation.name": operation}
    if group is not None:
        attributes["messaging.consumer.group.name"] = group
    if message_id is not None:
        attributes["messaging.message.id"] = message_id
    span_kind = {"producer": _trace.SpanKind.PRODUCER,
                 "consumer": _trace.SpanKind.CONSUMER}.get(kind, _trace.SpanKind.INTERNAL)
    tracer = _trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(f"{topic} {operation}", kind=span_kind,
                                      attributes=attributes) as s:
        yield _Span(s)


def received(topic: str, group: str, message_ids: Sequence[str], started_ns: int) -> None:
    """Record a `<topic> receive` span from `started_ns` (time.time_ns()) to now, after the
    fact and only when the call returned messages: an empty long poll makes no span."""
    if _trace is None or not message_ids:
        return
    attributes: dict[str, Any] = {"messaging.system": SYSTEM,
                                  "messaging.destination.name": topic,
                                  "messaging.operation.name": "receive",
                                  "messaging.consumer.group.name": group,
                                  "messaging.batch.message_count": len(message_ids)}
    if len(message_ids) == 1:
        attributes["messaging.message.id"] = message_ids[0]
    tracer = _trace.get_tracer(TRACER_NAME)
    tracer.start_span(f"{topic} receive", kind=_trace.SpanKind.CONSUMER,
                      attributes=attributes, start_time=started_ns).end()


__all__ = ["SYSTEM", "TRACER_NAME", "enabled", "received", "span"]
