"""Batched acknowledgements: many acks in one request, each with its own outcome.

`AckBatcher.ack(message)` returns at once with a future; one thread gathers the acks of a
consumer group by topic and sends them as one AckMessage with repeated entries (the
in-process broker: one `ack_batch`, one durable record). A batch leaves when it holds
`batch_size` acks, when no request is in flight (an idle pipe never waits, unless
`linger_when_idle`: the push consumer's, whose acks nobody waits for), or once its oldest
ack has waited `linger_ms`; at most `max_in_flight` requests are in flight. In
process (a transport with `inline_acks`) nothing is in flight to overlap with: the caller
whose ack fills a batch sends it itself, a partial batch waits the linger (or `flush`),
and the thread is not woken to send each first ack alone. Each
future resolves with None, or with the error of its own entry (a dead receipt handle fails
that message alone; the others of the batch are acked).

Transports without batched acks (`submit_ack`) are served one `ack` call at a time on the
batcher's thread.

`change_invisible_async` pipelines a change of invisible duration (the protocol's request
carries one handle, so these are sent at once, many in flight, rather than batched).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from broker.futures import LightFuture
from reliable._linger import LingeringSender
from reliable.errors import ClientStateError
from reliable.message import ReceivedMessage

log = logging.getLogger("reliable.consumer")

AckResults = list["BaseException | None"]

DEFAULT_ACK_LINGER_MS = 1.0
DEFAULT_ACK_BATCH_SIZE = 256
DEFAULT_ACK_IN_FLIGHT = 4
# a push consumer's acks: nobody waits for them (the handler thread goes on, and a lost
# one only means a redelivery the idempotency guard absorbs), so they wait this long for
# company even when the pipe is idle
PUSH_ACK_LINGER_MS = 5.0


class BatchedAcks(Protocol):
    def submit_ack(
        self,
        group: str,
        messages: Sequence[ReceivedMessage],
        done: Callable[[AckResults | BaseException], None],
    ) -> None: ...


class AckBatcher(LingeringSender):
    """One per consumer (group); see the module docstring."""

    def __init__(
        self,
        transport: Any,
        group: str,
        *,
        linger_ms: float = DEFAULT_ACK_LINGER_MS,
        batch_size: int = DEFAULT_ACK_BATCH_SIZE,
        max_in_flight: int = DEFAULT_ACK_IN_FLIGHT,
        linger_when_idle: bool = False,
    ) -> None:
        super().__init__(
            linger_ms=linger_ms,
            batch_size=batch_size,
            max_in_flight=max_in_flight,
            thread_name=f"acks-{group}",
        )
        self._t = transport
        self._batched: BatchedAcks | None = (
            transport if callable(getattr(transport, "submit_ack", None)) else None
        )
        self._group = group
        self._topics: dict[str, list[tuple[ReceivedMessage, Future[None]]]] = {}
        self._first_at: dict[str, float] = {}
        # a transport whose submit_ack runs inline (the in-process broker): a full batch is
        # sent by the caller that filled it, without a hop to the batcher's thread
        self._caller_runs = self._batched is not None and bool(
            getattr(transport, "inline_acks", False)
        )
        # a partial batch waits the linger even when nothing is in flight (a consumer
        # that does not wait for its acks: one request for the acks of `linger_ms`
        # instead of one for each when handlers finish one at a time)
        self._linger_when_idle = linger_when_idle
        self._start_thread()

    def ack(self, message: ReceivedMessage) -> Future[None]:
        future: Future[None] = LightFuture()
        with self._cond:
            if self._closing:
                raise ClientStateError("the consumer is shutting down")
            waiting = self._topics.get(message.topic)
            if waiting is None:
                waiting = self._topics[message.topic] = []
                self._first_at[message.topic] = time.monotonic()
            waiting.append((message, future))
            self._pending += 1
            batch = None
            if (
                self._caller_runs
                and len(waiting) >= self._batch_size
                and self._in_flight < self._max_in_flight
            ):
                batch = waiting[: self._batch_size]
                del waiting[: self._batch_size]
                self._first_at[message.topic] = time.monotonic()
                self._in_flight += 1
            elif self._waiting and (len(waiting) == 1 or len(waiting) >= self._batch_size):
                self._waiting = False
                self._cond.notify()
        if batch is not None:
            self._send(batch)
        return future

    def flush(self) -> None:
        """Send the acks waiting now, on this thread, when the transport answers inline
        (there a partial batch otherwise waits the linger); elsewhere an idle pipe sends
        at once already, and a busy one within the linger."""
        if not self._caller_runs:
            return
        while True:  # inline sends complete as they return: in flight again only briefly
            with self._cond:
                batches, _ = self._collect(time.monotonic(), everything=True)
            if not batches:
                return
            for batch in batches:
                self._send(batch)

    def _emit(self, batch: Any) -> None:
        self._send(batch)

    def _collect(
        self, now: float, *, everything: bool = False
    ) -> tuple[list[list[tuple[ReceivedMessage, Future[None]]]], float | None]:
        out = []
        wait_s: float | None = None
        # an idle pipe sends at once, unless the caller sends full batches itself (in
        # process, nothing is in flight to overlap: a partial batch waits the linger)
        idle = self._in_flight == 0 and not self._caller_runs and not self._linger_when_idle
        for topic in list(self._topics):
            waiting = self._topics[topic]
            while waiting and self._in_flight < self._max_in_flight:
                due = self._first_at[topic] + self._linger_s
                if not (
                    idle
                    or everything
                    or self._closing
                    or len(waiting) >= self._batch_size
                    or due <= now
                ):
                    wait_s = max(due - now, 0.0) if wait_s is None else min(wait_s, due - now)
                    break
                out.append(waiting[: self._batch_size])
                del waiting[: self._batch_size]
                self._first_at[topic] = now
                self._in_flight += 1
            if not waiting:
                del self._topics[topic], self._first_at[topic]
        return out, wait_s

    def _send(self, batch: list[tuple[ReceivedMessage, Future[None]]]) -> None:
        self.requests += 1
        messages = [m for m, _ in batch]

        def done(results: AckResults | BaseException) -> None:
            self._complete(batch, results)

        try:
            if self._batched is not None:
                self._batched.submit_ack(self._group, messages, done)
            else:
                out: AckResults = []
                for m in messages:
                    try:
                        self._t.ack(self._group, m)
                        out.append(None)
                    except Exception as exc:
                        out.append(exc)
                done(out)
        except BaseException as exc:
            self._complete(batch, exc)

    def _complete(
        self, batch: list[tuple[ReceivedMessage, Future[None]]], results: AckResults | BaseException
    ) -> None:
        if isinstance(results, BaseException) or len(results) != len(batch):
            whole: BaseException = (
                results
                if isinstance(results, BaseException)
                else RuntimeError(f"{len(results)} ack results for {len(batch)} messages")
            )
            results = [whole] * len(batch)
        with self._cond:
            self._in_flight -= 1
            self._pending -= len(batch)
            if self._waiting:
                self._waiting = False
                self._cond.notify()
        for (_, future), error in zip(batch, results, strict=True):
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)


def change_invisible_async(
    transport: Any, group: str, message: ReceivedMessage, invisible_ms: int
) -> Future[str]:
    """Change a message's invisible duration without waiting for the answer: the future
    gets the new receipt handle (also stored on `message`) or the error. Transports without
    `submit_change_invisible` are called synchronously."""
    future: Future[str] = LightFuture()

    def done(outcome: str | BaseException) -> None:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    submit = getattr(transport, "submit_change_invisible", None)
    try:
        if callable(submit):
            submit(group, message, invisible_ms, done)
        else:
            done(transport.change_invisible_duration(group, message, invisible_ms))
    except Exception as exc:
        if not future.done():
            future.set_exception(exc)
    return future
