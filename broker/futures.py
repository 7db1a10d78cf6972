"""`LightFuture`: a `concurrent.futures.Future` that makes its `Condition` only when a thread
waits on it.

A send or an ack returns one future per message. The standard future builds a
`threading.Condition` (a lock, a waiter list, bound methods) as it is made, and every
`set_result`, `add_done_callback` and `done` takes it: about 3 µs of a pipelined message's
client CPU, and most futures are never waited on while pending (they finish first, or are
read by a callback). Here the Condition is made the first time something needs it: a
`result()` or `exception()` on a future still pending, `wait()`, `as_completed()`,
`cancel()`. Until then the state changes under one module lock, held for a few
instructions.

It is a subclass, so `isinstance(f, Future)`, `concurrent.futures.wait`,
`as_completed` and `asyncio.wrap_future` work as with any future: they reach the
Condition through the `_condition` attribute, which makes it.

Why it is safe: a thread that waits makes the Condition under the module lock and only then
reads the state; a finishing thread sets the state under the same lock and only takes the
slow path (notify under the Condition) when one exists. So either the waiter sees the
finished state, or the finisher sees the Condition and notifies it.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import (  # the states, as `Future` itself names them
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    LOGGER,
    PENDING,
)
from typing import Any, TypeVar

T = TypeVar("T")

_GUARD = threading.Lock()
_ENDED = frozenset((CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED))
_NONE: Any = ()  # a future's waiters or callbacks before the first one


class LightFuture(Future[T]):
    """A `Future` whose Condition is made only when a thread waits (see the module)."""

    def __init__(self) -> None:  # the base's fields, without the Condition
        self._state = PENDING
        self._result: Any = None
        self._exception: BaseException | None = None
        # no lists until something goes in: two fewer objects for the cyclic collector per
        # future (a pipelined producer keeps a thousand in flight; the collector's passes
        # over them were a fifth of its client CPU). The Condition's maker gives them lists
        self._waiters: list[Any] = _NONE
        self._done_callbacks: list[Any] = _NONE
        self._cond: threading.Condition | None = None

    # the base assigns it in __init__, which is replaced
    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        cond = self._cond
        if cond is None:
            with _GUARD:
                cond = self._cond
                if cond is None:
                    # the base's paths (wait, as_completed, cancel, a waiter's result) run
                    # under the Condition and append to these
                    if self._waiters is _NONE:
                        self._waiters = []
                    if self._done_callbacks is _NONE:
                        self._done_callbacks = []
                    cond = self._cond = threading.Condition()
        return cond

    def done(self) -> bool:
        return self._state in _ENDED

    def add_done_callback(self, fn: Any) -> None:
        with _GUARD:
            light = self._cond is None
            if light and self._state not in _ENDED:
                if self._done_callbacks is _NONE:
                    self._done_callbacks = [fn]
                else:
                    self._done_callbacks.append(fn)
                return
        if not light:
            super().add_done_callback(fn)
            return
        try:
            fn(self)
        except Exception:
            LOGGER.exception("exception calling callback for %r", self)

    def result(self, timeout: float | None = None) -> T:
        if self._state == FINISHED:  # the common case: no lock, no Condition
            exc = self._exception
            if exc is not None:
                try:
                    raise exc
                finally:
                    self = None  # type: ignore[assignment]  # break the cycle, as the base does
            return self._result  # type: ignore[no-any-return]
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == FINISHED:
            return self._exception
        return super().exception(timeout)

    def set_result(self, result: T) -> None:
        if not self._finish_light("_result", result):
            super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        if not self._finish_light("_exception", exception):
            super().set_exception(exception)

    def _finish_light(self, field: str, value: Any) -> bool:
        """Finish without a Condition, and run the callbacks; False (nothing done) when a
        Condition exists: the base's path then notifies its waiters."""
        with _GUARD:
            if self._cond is not None:
                return False
            ended = self._state in _ENDED
            if not ended:
                setattr(self, field, value)
                self._state = FINISHED
        if ended:  # refused outside the lock: repr() takes the Condition
            raise InvalidStateError(f"{self._state}: {self!r}")
        self._invoke_callbacks()  # type: ignore[attr-defined]
        return True
