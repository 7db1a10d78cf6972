"""The push consumer's engine over a pull transport: rebalance, one puller per queue,
process queues, offset persistence.

Clustering: the subscribed topics plus `%RETRY%<group>` are split among the group's live
consumers by the allocation strategy, recomputed every `rebalance_interval_s` (and at start).
Broadcasting: every consumer takes every queue, with its own offsets.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Mapping
from typing import cast

from reliable import tracing
from reliable.consumer.concurrent import ConcurrentConsumeService
from reliable.consumer.listener import MessageListener, MessageModel
from reliable.consumer.offset_store import LocalOffsetStore, OffsetStore, RemoteOffsetStore
from reliable.consumer.orderly import OrderlyConsumeService
from reliable.consumer.process_queue import ProcessQueue
from reliable.consumer.settings import ConsumerSettings
from reliable.consumer.workers import Workers
from reliable.errors import BrokerCallError
from reliable.transport.base import (
    Capability,
    ConsumeFrom,
    MembershipEvents,
    PullStatus,
    PullTransport,
    QueueRef,
)

log = logging.getLogger(__name__)


class PullEngine:
    def __init__(
        self,
        transport: PullTransport,
        group: str,
        client_id: str,
        subscriptions: Mapping[str, Collection[str] | None],
        listener: MessageListener,
        settings: ConsumerSettings,
    ) -> None:
        self._t = transport
        self._group = group
        self._client_id = client_id
        self._s = settings
        self._subs: dict[str, Collection[str] | None] = dict(subscriptions)
        if settings.message_model is MessageModel.CLUSTERING:
            self._subs.setdefault(transport.retry_topic(group), None)
        self._stopped = threading.Event()
        self._executor = Workers(settings.consume_threads, thread_name_prefix=f"consume-{group}")
        self.offsets: OffsetStore = (
            RemoteOffsetStore(transport, group)
            if settings.message_model is MessageModel.CLUSTERING
            else LocalOffsetStore(settings.local_offset_path)
        )
        self._service: ConcurrentConsumeService | OrderlyConsumeService
        if settings.orderly:
            self._service = OrderlyConsumeService(
                transport, group, listener, settings, self.offsets, self._executor, self._stopped
            )
        else:
            self._service = ConcurrentConsumeService(
                transport,
                group,
                listener,
                settings,
                self.offsets,
                self._executor,
                self._stopped,
                self._wake_pullers,
            )
        self._pqs: dict[QueueRef, ProcessQueue] = {}
        self._pullers: dict[QueueRef, threading.Thread] = {}
        self._lock = threading.RLock()
        self._room = threading.Condition()
        self._room_waiters = 0  # pullers waiting for room (back-pressure)
        self._maint: threading.Thread | None = None
        self._kick = threading.Event()  # membership changed: rebalance now

    # --- lifecycle
    def start(self) -> None:
        if Capability.MEMBERSHIP_EVENTS in self._t.capabilities:
            cast(MembershipEvents, self._t).watch_consumers(
                self._group, self._client_id, self._membership_changed
            )
        self._heartbeat()
        self.rebalance()
        self._maint = threading.Thread(
            target=self._maintain, name=f"maint-{self._group}", daemon=True
        )
        self._maint.start()

    def shutdown(self) -> None:
        self._stopped.set()
        self._kick.set()
        if Capability.MEMBERSHIP_EVENTS in self._t.capabilities:
            cast(MembershipEvents, self._t).watch_consumers(self._group, self._client_id, None)
        self._wake_pullers()
        if self._maint is not None:
            self._maint.join(self._s.shutdown_timeout_s)
        for t in list(self._pullers.values()):
            t.join(self._s.shutdown_timeout_s)
        self._service.shutdown()
        # in-flight handlers finish; queued-but-unstarted batches stay uncommitted (redelivered)
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.offsets.persist_all()
        try:
            self._t.unregister(self._client_id, self._group)
        except Exception as exc:  # the broker forgets us by heartbeat expiry anyway
            log.warning(
                "unregistering %s failed: %r",
                self._client_id,
                exc,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )

    @property
    def assigned(self) -> list[QueueRef]:
        with self._lock:
            return sorted(self._pqs)

    # --- maintenance: heartbeat, rebalance, offset persistence
    def _membership_changed(self, group: str) -> None:
        self._kick.set()

    def _maintain(self) -> None:
        s = self._s
        periods = {
            "hb": s.heartbeat_interval_s,
            "rb": s.rebalance_interval_s,
            "po": s.persist_offset_interval_s,
        }
        tick = min([p for p in periods.values() if p > 0] or [1.0])
        due = {k: time.monotonic() + p for k, p in periods.items()}
        while not self._stopped.is_set():
            kicked = self._kick.wait(tick)
            if self._stopped.is_set():
                return
            now = time.monotonic()
            try:
                if now >= due["hb"]:
                    due["hb"] = now + periods["hb"]
                    self._heartbeat()
                if kicked or now >= due["rb"]:
                    self._kick.clear()
                    due["rb"] = now + periods["rb"]
                    self.rebalance()
                if now >= due["po"]:
                    due["po"] = now + periods["po"]
                    self.offsets.persist_all()
            except Exception as exc:  # the next tick tries again
                log.warning(
                    "consumer %s maintenance failed: %r",
                    self._group,
                    exc,
                    exc_info=log.isEnabledFor(logging.DEBUG),
                )

    def _heartbeat(self) -> None:
        self._t.heartbeat(self._client_id, self._group, self._subs)

    def rebalance(self) -> None:
        if self._stopped.is_set():
            return
        wanted: set[QueueRef] = set()
        for topic in self._subs:
            try:
                queues = list(self._t.route(topic).read_queues)
            except BrokerCallError:
                continue  # the topic does not exist yet (a retry topic before any failure)
            if self._s.message_model is MessageModel.BROADCASTING:
                wanted.update(queues)
            else:
                cids = self._t.consumer_ids(self._group)
                if self._client_id not in cids:
                    cids = [*cids, self._client_id]
                wanted.update(self._s.allocate(self._client_id, queues, cids))
        with self._lock:
            for q in [q for q in self._pqs if q not in wanted]:
                self._drop(q)
            for q in sorted(wanted - set(self._pqs)):
                self._add(q)

    def _drop(self, q: QueueRef) -> None:
        pq = self._pqs.pop(q)
        pq.dropped = True
        self._wake_pullers()
        try:
            self.offsets.persist(q)
        except Exception as exc:
            log.warning(
                "persisting offset of %s failed: %r",
                q,
                exc,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
        self.offsets.remove(q)
        self._pullers.pop(q, None)
        log.info("consumer %s released %s", self._client_id, q)

    def _start_offset(self, q: QueueRef) -> int:
        offset = self.offsets.read(q)
        if offset >= 0:
            return offset
        where = self._s.consume_from
        if q.topic == self._t.retry_topic(self._group):
            where = ConsumeFrom.FIRST
        offset = self._t.initial_offset(self._group, q, where, self._s.consume_timestamp_ms)
        self.offsets.update(q, offset)
        return offset

    def _add(self, q: QueueRef) -> None:
        try:
            offset = self._start_offset(q)
        except Exception as exc:  # taken at the next rebalance
            log.warning(
                "no start offset for %s yet: %r", q, exc, exc_info=log.isEnabledFor(logging.DEBUG)
            )
            return
        pq = ProcessQueue()
        self._pqs[q] = pq
        t = threading.Thread(
            target=self._pull_loop, args=(q, pq, offset), name=f"pull-{q}", daemon=True
        )
        self._pullers[q] = t
        t.start()
        log.info("consumer %s took %s from offset %d", self._client_id, q, offset)

    # --- pulling
    def _wake_pullers(self) -> None:
        # called after every consumed batch: skip the lock when no puller waits for room
        # (a puller that starts waiting just now wakes by its own timeout anyway)
        if self._room_waiters or self._stopped.is_set():
            with self._room:
                self._room.notify_all()

    def _pull_loop(self, q: QueueRef, pq: ProcessQueue, offset: int) -> None:
        s = self._s
        tags = self._subs.get(q.topic)
        while not self._stopped.is_set() and not pq.dropped:
            if pq.cached_count >= s.pull_threshold_for_queue:
                with self._room:  # back-pressure: wait for the consumers to make room
                    self._room_waiters += 1
                    try:
                        self._room.wait(0.05)
                    finally:
                        self._room_waiters -= 1
                continue
            started_ns = time.time_ns()
            try:
                batch = self._t.pull(
                    self._group, q, offset, s.pull_batch_size, tags, suspend_ms=s.pull_suspend_ms
                )
            except Exception as exc:  # a broken pull is retried after a pause
                log.warning(
                    "pull of %s at %d failed: %r",
                    q,
                    offset,
                    exc,
                    exc_info=log.isEnabledFor(logging.DEBUG),
                )
                self._stopped.wait(s.pull_error_delay_s)
                continue
            if pq.dropped or self._stopped.is_set():
                return
            if batch.status is PullStatus.FOUND and batch.messages:
                for m in batch.messages:
                    m.consumer_group = self._group
                if tracing.enabled():
                    tracing.received(
                        q.topic, self._group, [m.message_id for m in batch.messages], started_ns
                    )
                pq.put(batch.messages)
                self._service.submit(pq, q, batch.messages)
            elif batch.status is not PullStatus.NO_NEW_MSG and pq.cached_count == 0:
                # filtered-out units or a corrected offset: nothing in flight holds it back
                self.offsets.update(q, batch.next_offset, increase_only=False, of=pq)
            offset = batch.next_offset
