"""The producer's send pipeline: many sends in flight, batched by a short linger.

`Producer.send_async` / `asend` hand each message to one `SendPipeline`; a single sender
thread groups waiting messages into *lanes* and dispatches a lane's messages as one request
(the protocol's repeated `messages` field; the in-process broker's batch path) through the
transport's non-blocking `submit_send`. Each message keeps its own future, receipt and error.

    lane = (topic, message group)       messages of a lane leave in the order they came
    batch  <= batch_size messages of one lane, one request
    window <= max_in_flight requests in flight on the transport

When a batch leaves: as soon as it holds `batch_size` messages, a synchronous `send` waits
on it, or no request is in flight (an idle pipe never waits); otherwise once its oldest
message has waited `linger_ms` (Kafka's `linger.ms`) or a request completes and frees a
slot of the window.

Order per message group: a lane of a message group has at most one request in flight, and a
message that failed with a retriable error goes back to the head of its lane (retried before
anything sent after it), so a group's messages are stored in send order. Messages without a
group may be stored in any order, as with concurrent sends.

Retries follow the producer's async policy per message: a "try elsewhere" failure is resent
at once (another queue where the route has several), flow control pauses the lane for the
backoff delay, a failover (`is_failover_like`) once those are spent pauses it for the
patience backoff until the window since the message's first failure closes, a bad request
fails that message alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from broker.futures import LightFuture
from reliable._linger import LingeringSender
from reliable.errors import BrokerCallError, ClientStateError, FailureKind, SendFailed
from reliable.latency import LatencyFaultTolerance
from reliable.message import Message, SendReceipt, SendStatus
from reliable.retry import SendPolicy, is_failover_like, is_flow_control, is_try_elsewhere
from reliable.transport.base import QueueRef, TopicRoute

log = logging.getLogger("reliable.producer")

Results = list["SendReceipt | BaseException"]
SendDone = Callable[["Results | BaseException"], None]

_local = threading.local()

DEFAULT_LINGER_MS = 1.0
DEFAULT_BATCH_SIZE = 128
DEFAULT_MAX_IN_FLIGHT = 16
_SEND_OK = SendStatus.SEND_OK


class RoutingProducer(Protocol):
    """What the pipeline needs of its `Producer`: routes, queue choice and fault tracking
    (a protocol, so that this module does not import the producer that imports it)."""

    group: str
    _faults: LatencyFaultTolerance | None

    def _route(self, topic: str) -> TopicRoute: ...

    def _select(self, route: TopicRoute, message: Message, last_broker: str | None) -> QueueRef: ...


class PipelinedSends(Protocol):
    """What a transport offers to be pipelined (the grpc and embedded transports do)."""

    def submit_send(
        self,
        messages: Sequence[Message],
        queue: QueueRef,
        *,
        producer_group: str | None,
        timeout_s: float | None,
        done: SendDone,
    ) -> None:
        """Send `messages` (one lane: one topic, one message group) as one request without
        waiting; call `done` once, with a result per message (receipt or its error) or with
        the error of the whole request. `done` may run on any thread, or inline."""
        ...


@dataclass(slots=True)
class _Item:
    message: Message
    future: Future[SendReceipt]
    attempts: list[tuple[str, BaseException]] | None = None  # made at the first failure
    elsewhere: int = 0
    busy: int = 0
    patient: int = 0  # retries made waiting out a failover
    failed_at: float = 0.0  # the policy clock at its first failure (0: none yet)
    last_broker: str | None = None
    alone: bool = False  # its batch was refused as a whole: it goes in a request of its own


class _Lane:
    __slots__ = ("first_at", "in_flight", "items", "key", "ordered", "paused_until", "urgent")

    def __init__(self, key: tuple[str, str | None], ordered: bool) -> None:
        self.key = key
        self.items: deque[_Item] = deque()
        self.first_at = 0.0
        self.in_flight = 0
        self.urgent = 0  # synchronous senders waiting on this lane
        self.paused_until = 0.0
        self.ordered = ordered


class SendPipeline(LingeringSender):
    """One sender thread per producer; see the module docstring."""

    def __init__(
        self,
        producer: RoutingProducer,
        transport: PipelinedSends,
        policy: SendPolicy,
        *,
        linger_ms: float,
        batch_size: int,
        max_in_flight: int,
        timeout_s: float,
    ) -> None:
        super().__init__(
            linger_ms=linger_ms,
            batch_size=batch_size,
            max_in_flight=max_in_flight,
            thread_name=f"sender-{producer.group}",
        )
        self._producer = producer
        self._transport = transport
        self._policy = policy
        self._timeout_s = timeout_s
        self._lanes: dict[tuple[str, str | None], _Lane] = {}
        # a transport whose submit_send runs inline (the in-process broker): a full batch
        # is sent by the caller that filled it, without a hop to the sender thread
        self._caller_runs = bool(getattr(transport, "inline_sends", False))
        self._start_thread()

    # --- callers
    def lane_idle(self, message: Message) -> bool:
        """No message of this message's lane waits or is in flight: a synchronous send may
        go straight to the transport without overtaking anything."""
        if getattr(_local, "resolving", False):
            # a send callback (on the thread that completes requests) must not wait for a
            # request that thread itself would complete: it goes straight to the transport
            return True
        lane = self._lanes.get((message.topic, message.message_group))
        return lane is None or (not lane.items and not lane.in_flight)

    def add(self, message: Message, *, urgent: bool = False) -> Future[SendReceipt]:
        future: Future[SendReceipt] = LightFuture()
        item = _Item(message, future)
        key = (message.topic, message.message_group)
        with self._lock:
            if self._closing:
                raise ClientStateError("the producer is shutting down")
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = _Lane(key, message.message_group is not None)
            first = not lane.items
            if first:
                lane.first_at = time.monotonic()
            lane.items.append(item)
            self._pending += 1
            if urgent:
                lane.urgent += 1
            batch: list[_Item] | None = None
            if (
                self._caller_runs
                and len(lane.items) >= self._batch_size
                and self._in_flight < self._max_in_flight
                and not (lane.ordered and lane.in_flight)
                and not lane.items[0].alone
                and lane.paused_until <= time.monotonic()
            ):
                batch = [lane.items.popleft() for _ in range(self._batch_size)]
                lane.first_at = time.monotonic()
                lane.in_flight += 1
                self._in_flight += 1
            elif self._waiting and (first or urgent or len(lane.items) >= self._batch_size):
                self._waiting = False
                self._cond.notify()
        if batch is not None:
            self._dispatch(lane, batch)
        if urgent:
            future.add_done_callback(lambda _f: self._unurgent(lane))
        return future

    def _unurgent(self, lane: _Lane) -> None:
        with self._cond:
            lane.urgent = max(lane.urgent - 1, 0)

    def _emit(self, batch: tuple[_Lane, list[_Item]]) -> None:
        self._dispatch(*batch)

    def _collect(self, now: float) -> tuple[list[tuple[_Lane, list[_Item]]], float | None]:
        out: list[tuple[_Lane, list[_Item]]] = []
        wait_s: float | None = None
        idle = self._in_flight == 0
        for lane in list(self._lanes.values()):
            if not lane.items:
                if not lane.in_flight and not lane.urgent:
                    del self._lanes[lane.key]  # forget idle lanes (groups come and go)
                continue
            if lane.paused_until > now:
                wait_s = _earliest(wait_s, lane.paused_until - now)
                continue
            while lane.items and self._in_flight < self._max_in_flight:
                if lane.ordered and lane.in_flight:
                    break
                due = lane.first_at + self._linger_s
                if not (
                    idle
                    or self._closing
                    or lane.urgent
                    or len(lane.items) >= self._batch_size
                    or due <= now
                ):
                    wait_s = _earliest(wait_s, due - now)
                    break
                n = 1 if lane.items[0].alone else min(len(lane.items), self._batch_size)
                items = [lane.items.popleft() for _ in range(n)]
                lane.first_at = now
                lane.in_flight += 1
                self._in_flight += 1
                out.append((lane, items))
        return out, wait_s

    def _dispatch(self, lane: _Lane, items: list[_Item]) -> None:
        producer = self._producer
        first = items[0].message
        started = time.monotonic()
        try:
            route = producer._route(first.topic)
            queue = producer._select(route, first, items[0].last_broker)
        except BaseException as exc:  # no route: every message of the batch gets the error
            self._complete(lane, items, None, started, exc)
            return
        for item in items:
            item.last_broker = queue.broker
        self.requests += 1

        def done(results: Results | BaseException) -> None:
            self._complete(lane, items, queue, started, results)

        try:
            self._transport.submit_send(
                [i.message for i in items],
                queue,
                producer_group=producer.group,
                timeout_s=self._timeout_s,
                done=done,
            )
        except BaseException as exc:
            self._complete(lane, items, queue, started, exc)

    def _complete(
        self,
        lane: _Lane,
        items: list[_Item],
        queue: QueueRef | None,
        started: float,
        results: Results | BaseException,
    ) -> None:
        if len(items) > 1 and _refused(results):
            # a request refused as a whole for what one message holds (a bad property):
            # each message goes again alone, so only the bad one fails
            for item in items:
                item.alone = True
            with self._cond:
                lane.in_flight -= 1
                self._in_flight -= 1
                lane.items.extendleft(reversed(items))
                lane.first_at = 0.0
                if self._waiting:
                    self._waiting = False
                    self._cond.notify()
            return
        if (
            type(results) is list
            and len(results) == len(items)
            and self._producer._faults is None
            and all(type(r) is SendReceipt and r.status is _SEND_OK for r in results)
        ):
            # the usual outcome, every message stored as asked: nothing to retry or record
            with self._lock:
                lane.in_flight -= 1
                self._in_flight -= 1
                self._pending -= len(items)
                if self._waiting:
                    self._waiting = False
                    self._cond.notify()
            _local.resolving = True  # send callbacks run here: see lane_idle
            try:
                for item, receipt in zip(items, results, strict=True):
                    item.future.set_result(receipt)  # type: ignore[arg-type]
            finally:
                _local.resolving = False
            return
        if isinstance(results, BaseException) or len(results) != len(items):
            error = (
                results
                if isinstance(results, BaseException)
                else BrokerCallError(
                    FailureKind.TRY_ELSEWHERE, f"{len(results)} results for {len(items)} messages"
                )
            )
            results = [error] * len(items)
        faults = self._producer._faults
        if faults is not None and queue is not None:
            failed = any(
                isinstance(r, BrokerCallError) and r.kind is not FailureKind.BAD_REQUEST
                for r in results
            )
            faults.update(queue.broker, (time.monotonic() - started) * 1000, isolation=failed)
        settled: list[tuple[_Item, SendReceipt | BaseException]] = []
        retry: list[_Item] = []
        pause_s = 0.0
        for item, result in zip(items, results, strict=True):
            if isinstance(result, SendReceipt):
                status = result.status
                if (
                    status is not SendStatus.SEND_OK
                    and (self._policy.retry_not_stored_ok or status.not_replicated)
                    and item.elsewhere < self._policy.retry_times
                ):
                    item.elsewhere += 1
                    retry.append(item)
                else:
                    settled.append((item, result))
                continue
            where = str(queue) if queue is not None else first_topic(items)
            if item.attempts is None:
                item.attempts = []
                item.failed_at = self._policy.clock()
            item.attempts.append((where, result))
            if is_flow_control(result) and item.busy < self._policy.flow_control_retries:
                item.busy += 1
                pause_s = max(pause_s, self._policy.backoff.delay(item.busy, self._policy.rng))
                retry.append(item)
            elif (
                is_try_elsewhere(result, not_stored_ok=self._policy.retry_not_stored_ok)
                and item.elsewhere < self._policy.retry_times
            ):
                item.elsewhere += 1
                retry.append(item)
            elif (wait := self._patient_wait(item, result)) >= 0:
                pause_s = max(pause_s, wait)
                retry.append(item)
            else:
                settled.append((item, self._final_error(item, result)))
        with self._cond:
            lane.in_flight -= 1
            self._in_flight -= 1
            self._pending -= len(settled)
            if retry:
                lane.items.extendleft(reversed(retry))  # ahead of everything sent after them
                lane.first_at = 0.0
                if pause_s:
                    lane.paused_until = time.monotonic() + pause_s
                self._lanes.setdefault(lane.key, lane)
            if self._waiting:
                self._waiting = False
                self._cond.notify()
        _local.resolving = True  # send callbacks run here: see lane_idle
        try:
            for item, outcome in settled:
                if isinstance(outcome, SendReceipt):
                    item.future.set_result(outcome)
                else:
                    item.future.set_exception(outcome)
        finally:
            _local.resolving = False

    def _patient_wait(self, item: _Item, error: BaseException) -> float:
        """The pause before retrying `item` to wait out a failover, or -1 when `error` is not
        a failover's or the patience window since its first failure is over."""
        if not is_failover_like(error):
            return -1.0
        policy = self._policy
        now = policy.clock()
        if not item.failed_at:
            item.failed_at = now
        item.patient += 1
        return policy.patience.wait(item.failed_at, now, item.patient, policy.rng)

    @staticmethod
    def _final_error(item: _Item, error: BaseException) -> BaseException:
        if isinstance(error, BrokerCallError) and error.kind is FailureKind.BAD_REQUEST:
            return error
        if isinstance(error, BrokerCallError):
            failed = SendFailed(item.message.topic, item.attempts or [])
            failed.__cause__ = error
            return failed
        return error


def _refused(results: Results | BaseException) -> bool:
    if isinstance(results, BrokerCallError):
        return results.kind is FailureKind.BAD_REQUEST
    return isinstance(results, TypeError | ValueError)


def first_topic(items: Sequence[_Item]) -> str:
    return items[0].message.topic if items else ""


def _earliest(current: float | None, candidate: float) -> float:
    candidate = max(candidate, 0.0)
    return candidate if current is None else min(current, candidate)


def wants(obj: Any) -> PipelinedSends | None:
    """The transport's pipelined send, if it has one."""
    return obj if callable(getattr(obj, "submit_send", None)) else None
