"""Orderly consumption over pulled queues: one thread per queue, in offset order.

A failure suspends the queue (`suspend_ms`, 3 s by default) and retries locally instead of
sending the message back. RocketMQ retries a poison message forever and freezes the queue; we
cap the attempts at `max_reconsume_times` and then *park* only the failing message group: the
message, and every later message of the same group on this queue, goes to `%DLQ%<group>`
(readable by operators and by reconciliation, marked `PARKED_MESSAGE_GROUP`), while every
other group keeps its order. With the in-process broker the park is the broker's durable
record, which the transport offers as `Capability.PARKED_GROUPS`: it holds across restarts
and rebalances until an operator unparks the group.
"""

from __future__ import annotations

import logging
import threading

from reliable.consumer.concurrent import PulledQueueService, call_listener
from reliable.consumer.listener import DLQ_NOW, ConsumeContext, MessageListener, MessageModel
from reliable.consumer.offset_store import OffsetStore
from reliable.consumer.process_queue import ProcessQueue
from reliable.consumer.settings import ConsumerSettings
from reliable.consumer.workers import Workers
from reliable.message import ConsumeResult, ReceivedMessage
from reliable.transport.base import (
    ParkedGroupRecord,
    PullTransport,
    QueueRef,
    Transport,
    parked_group_record,
)

log = logging.getLogger(__name__)

PARKED_PROPERTY = "PARKED_MESSAGE_GROUP"


def group_key(m: ReceivedMessage) -> str:
    return m.message_group or ""


def _registry(transport: Transport) -> ParkedGroupRecord | None:
    """The broker's parked-group record, when the transport offers it (the embedded one)."""
    return parked_group_record(transport)


def parks_in_broker(transport: Transport) -> bool:
    """True when dead-lettering with `PARKED_PROPERTY` parks the group in the broker."""
    return _registry(transport) is not None


class OrderlyConsumeService(PulledQueueService):
    def __init__(
        self,
        transport: PullTransport,
        group: str,
        listener: MessageListener,
        settings: ConsumerSettings,
        offsets: OffsetStore,
        executor: Workers,
        stopped: threading.Event,
    ) -> None:
        super().__init__(transport, group, listener, settings, offsets, executor, stopped)
        self._parked: dict[QueueRef, set[str]] = {}
        self._sched = threading.Lock()

    def shutdown(self) -> None:
        """Nothing scheduled to cancel: suspended queues wake on the stop event."""

    def _parked_now(self, queue: QueueRef) -> set[str]:
        """The message groups parked on `queue`: the broker's durable record when the
        transport runs the broker in this process (it survives restarts and rebalances and
        ends when an operator unparks), else this consumer's own."""
        registry = _registry(self._transport)
        if registry is not None:
            return set(registry.parked_groups(self._group, queue.topic))
        return self._parked.setdefault(queue, set())

    def submit(self, pq: ProcessQueue, queue: QueueRef, msgs: object = None) -> None:
        with self._sched:
            if pq.consuming:
                return
            pq.consuming = True
        try:
            self._executor.submit(self._run, pq, queue)
        except RuntimeError:
            pq.consuming = False

    def _run(self, pq: ProcessQueue, queue: QueueRef) -> None:
        single = False
        with pq.consume_lock:
            while not pq.dropped and not self._stopped.is_set():
                with self._sched:
                    if not pq.has_pending():
                        pq.consuming = False
                        return
                msgs = pq.take(1 if single else self._s.consume_batch_size)
                single = self._consume(pq, queue, msgs)
            pq.consuming = False

    def _consume(self, pq: ProcessQueue, queue: QueueRef, msgs: list[ReceivedMessage]) -> bool:
        """Consume one taken batch; return True when the next take must be a single message."""
        parked = self._parked_now(queue)
        live = [m for m in msgs if group_key(m) not in parked]
        done: list[ReceivedMessage] = []
        for m in msgs:
            if group_key(m) not in parked:
                continue
            if not self._park(m):  # later messages of a parked group follow it to the DLQ
                pq.discard_taken(done)
                pq.put_back([x for x in msgs if all(x is not d for d in done)])
                self._stopped.wait(self._s.suspend_ms / 1000)
                return True
            done.append(m)
        if done:
            pq.discard_taken(done)
            msgs = live
        if live:
            ctx = ConsumeContext(group=self._group, queue=queue, orderly=True)
            result = call_listener(self._listener, live, ctx)
            if pq.dropped:
                return False
            if result is not ConsumeResult.SUCCESS:
                return self._failed(pq, queue, live, msgs, ctx)
        self._offsets.update(queue, pq.commit_taken(), of=pq)
        return False

    def _failed(
        self,
        pq: ProcessQueue,
        queue: QueueRef,
        live: list[ReceivedMessage],
        taken: list[ReceivedMessage],
        ctx: ConsumeContext,
    ) -> bool:
        ok = live[: max(0, min(ctx.succeeded, len(live) - 1))]
        if ok:  # the head of the batch succeeded: finish it, retry only the rest
            pq.discard_taken(ok)
            self._offsets.update(queue, pq.commit_offset(), of=pq)
            live = live[len(ok) :]
            taken = [m for m in taken if all(m is not o for o in ok)]
        head = live[0]
        give_up = (
            ctx.delay_level_when_next_consume == DLQ_NOW
            or head.reconsume_times >= self._s.max_reconsume_times
        )
        if len(live) > 1 and not give_up:
            # retry one at a time so the attempt cap applies to the failing message alone
            pq.put_back(taken)
            return True
        if give_up:
            key = group_key(head)
            if self._s.message_model is MessageModel.CLUSTERING:
                log.error(
                    "orderly consumer %s parks message group %r of %s after %d "
                    "attempt(s) (message %s)",
                    self._group,
                    key,
                    queue,
                    head.reconsume_times + 1,
                    head.message_id,
                )
                if not self._park(head):
                    pq.put_back(taken)
                    self._stopped.wait(self._s.suspend_ms / 1000)
                    return True
                self._parked.setdefault(queue, set()).add(key)
            else:
                log.error(
                    "broadcast orderly consumer %s drops %s after %d attempt(s)",
                    self._group,
                    head.message_id,
                    head.reconsume_times + 1,
                )
            live_ids = {id(m) for m in live}
            finished = [m for m in taken if m is head or id(m) not in live_ids]
            pq.discard_taken(finished)
            pq.put_back([m for m in taken if id(m) in live_ids and m is not head])
            self._offsets.update(queue, pq.commit_offset(), of=pq)
            return True
        for m in live:
            m.reconsume_times += 1
        pq.put_back(taken)
        suspend = ctx.suspend_ms if ctx.suspend_ms is not None else self._s.suspend_ms
        self._stopped.wait(suspend / 1000)
        return True

    def _park(self, m: ReceivedMessage) -> bool:
        try:
            m.properties[PARKED_PROPERTY] = group_key(m)
            self._transport.send_back(self._group, m, DLQ_NOW, self._s.max_reconsume_times)
            return True
        except Exception as exc:  # retried after a suspension
            log.warning(
                "parking %s failed; retrying: %r",
                m.message_id,
                exc,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
            return False
