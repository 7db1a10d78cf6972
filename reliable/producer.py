"""The producer: sync, async, oneway, batch, ordered, delayed and transactional sends.

Sync sends make `1 + retry_times_when_send_failed` attempts, each on another queue (and,
where the route has several, another broker), retrying only failures that mean "try
elsewhere" and a sync-master's "stored, no slave confirmed it" (a failover under way: each
attempt sends the same message, id included, which the server de-duplicates); a bad request
fails at once. A busy broker is retried after an exponential
backoff (1 s x 1.6, jitter 0.2, at most 120 s). A send whose immediate retries all met a
failover (its master unreachable or not replicating, a slave refusing, the route empty for
the moment) waits it out for up to `failover_wait_s` (10 s) since its first failure, with a
short backoff, and lands on the new master as soon as the route names it. The policies are
tenacity values (`reliable.retry`). With `send_latency_fault_enable`, brokers that answered
slowly or failed are avoided for a while (`reliable.latency`).

`send_async` and `asend` are pipelined on transports that offer it (grpc, embedded): no
thread per send, many requests in flight, messages batched by a short linger into one
request, each with its own receipt and error, in send order per message group
(`reliable._pipeline`; knobs `linger_ms`, `batch_size`, `max_in_flight`, see docs/client.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from protocol.props import Prop
from reliable import tracing
from reliable._pipeline import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_LINGER_MS,
    DEFAULT_MAX_IN_FLIGHT,
    SendPipeline,
    wants,
)
from reliable.errors import (
    BadRequest,
    BrokerCallError,
    ClientStateError,
    ConfigurationError,
    FailureKind,
    GroupResendRefused,
    GroupResendUnsupported,
    InvalidMessage,
    NoRoute,
    SendFailed,
)
from reliable.latency import LatencyFaultTolerance
from reliable.message import Message, ReceivedMessage, SendReceipt, SendStatus
from reliable.naming import check_group, check_topic, retry_topic
from reliable.retry import Backoff, FailoverPatience, SendPolicy, call_with_policy
from reliable.transport import Transport, connect
from reliable.transport.base import QueueRef, TopicRoute, TransactionRef, TransactionState

R = TypeVar("R")

log = logging.getLogger(__name__)

LocalTransaction = Callable[[Message, Any], "TransactionState | bool"]
TransactionCheckerFn = Callable[[ReceivedMessage], "TransactionState | bool"]


_BODY_TYPES = (bytes, bytearray, memoryview)


@dataclass(frozen=True, slots=True)
class TransactionSendResult:
    """A half message's receipt and the local transaction's verdict."""

    receipt: SendReceipt
    state: TransactionState
    error: BaseException | None = None  # the local transaction raised: left to the check-back


class _NotStoredOk(BrokerCallError):
    def __init__(self, receipt: SendReceipt) -> None:
        self.receipt = receipt
        kind = (
            FailureKind.NOT_REPLICATED
            if receipt.status.not_replicated
            else FailureKind.NOT_STORED_OK
        )
        super().__init__(kind, f"stored with {receipt.status.value}")


def _to_state(value: object) -> TransactionState:
    if isinstance(value, TransactionState):
        return value
    if value is True:
        return TransactionState.COMMIT
    if value is False:
        return TransactionState.ROLLBACK
    log.error("a transaction callback returned %r; treated as UNKNOWN (the check decides)", value)
    return TransactionState.UNKNOWN


class Producer:
    """Send messages. Use as a context manager, or call `start()` / `shutdown()`."""

    def __init__(
        self,
        transport: Transport | str = "embedded",
        *,
        group: str = "DEFAULT_PRODUCER",
        retry_times_when_send_failed: int = 2,
        retry_times_when_send_async_failed: int = 2,
        retry_another_broker_when_not_store_ok: bool = False,
        send_latency_fault_enable: bool = False,
        flow_control_retries: int = 5,
        backoff: Backoff | None = None,
        failover_wait_s: float = FailoverPatience.window_s,
        send_timeout_s: float = 3.0,
        transaction_checker: TransactionCheckerFn | None = None,
        async_workers: int = 4,
        linger_ms: float = DEFAULT_LINGER_MS,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        sleep: Callable[[float], None] = time.sleep,
        clock_ms: Callable[[], float] | None = None,
        rng: random.Random | None = None,
        **transport_options: Any,
    ) -> None:
        check_group(group)
        for name, value in (
            ("retry_times_when_send_failed", retry_times_when_send_failed),
            ("retry_times_when_send_async_failed", retry_times_when_send_async_failed),
            ("flow_control_retries", flow_control_retries),
        ):
            if value < 0:
                raise ConfigurationError(f"{name} must be >= 0, got {value}")
        if failover_wait_s < 0:
            raise ConfigurationError(f"failover_wait_s must be >= 0, got {failover_wait_s}")
        if async_workers < 1:
            raise ConfigurationError("async_workers must be >= 1")
        if linger_ms < 0:
            raise ConfigurationError(f"linger_ms must be >= 0, got {linger_ms}")
        if batch_size < 1 or max_in_flight < 1:
            raise ConfigurationError(
                f"batch_size and max_in_flight must be >= 1, got {batch_size} and {max_in_flight}"
            )
        self.group = group
        self._owns_transport = isinstance(transport, str)
        self._transport: Transport = (
            connect(transport, **transport_options) if isinstance(transport, str) else transport
        )
        if transport_options and not self._owns_transport:
            raise ConfigurationError(
                f"transport options given with a transport object: {sorted(transport_options)}"
            )
        self._clock_ms = clock_ms or (lambda: time.monotonic() * 1000)
        rng = rng or random.Random()
        backoff = backoff or Backoff()
        patience = FailoverPatience(failover_wait_s)
        clock_ms_ = self._clock_ms

        def clock_s() -> float:
            return clock_ms_() / 1000

        self._sync_policy, self._async_policy = (
            SendPolicy(
                retries,
                flow_control_retries,
                backoff,
                retry_another_broker_when_not_store_ok,
                sleep,
                rng,
                patience,
                clock_s,
            )
            for retries in (retry_times_when_send_failed, retry_times_when_send_async_failed)
        )
        self._faults = LatencyFaultTolerance(self._clock_ms) if send_latency_fault_enable else None
        self._send_timeout_s = send_timeout_s
        self._checker = transaction_checker
        self._async_workers = async_workers
        self._executor: ThreadPoolExecutor | None = None
        self._linger_ms, self._batch_size = linger_ms, batch_size
        self._max_in_flight = max_in_flight
        self._pipeline: SendPipeline | None = None
        self._index = random.Random().randrange(1 << 16)
        self._index_lock = threading.Lock()
        self._written: set[str] = set()  # topics seen with a writable queue (see NoRoute)
        self._started = False

    # --- lifecycle
    def start(self) -> Producer:
        if self._started:
            return self
        if self._owns_transport:
            self._transport.start()
        if self._checker is not None:
            checker = self._checker
            self._transport.set_transaction_checker(self.group, lambda m: _to_state(checker(m)))
        pipelined = wants(self._transport)
        if pipelined is not None:
            self._pipeline = SendPipeline(
                self,
                pipelined,
                self._async_policy,
                linger_ms=self._linger_ms,
                batch_size=self._batch_size,
                max_in_flight=self._max_in_flight,
                timeout_s=self._send_timeout_s,
            )
        else:
            self._executor = ThreadPoolExecutor(
                self._async_workers, thread_name_prefix=f"send-{self.group}"
            )
        self._started = True
        return self

    def shutdown(self) -> None:
        if not self._started:
            return
        self._started = False
        if self._pipeline is not None:
            self._pipeline.close()
            self._pipeline = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._checker is not None:
            self._transport.set_transaction_checker(self.group, None)
        if self._owns_transport:
            self._transport.close()

    def __enter__(self) -> Producer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def transport(self) -> Transport:
        return self._transport

    # --- sends
    def send(self, message: Message) -> SendReceipt:
        """Send and wait for the broker's receipt; `SendFailed` after the last attempt."""
        self._check_started()
        self._validate(message)
        with tracing.span("send", message.topic, kind="producer") as span:
            pipeline = self._pipeline
            if pipeline is not None and not pipeline.lane_idle(message):
                # messages of its lane wait or are in flight: queue behind them (group
                # order), and the waiting batch leaves at once instead of after the linger
                receipt = pipeline.add(message, urgent=True).result()
            else:
                receipt = self._send_with_policy(message, self._sync_policy, transactional=False)
            span.set_attribute("messaging.message.id", receipt.message_id)
            return receipt

    @property
    def requests_sent(self) -> int:
        """Requests the pipeline dispatched for `send_async` / `asend` (each carries one
        batch); with batching it is smaller than the number of messages."""
        return self._pipeline.requests if self._pipeline is not None else 0

    def send_async(
        self,
        message: Message,
        *,
        on_success: Callable[[SendReceipt], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> Future[SendReceipt]:
        """Send in the background (own retry setting); result by future and/or callbacks.

        Never waits for other sends: pipelined transports batch it with the messages sent
        around it (`linger_ms`, `batch_size`, `max_in_flight`); callbacks run on the thread
        that completes the send, so keep them short."""
        self._check_started()
        self._validate(message)
        future: Future[SendReceipt]
        if self._pipeline is not None:
            future = self._pipeline.add(message)
        else:
            assert self._executor is not None
            future = self._executor.submit(
                self._send_with_policy, message, self._async_policy, False
            )
        if on_success is None and on_error is None:
            return future

        def done(f: Future[SendReceipt]) -> None:
            exc = f.exception()
            try:
                if exc is None and on_success is not None:
                    on_success(f.result())
                elif exc is not None and on_error is not None:
                    on_error(exc)
            except Exception:
                log.exception("send callback raised")

        future.add_done_callback(done)
        return future

    async def asend(self, message: Message) -> SendReceipt:
        """`send_async` as an awaitable."""
        return await asyncio.wrap_future(self.send_async(message))

    # --- per-group resends
    def can_send_to_group(self) -> bool:
        """Whether the broker accepts a per-group resend (`send_to_group`): the embedded
        broker does, our server unless started with `--no-group-resend` (its `group-resend`
        capability), an Apache RocketMQ proxy does not."""
        self._check_started()
        probe = getattr(self._transport, "group_resend_supported", None)
        return bool(probe()) if callable(probe) else False

    def send_to_group(self, message: Message, group: str) -> SendReceipt:
        """Send `message` again to consumer group `group` alone: to its retry topic
        `%RETRY%<group>`, the original topic in the `RETRY_TOPIC` property; the broker
        delivers it to that group only, under the original topic. The receipt names the
        retry topic and its queue. `GroupResendUnsupported` when the broker does not accept
        it (`can_send_to_group`); `GroupResendRefused` when it refuses this one."""
        check_group(group)
        if not self.can_send_to_group():
            raise GroupResendUnsupported(str(getattr(self._transport, "endpoint", "the broker")))
        copy = dataclasses.replace(
            message,
            topic=retry_topic(group),
            properties={**message.properties, Prop.RETRY_TOPIC: message.topic},
        )
        self._validate(copy)
        try:
            return self._send_with_policy(copy, self._sync_policy, transactional=False)
        except BadRequest as exc:
            raise GroupResendRefused(group, message.topic, str(exc), code=exc.code) from exc

    def send_oneway(self, message: Message) -> None:
        """One attempt, no receipt, no error: for messages that may be lost (logs, metrics)."""
        self._check_started()
        self._validate(message)
        try:
            route = self._route(message.topic)
            queue = self._select(route, message, None)
            self._transport.send(
                message, queue, producer_group=self.group, timeout_s=self._send_timeout_s
            )
        except Exception:
            log.debug("oneway send to %s failed", message.topic, exc_info=True)

    def send_batch(self, messages: Sequence[Message]) -> list[SendReceipt]:
        """Send messages of one topic together, to one queue (same retries as `send`)."""
        self._check_started()
        if not messages:
            raise InvalidMessage("a batch needs at least one message")
        topic = messages[0].topic
        for m in messages:
            self._validate(m)
            if m.topic != topic:
                raise InvalidMessage("every message of a batch must have the same topic")
            if m.delay_level is not None or m.deliver_at_ms is not None:
                raise InvalidMessage("batch messages cannot be delayed")
        groups = {m.message_group for m in messages}
        if len(groups) > 1:
            raise InvalidMessage("every message of a batch must have the same message group")
        attempts: list[tuple[str, BaseException]] = []
        last_broker: list[str | None] = [None]

        def attempt(i: int) -> list[SendReceipt]:
            route = self._route(topic)
            queue = self._select(route, messages[0], last_broker[0])
            last_broker[0] = queue.broker
            receipts: list[SendReceipt] = self._timed(
                queue,
                attempts,
                lambda: self._transport.send_batch(messages, queue, producer_group=self.group),
            )
            return receipts

        return self._run(topic, self._sync_policy, attempt, attempts)  # type: ignore[no-any-return]

    def recall(self, receipt_or_topic: SendReceipt | str, recall_handle: str | None = None) -> str:
        """Cancel a delayed message before it is due: `recall(receipt)` or
        `recall(topic, receipt.recall_handle)`. Returns its message id. No consumer ever
        sees a recalled message (the broker's schedule service drops it). `BadRequest` when
        the handle is malformed, for another topic, or the message was already delivered."""
        self._check_started()
        if isinstance(receipt_or_topic, SendReceipt):
            topic, handle = receipt_or_topic.topic, receipt_or_topic.recall_handle
        else:
            topic, handle = receipt_or_topic, recall_handle
        if not handle:
            raise InvalidMessage(
                "nothing to recall: only a delayed message's receipt carries a recall handle"
            )
        return self._transport.recall(topic, handle)

    def send_in_transaction(
        self, message: Message, execute: LocalTransaction, arg: Any = None
    ) -> TransactionSendResult:
        """Send a half message, run `execute(message, arg)`, then commit or roll back.

        `execute` returns a `TransactionState` (or True/False). If it raises or returns
        UNKNOWN, the half message stays pending and the broker asks this producer's
        `transaction_checker` later.
        """
        self._check_started()
        if self._checker is None:
            raise ConfigurationError("transactional sends need a transaction_checker")
        self._validate(message)
        if message.delay_level is not None or message.deliver_at_ms is not None:
            raise InvalidMessage("transactional messages cannot be delayed")
        receipt = self._send_with_policy(message, self._sync_policy, transactional=True)
        error: BaseException | None = None
        try:
            state = _to_state(execute(message, arg))
        except Exception as exc:
            log.warning(
                "local transaction of %s raised; left to the check-back",
                receipt.message_id,
                exc_info=True,
            )
            state, error = TransactionState.UNKNOWN, exc
        if state is not TransactionState.UNKNOWN:
            ref = TransactionRef(
                message.topic, receipt.message_id, receipt.transaction_id, receipt.offset_msg_id
            )
            try:
                self._transport.end_transaction(self.group, ref, state)
            except Exception:
                log.warning(
                    "ending transaction %s failed; the check-back will resolve it",
                    receipt.message_id,
                    exc_info=True,
                )
        return TransactionSendResult(receipt, state, error)

    # --- internals
    def _check_started(self) -> None:
        if not self._started:
            raise ClientStateError("the producer is not started")

    def _validate(self, m: Message) -> None:
        check_topic(m.topic)
        if not isinstance(m.body, _BODY_TYPES):
            raise InvalidMessage(f"body must be bytes, got {type(m.body).__name__}")
        if len(m.body) == 0:
            raise InvalidMessage("message body is empty")
        if m.delay_level is not None and m.delay_level < 1:
            raise InvalidMessage(f"delay_level must be >= 1, got {m.delay_level}")
        if m.delay_level is not None and m.deliver_at_ms is not None:
            raise InvalidMessage("set delay_level or deliver_at_ms, not both")
        if m.message_group is not None and (m.delay_level or m.deliver_at_ms):
            raise InvalidMessage("ordered messages cannot be delayed")

    def _route(self, topic: str) -> TopicRoute:
        route = self._transport.route(topic)
        if not route.write_queues:
            raise NoRoute(topic, transitional=topic in self._written)
        if topic not in self._written:
            self._written.add(topic)  # set.add is atomic: no lock for concurrent senders
        return route

    def _next_index(self) -> int:
        with self._index_lock:
            self._index = (self._index + 1) & 0x7FFFFFFF
            return self._index

    def _select(self, route: TopicRoute, message: Message, last_broker: str | None) -> QueueRef:
        queues = route.write_queues
        if message.message_group is not None:  # ordered: a group always maps to one queue
            return queues[zlib.crc32(message.message_group.encode()) % len(queues)]
        start = self._next_index()
        candidates = [queues[(start + i) % len(queues)] for i in range(len(queues))]
        if self._faults is not None:
            for q in candidates:
                if self._faults.is_available(q.broker) and q.broker != last_broker:
                    return q
            for q in candidates:
                if self._faults.is_available(q.broker):
                    return q
            best = self._faults.pick_least_bad([q.broker for q in candidates])
            return next(q for q in candidates if q.broker == best)
        if last_broker is not None:
            for q in candidates:
                if q.broker != last_broker:
                    return q
        return candidates[0]

    def _timed(
        self, queue: QueueRef, attempts: list[tuple[str, BaseException]], call: Callable[[], R]
    ) -> R:
        t0 = self._clock_ms()
        try:
            result = call()
        except BrokerCallError as exc:
            attempts.append((str(queue), exc))
            if self._faults is not None and exc.kind is not FailureKind.BAD_REQUEST:
                self._faults.update(queue.broker, self._clock_ms() - t0, isolation=True)
            raise
        if self._faults is not None:
            self._faults.update(queue.broker, self._clock_ms() - t0)
        return result

    def _send_with_policy(
        self, message: Message, policy: SendPolicy, transactional: bool
    ) -> SendReceipt:
        attempts: list[tuple[str, BaseException]] = []
        last_broker: list[str | None] = [None]

        def attempt(i: int) -> SendReceipt:
            route = self._route(message.topic)
            queue = self._select(route, message, last_broker[0])
            last_broker[0] = queue.broker
            receipt: SendReceipt = self._timed(
                queue,
                attempts,
                lambda: self._transport.send(
                    message,
                    queue,
                    producer_group=self.group,
                    transactional=transactional,
                    timeout_s=self._send_timeout_s,
                ),
            )
            status = receipt.status
            if status is not SendStatus.SEND_OK and (
                policy.retry_not_stored_ok or status.not_replicated
            ):
                attempts.append((str(queue), _NotStoredOk(receipt)))
                raise _NotStoredOk(receipt)
            return receipt

        return self._run(message.topic, policy, attempt, attempts)  # type: ignore[no-any-return]

    def _run(
        self,
        topic: str,
        policy: SendPolicy,
        attempt: Callable[[int], Any],
        attempts: list[tuple[str, BaseException]],
    ) -> Any:
        try:
            return call_with_policy(policy, attempt)
        except _NotStoredOk as exc:
            return exc.receipt  # every attempt stored it, none as asked: report the last
        except BrokerCallError as exc:
            if exc.kind is FailureKind.BAD_REQUEST:
                raise
            if not attempts or attempts[-1][1] is not exc:  # failed before a send: the route
                attempts.append((f"route of {topic}", exc))
            raise SendFailed(topic, attempts) from exc
