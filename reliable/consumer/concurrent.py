"""Concurrent consumption over pulled queues: any thread, any order, failures sent back."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from reliable.consumer.listener import ConsumeContext, MessageListener, MessageModel
from reliable.consumer.offset_store import OffsetStore
from reliable.consumer.process_queue import ProcessQueue
from reliable.consumer.settings import ConsumerSettings
from reliable.consumer.workers import Workers
from reliable.message import ConsumeResult, ReceivedMessage
from reliable.transport.base import PullTransport, QueueRef

log = logging.getLogger(__name__)


def call_listener(
    listener: MessageListener, msgs: Sequence[ReceivedMessage], ctx: ConsumeContext
) -> ConsumeResult:
    """A listener that raises asked for a retry; anything but SUCCESS is a retry."""
    try:
        result = listener(list(msgs), ctx)
    except Exception:  # the listener's failure is a retry, not our crash
        log.warning(
            "listener of %s raised; will retry %s",
            ctx.group,
            [m.message_id for m in msgs],
            exc_info=True,
        )
        return ConsumeResult.RECONSUME_LATER
    if result is None:  # a plain function that returned nothing succeeded
        return ConsumeResult.SUCCESS
    if not isinstance(result, ConsumeResult):
        log.error("listener returned %r, not a ConsumeResult; treated as a retry", result)
        return ConsumeResult.RECONSUME_LATER
    return result


class PulledQueueService:
    """What every consume service over pulled queues works with (concurrent and orderly)."""

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
        self._transport = transport
        self._group = group
        self._listener = listener
        self._s = settings
        self._offsets = offsets
        self._executor = executor
        self._stopped = stopped


class ConcurrentConsumeService(PulledQueueService):
    def __init__(
        self,
        transport: PullTransport,
        group: str,
        listener: MessageListener,
        settings: ConsumerSettings,
        offsets: OffsetStore,
        executor: Workers,
        stopped: threading.Event,
        on_consumed: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(transport, group, listener, settings, offsets, executor, stopped)
        self._on_consumed = on_consumed
        self._timers: set[threading.Timer] = set()
        self._timers_lock = threading.Lock()

    def submit(self, pq: ProcessQueue, queue: QueueRef, msgs: Sequence[ReceivedMessage]) -> None:
        size = self._s.consume_batch_size
        for i in range(0, len(msgs), size):
            chunk = list(msgs[i : i + size])
            try:
                self._executor.submit(self._consume, pq, queue, chunk)
            except RuntimeError:  # executor shut down: the messages stay uncommitted
                return

    def _consume(self, pq: ProcessQueue, queue: QueueRef, msgs: list[ReceivedMessage]) -> None:
        if pq.dropped or self._stopped.is_set():
            return
        ctx = ConsumeContext(group=self._group, queue=queue)
        result = call_listener(self._listener, msgs, ctx)
        if pq.dropped:  # rebalanced away while consuming: the new owner redelivers
            return
        retry_locally: list[ReceivedMessage] = []
        if result is not ConsumeResult.SUCCESS:
            if self._s.message_model is MessageModel.BROADCASTING:
                log.warning(
                    "broadcast consumer of %s dropped %d failed message(s)", self._group, len(msgs)
                )
            else:
                for m in msgs[max(0, min(ctx.succeeded, len(msgs))) :]:
                    try:
                        self._transport.send_back(
                            self._group,
                            m,
                            ctx.delay_level_when_next_consume,
                            self._s.max_reconsume_times,
                        )
                    except Exception as exc:  # retried locally below
                        log.warning(
                            "send-back of %s failed; retrying locally in %ss: %r",
                            m.message_id,
                            self._s.send_back_retry_s,
                            exc,
                            exc_info=log.isEnabledFor(logging.DEBUG),
                        )
                        m.reconsume_times += 1
                        retry_locally.append(m)
        kept = {id(m) for m in retry_locally}
        done = [m for m in msgs if id(m) not in kept]
        self._offsets.update(queue, pq.remove(done), of=pq)
        if retry_locally:
            self._later(pq, queue, retry_locally)
        if self._on_consumed is not None:
            self._on_consumed()

    def _later(self, pq: ProcessQueue, queue: QueueRef, msgs: list[ReceivedMessage]) -> None:
        def fire() -> None:
            with self._timers_lock:
                self._timers.discard(timer)
            if not self._stopped.is_set():
                self.submit(pq, queue, msgs)

        timer = threading.Timer(self._s.send_back_retry_s, fire)
        timer.daemon = True
        with self._timers_lock:
            self._timers.add(timer)
        timer.start()

    def shutdown(self) -> None:
        with self._timers_lock:
            for t in self._timers:
                t.cancel()
            self._timers.clear()
