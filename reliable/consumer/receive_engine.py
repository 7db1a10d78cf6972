"""The push consumer's engine over invisible-time consumption (transports without pull,
such as a RocketMQ 5 gRPC endpoint; it runs over the embedded transport too).

The broker keeps delivery state. Success acks; a retry hides the message again for the delay
of the level the handler asked for (default: the ladder, level 3 + reconsume times); DLQ-now
forwards it to the dead-letter queue. The broker dead-letters a message on its own after the
group's maximum delivery attempts. Orderly mode receives with `fifo=True` (the broker never
hands out message k+1 of a group while k is in flight), consumes each message group of a
batch in order, retries locally (`suspend_ms`) up to `max_reconsume_times`, then parks the
message's group: it and every later message of the group go to the DLQ (see orderly.py).

Receiving keeps flowing while handlers run: the next batch is fetched as soon as there is
room (received and not yet settled, bounded as below). Acks leave in batches
(`reliable._acks.AckBatcher`: one AckMessage with repeated entries, a short linger), without
the handler thread waiting for them; an ack whose entry fails is retried alone. Retry delays
(change of invisible duration) are pipelined likewise.

Leases: a server that keeps leases itself (`Capability.SERVER_LEASES`, our gRPC server and
the Apache proxy: `auto_renew` receives) keeps received messages invisible while this client
lives and releases them when it leaves (NotifyClientTermination) or its connection drops.
Elsewhere the engine renews them: a message still leased when half of its invisible time is
left is hidden again for `invisible_ms` (the receipt handle changes; acks and renewals of one
message never overlap).

Prefetch is bounded by what the handlers can take soon (twice `consume_threads` x
`consume_batch_size`: their current round and the next, at most `pull_threshold_for_queue`),
so a stopped or dead consumer holds little. `shutdown` releases every received message no
handler has started (visible again at once), lets running handlers finish and settle, then
leaves the group; another consumer of the group takes the rest over at once.

Direct delivery: over a transport with `Capability.DIRECT_CONSUME` the engine runs its
listener on a message the server hands to this client alone (`reliable admin message
reconsume --client`) and answers with the verdict; nothing is acked or retried for it.

A new group starts where `consume_from` says: the engine sets the group's start on each
subscribed topic before its first receive (`Capability.GROUP_ADMIN`, or the offsets of a
transport that can pull); queues the group already consumed keep their offset. A server
that cannot set it (an Apache RocketMQ proxy) refuses any start but `LAST` at `start()`.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Protocol, cast, runtime_checkable

from reliable import tracing
from reliable._acks import PUSH_ACK_LINGER_MS, AckBatcher, change_invisible_async
from reliable.consumer.concurrent import call_listener
from reliable.consumer.listener import DLQ_NOW, ConsumeContext, MessageListener
from reliable.consumer.orderly import PARKED_PROPERTY, group_key, parks_in_broker
from reliable.consumer.settings import ConsumerSettings
from reliable.consumer.workers import Workers
from reliable.errors import BrokerCallError, ConfigurationError, ReceiptHandleError
from reliable.message import ConsumeResult, ReceivedMessage
from reliable.transport.base import (
    Capability,
    ConsumeFrom,
    DirectConsume,
    DirectListener,
    GroupAdmin,
    PullTransport,
    ServerLeases,
    Transport,
    can_pull,
)

log = logging.getLogger(__name__)


@runtime_checkable
class ReportsGroupFifo(Protocol):
    """A transport that knows whether the server delivers a group FIFO (a gRPC server's
    Settings say so): True, False, or None before the server has said."""

    def group_is_fifo(self, group: str) -> bool | None: ...


class _Lease:
    __slots__ = ("lock", "message", "released", "renew_at", "started")

    def __init__(self, message: ReceivedMessage, renew_at: float) -> None:
        self.message = message
        self.renew_at = renew_at
        self.lock = threading.Lock()  # a renewal and an ack of one message never overlap
        self.started = False  # a handler has it: settled by the handler, never released
        self.released = False  # given back at shutdown: no handler may start it


class ReceiveEngine:
    # receive calls in flight per topic on a remote broker: while one waits for the server,
    # the batch of the other is being handed to the handlers (both bounded by the same
    # room); in-process there is no wait to overlap, and two loops only contend
    receive_loops = 2

    def __init__(
        self,
        transport: Transport,
        group: str,
        client_id: str,
        subscriptions: Mapping[str, Collection[str] | None],
        listener: MessageListener,
        settings: ConsumerSettings,
    ) -> None:
        self._t = transport
        self._group = group
        self._client_id = client_id
        self._subs = dict(subscriptions)
        self._listener = listener
        # a listener's `prepare` (PreparingListener) sees each received batch first; not
        # for ordered runs, whose messages wait for each other
        self._prepare: Callable[[list[ReceivedMessage]], None] | None = (
            None if settings.orderly else getattr(listener, "prepare", None)
        )
        self._s = settings
        self._stopped = threading.Event()
        # as many threads as the handlers' waits need, up to consume_threads (workers.py)
        self._executor = Workers(settings.consume_threads, thread_name_prefix=f"consume-{group}")
        self._server_leases = Capability.SERVER_LEASES in transport.capabilities
        # the handlers' current round and the next: one round alone leaves them idle while
        # a receive is on the wire (measured: ~0.6x the throughput with fast handlers)
        self._prefetch = min(
            settings.pull_threshold_for_queue,
            2 * settings.consume_threads * settings.consume_batch_size,
        )
        self._room = threading.BoundedSemaphore(self._prefetch)
        # a receive waits for room for this many while every handler thread still has a
        # message: one receive a message (what a free slot at a time gives) cost the
        # consumer a round trip each; ordered runs may leave threads idle behind one
        # message group, so they receive as soon as there is room
        handling = settings.consume_threads * settings.consume_batch_size
        self._least = 1 if settings.orderly else max(1, self._prefetch - handling)
        self._gathering = threading.Lock()  # one receive loop gathers room at a time
        self._threads: list[threading.Thread] = []
        self._leases: dict[int, _Lease] = {}  # id(message) -> its lease
        self._lease_lock = threading.Lock()  # guards the dict; each lease has its own lock
        self._parked: set[tuple[str, str]] = set()  # orderly: (topic, message group) parked
        self._acks = AckBatcher(
            transport, group, linger_ms=PUSH_ACK_LINGER_MS, linger_when_idle=True
        )

    def start(self) -> None:
        self._set_direct_listener(self._consume_directly)
        made_fifo = self._make_group_fifo()
        self._t.heartbeat(self._client_id, self._group, self._subs)
        try:
            if not made_fifo:
                self._check_group_fifo()
            self._set_group_start()
        except ConfigurationError:  # refused to start: nothing left running
            self._set_direct_listener(None)
            raise
        for topic in self._subs:
            for i in range(1 if can_pull(self._t) else self.receive_loops):
                t = threading.Thread(
                    target=self._receive_loop,
                    args=(topic,),
                    name=f"receive-{topic}-{i}",
                    daemon=True,
                )
                self._threads.append(t)
                t.start()
        services = [(self._heartbeats, "hb")]
        if not self._server_leases:
            services.append((self._renew_leases, "renew"))
        for target, name in services:
            t = threading.Thread(target=target, name=f"{name}-{self._group}", daemon=True)
            self._threads.append(t)
            t.start()

    def _make_group_fifo(self) -> bool:
        """Orderly: the server orders a group's deliveries by message group only when the
        group is FIFO, so make it FIFO before the first receive (our server's admin
        service; elsewhere the group must be made FIFO by its operator). True when made."""
        if not self._s.orderly or Capability.GROUP_ADMIN not in self._t.capabilities:
            return False
        try:
            return bool(cast(GroupAdmin, self._t).make_group_fifo(self._group))
        except Exception as exc:
            log.warning(
                "could not make group %s FIFO (%s); create it with fifo "
                "(reliable admin group create %s --fifo)",
                self._group,
                exc,
                self._group,
            )
            return False

    def _check_group_fifo(self) -> None:
        """Orderly on a server that says (in its Settings) the group is not FIFO, such as
        an Apache RocketMQ group made without `-o true`: it would hand out a message group's
        messages side by side, so the consumer refuses to start rather than consume out of
        order."""
        if not self._s.orderly or not isinstance(self._t, ReportsGroupFifo):
            return
        if self._t.group_is_fifo(self._group) is False:
            raise ConfigurationError(
                f"orderly consumer of {self._group!r}: the server's group is not FIFO, so it "
                "would deliver each message group out of order; make the group FIFO "
                f"(mqadmin updateSubGroup -g {self._group} -o true; reliable admin group "
                f"create {self._group} --fifo) or consume it with orderly=False"
            )

    def _set_group_start(self) -> None:
        """Commit where a new group starts on each subscribed topic (a no-op for queues the
        group already consumed)."""
        where, ts = self._s.consume_from, self._s.consume_timestamp_ms
        unset: list[str] = []  # topics on a server that cannot set a group's start
        for topic in self._subs:
            try:
                if can_pull(self._t):
                    pull = cast(PullTransport, self._t)
                    for queue in pull.route(topic).read_queues:
                        pull.initial_offset(self._group, queue, where, ts)
                elif Capability.GROUP_ADMIN in self._t.capabilities:
                    admin = cast(GroupAdmin, self._t)
                    if not admin.set_group_start(self._group, topic, where, ts):
                        unset.append(topic)
            except BrokerCallError as exc:
                if exc.code == "TOPIC_NOT_FOUND":  # created later: everything in it is new
                    log.info(
                        "topic %s does not exist yet; group %s will read it from its start",
                        topic,
                        self._group,
                    )
                    continue
                log.warning(
                    "could not set where group %s starts on %s (%s); the broker's default applies",
                    self._group,
                    topic,
                    exc,
                )
            except Exception as exc:
                log.warning(
                    "could not set where group %s starts on %s (%s); the broker's default applies",
                    self._group,
                    topic,
                    exc,
                )
        if unset and where is not ConsumeFrom.LAST:
            if not self._s.consume_from_preferred:
                self._refuse_start(where, unset)
            log.warning(
                "group %s starts where the server's default puts a new group, not at %s: "
                "the server cannot set it (mqadmin resetOffsetByTime -g %s -t %s sets it)",
                self._group,
                where.name,
                self._group,
                unset[0],
            )

    def _refuse_start(self, where: ConsumeFrom, topics: list[str]) -> None:
        """A group start the server cannot set (an Apache RocketMQ proxy has no call for
        it): starting anyway would read from wherever the server's default puts a new
        group, so the consumer refuses, naming what to do instead."""
        raise ConfigurationError(
            f"consume_from={where.name} for group {self._group!r}: the server cannot set "
            "where a new group starts (it has no SetGroupStart, as on Apache RocketMQ), so "
            "the group would start where the server's default puts it; set the group's "
            f"offsets on the server (mqadmin resetOffsetByTime -g {self._group} -t "
            f"{topics[0]} -s TIMESTAMP_MS) and consume with consume_from=ConsumeFrom.LAST"
        )

    def _set_direct_listener(self, listener: DirectListener | None) -> None:
        """Direct delivery to this consumer (`Capability.DIRECT_CONSUME`), or None: none."""
        if Capability.DIRECT_CONSUME in self._t.capabilities:
            cast(DirectConsume, self._t).set_direct_listener(self._group, listener)

    def shutdown(self) -> None:
        """Release what no handler started, let running handlers finish, leave the group."""
        self._stopped.set()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._release_unstarted()
        self._executor.shutdown(wait=True)
        for t in self._threads:
            t.join(self._s.shutdown_timeout_s)
        self._release_unstarted()  # received while stopping
        self._acks.close(self._s.shutdown_timeout_s)  # the handlers' last acks leave
        self._set_direct_listener(None)
        try:
            self._t.unregister(self._client_id, self._group)
        except Exception as exc:
            log.warning(
                "unregistering %s failed: %r",
                self._client_id,
                exc,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )

    @property
    def assigned(self) -> list[object]:
        return []

    def _heartbeats(self) -> None:
        while not self._stopped.wait(self._s.heartbeat_interval_s or 10.0):
            try:
                self._t.heartbeat(self._client_id, self._group, self._subs)
            except Exception as exc:
                log.warning(
                    "heartbeat of %s failed: %r",
                    self._client_id,
                    exc,
                    exc_info=log.isEnabledFor(logging.DEBUG),
                )

    def _renew_leases(self) -> None:
        invisible = self._s.invisible_ms
        while not self._stopped.wait(max(invisible / 4000, 0.01)):
            now = time.monotonic()
            with self._lease_lock:
                due = [(k, lease) for k, lease in self._leases.items() if lease.renew_at <= now]
            for key, lease in due:
                with lease.lock:
                    if self._leases.get(key) is not lease:
                        continue  # settled meanwhile
                    try:
                        self._t.change_invisible_duration(self._group, lease.message, invisible)
                        lease.renew_at = time.monotonic() + invisible / 2000
                    except Exception as exc:
                        log.warning(
                            "renewing the lease of %s failed: %r",
                            lease.message.message_id,
                            exc,
                            exc_info=log.isEnabledFor(logging.DEBUG),
                        )
                        with self._lease_lock:
                            self._leases.pop(key, None)

    def _release_unstarted(self) -> None:
        with self._lease_lock:
            leases = list(self._leases.values())
        self._release([lease.message for lease in leases])

    def _release(self, msgs: list[ReceivedMessage], *, started_too: bool = False) -> None:
        """Give received messages back to the broker, visible at once: those no handler
        started (`started_too`: also those a handler left unsettled)."""
        for m in msgs:
            with self._lease_lock:
                lease = self._leases.get(id(m))
            if lease is None:
                continue
            with lease.lock:
                if (lease.started and not started_too) or self._leases.get(id(m)) is not lease:
                    continue
                lease.released = True
                with self._lease_lock:
                    self._leases.pop(id(m), None)
                try:
                    self._t.change_invisible_duration(self._group, m, 0)
                except Exception as exc:  # expired or settled: nothing to release
                    log.debug("release of %s skipped: %s", m.message_id, exc)

    def _start(self, m: ReceivedMessage) -> bool:
        """Claim a received message for a handler; False when it was released meanwhile."""
        with self._lease_lock:
            lease = self._leases.get(id(m))
        if lease is None:
            return not self._stopped.is_set()
        with lease.lock:
            if lease.released:
                return False
            lease.started = True
            return True

    def _lease(self, msgs: list[ReceivedMessage]) -> None:
        renew_at = time.monotonic() + self._s.invisible_ms / 2000
        with self._lease_lock:
            for m in msgs:
                self._leases[id(m)] = _Lease(m, renew_at)

    def _take_room(self, want: int) -> int:
        """Room for one receive: all there is up to `want`, and at least `_least` once
        any is free (while short of it, more than `consume_threads` messages are held, so
        every handler thread has one). 0 after 0.1 s without any, or when stopping."""
        with self._gathering:
            if not self._room.acquire(timeout=0.1):
                return 0
            got = 1
            least = min(want, self._least)
            while got < want and self._room.acquire(blocking=False):
                got += 1
            while got < least:
                if self._room.acquire(timeout=0.1):
                    got += 1
                elif self._stopped.is_set():
                    for _ in range(got):
                        self._room.release()
                    return 0
            return got

    def _receive_loop(self, topic: str) -> None:
        s = self._s
        tags = self._subs.get(topic)
        while not self._stopped.is_set():
            room = self._take_room(s.pull_batch_size)
            if room == 0:
                continue
            started_ns = time.time_ns()
            try:
                if self._server_leases:
                    msgs = cast(ServerLeases, self._t).receive(
                        self._group,
                        topic,
                        room,
                        s.invisible_ms,
                        tags,
                        long_poll_ms=s.receive_long_poll_ms,
                        fifo=s.orderly,
                        auto_renew=True,
                    )
                else:
                    msgs = self._t.receive(
                        self._group,
                        topic,
                        room,
                        s.invisible_ms,
                        tags,
                        long_poll_ms=s.receive_long_poll_ms,
                        fifo=s.orderly,
                    )
            except Exception as exc:
                log.warning(
                    "receive from %s failed: %r",
                    topic,
                    exc,
                    exc_info=log.isEnabledFor(logging.DEBUG),
                )
                msgs = []
                self._stopped.wait(s.pull_error_delay_s)
            for _ in range(room - len(msgs)):
                self._room.release()
            if not msgs:
                continue
            for m in msgs:
                m.consumer_group = self._group
            if tracing.enabled():
                tracing.received(topic, self._group, [m.message_id for m in msgs], started_ns)
            self._lease(msgs)
            if self._stopped.is_set():  # arrived while stopping: nobody will handle them
                self._release(msgs)
                continue
            if s.orderly:
                by_group: dict[str, list[ReceivedMessage]] = {}
                for m in msgs:
                    by_group.setdefault(group_key(m), []).append(m)
                for run in by_group.values():
                    self._submit(self._consume_fifo, run)
            else:
                if self._prepare is not None:
                    self._prepare_batch(self._prepare, msgs)
                for m in msgs:
                    self._submit(self._consume_one, [m])

    def _prepare_batch(
        self, prepare: Callable[[list[ReceivedMessage]], None], msgs: list[ReceivedMessage]
    ) -> None:
        try:
            prepare(msgs)
        except Exception as exc:  # each message is still handled on its own
            log.warning("preparing a batch of %s failed: %r", self._group, exc, exc_info=True)

    def _submit(
        self, fn: Callable[[list[ReceivedMessage]], None], msgs: list[ReceivedMessage]
    ) -> None:
        try:
            self._executor.submit(fn, msgs)
        except RuntimeError:  # shutting down: released for the next consumer
            self._finish(msgs)

    def _finish(self, msgs: list[ReceivedMessage]) -> None:
        """The handler is done with `msgs`: what it did not settle (stopped in the middle of
        an ordered run) is released for the next consumer."""
        self._release(msgs, started_too=True)
        with self._lease_lock:
            for m in msgs:
                self._leases.pop(id(m), None)
        for _ in msgs:
            self._room.release()

    def _consume_one(self, msgs: list[ReceivedMessage]) -> None:
        m = msgs[0]
        try:
            if not self._start(m):
                return
            ctx = ConsumeContext(group=self._group)
            result = call_listener(self._listener, [m], ctx)
            if result is ConsumeResult.SUCCESS:
                self._ack(m)
            elif (
                ctx.delay_level_when_next_consume == DLQ_NOW
                or m.reconsume_times >= self._s.max_reconsume_times
            ):
                # the consumer's own cap, whatever the broker's group setting allows
                self._settle(m, lambda: self._t.forward_to_dlq(self._group, m))
            else:
                level = ctx.delay_level_when_next_consume or 3 + m.reconsume_times
                self._nack(m, self._delay_ms(level))
        finally:
            self._finish(msgs)

    def _consume_directly(self, m: ReceivedMessage) -> tuple[bool, str]:
        """A message the server handed to this client alone (an operator's `reliable admin
        message reconsume --client`): the listener runs on it once, and whatever it returns
        nothing is acknowledged, retried or dead-lettered (the message is not leased to the
        group: RocketMQ's consumeMessageDirectly). (consumed, why not)."""
        if self._stopped.is_set():
            return False, f"the consumer of {self._group} is shutting down"
        ctx = ConsumeContext(group=self._group, orderly=self._s.orderly)
        try:
            result = self._listener([m], ctx)
        except Exception as exc:
            log.warning(
                "listener of %s raised on the direct delivery of %s",
                self._group,
                m.message_id,
                exc_info=True,
            )
            return False, f"the listener raised {type(exc).__name__}: {exc}"
        if result is None or result is ConsumeResult.SUCCESS:
            return True, ""
        if not isinstance(result, ConsumeResult):
            return False, f"the listener returned {result!r}, not a ConsumeResult"
        return False, f"the listener returned {result.name}"

    def _delay_ms(self, level: int) -> int:
        """The delay of a retry level, from the ladder as the broker states it *now*: over
        gRPC the server's ladder arrives with the Settings handshake, after the engine is
        built, so it is read at each retry rather than once."""
        levels = list(self._t.delay_levels_ms(self._group)) or [1000]
        return levels[min(max(level, 1), len(levels)) - 1]

    def _consume_fifo(self, msgs: list[ReceivedMessage]) -> None:
        try:
            for m in msgs:
                if self._stopped.is_set() or not self._start(m):
                    return  # released by _finish: redelivered in order at once
                if (m.topic, group_key(m)) in self._parked:  # follows its group to the DLQ
                    m.properties[PARKED_PROPERTY] = group_key(m)
                    self._settle(m, lambda m=m: self._t.forward_to_dlq(self._group, m))
                    continue
                for attempt in itertools.count():
                    ctx = ConsumeContext(group=self._group, orderly=True)
                    result = call_listener(self._listener, [m], ctx)
                    if result is ConsumeResult.SUCCESS:
                        self._ack(m)
                        break
                    if (
                        ctx.delay_level_when_next_consume == DLQ_NOW
                        or attempt >= self._s.max_reconsume_times
                    ):
                        log.error(
                            "orderly consumer %s parks message group %r of %s after %d "
                            "attempt(s) (message %s)",
                            self._group,
                            group_key(m),
                            m.topic,
                            attempt + 1,
                            m.message_id,
                        )
                        self._settle(m, lambda m=m: self._park(m))
                        break
                    m.reconsume_times += 1
                    suspend = ctx.suspend_ms if ctx.suspend_ms is not None else self._s.suspend_ms
                    if self._stopped.wait(suspend / 1000):
                        return
        finally:
            self._finish(msgs)

    def _park(self, m: ReceivedMessage) -> None:
        """Park `m`'s message group, then dead-letter `m`. The broker keeps the park when it
        can (the in-process broker, our server's `ParkMessageGroup`) and dead-letters the
        group's later messages for every consumer of the group; otherwise (an Apache proxy)
        this consumer keeps it and forwards them itself until it stops."""
        key = group_key(m)
        m.properties[PARKED_PROPERTY] = key
        kept = parks_in_broker(self._t)  # the in-process broker parks on the forward
        if key and not kept and Capability.GROUP_ADMIN in self._t.capabilities:
            kept = cast(GroupAdmin, self._t).park_message_group(self._group, m.topic, key)
        if not kept:  # the broker cannot: this consumer keeps it (until it stops)
            self._parked.add((m.topic, key))
        self._t.forward_to_dlq(self._group, m)

    def _release_lease(self, m: ReceivedMessage) -> None:
        with self._lease_lock:
            lease = self._leases.pop(id(m), None)
        if lease is not None:
            with lease.lock:  # a renewal in progress finishes first: settle with its handle
                pass

    def _ack(self, m: ReceivedMessage, attempts: int = 5) -> None:
        """Hand the ack to the batcher; the handler thread does not wait for it."""
        self._release_lease(m)
        try:
            future = self._acks.ack(m)
        except Exception:  # shutting down: the broker redelivers after the invisible time
            log.warning("ack of %s dropped at shutdown", m.message_id)
            return
        future.add_done_callback(
            lambda f: self._settled(
                m, f.exception(), "acking", lambda: self._ack(m, attempts - 1), attempts - 1
            )
        )

    def _nack(self, m: ReceivedMessage, delay_ms: int, attempts: int = 5) -> None:
        """Hide the message for its retry delay, pipelined: the handler thread goes on."""
        self._release_lease(m)
        future = change_invisible_async(self._t, self._group, m, delay_ms)
        future.add_done_callback(
            lambda f: self._settled(
                m,
                f.exception(),
                "hiding",
                lambda: self._nack(m, delay_ms, attempts - 1),
                attempts - 1,
            )
        )

    def _settled(
        self,
        m: ReceivedMessage,
        error: BaseException | None,
        what: str,
        again: object,
        attempts: int,
    ) -> None:
        if error is None:
            return
        if isinstance(error, ReceiptHandleError):
            log.warning("receipt handle of %s no longer valid; the broker redelivers", m.message_id)
            return
        if attempts <= 0 or self._stopped.is_set():
            log.warning("%s %s failed; the broker redelivers", what, m.message_id, exc_info=error)
            return
        log.warning("%s %s failed; retrying", what, m.message_id, exc_info=error)
        timer = threading.Timer(1.0, again)  # type: ignore[arg-type]
        timer.daemon = True
        timer.start()

    def _settle(self, m: ReceivedMessage, call: object, attempts: int = 5) -> None:
        """Ack / nack / forward, retried every second; a dead receipt handle ends it."""
        for _ in range(attempts):
            try:
                with self._lease_lock:
                    lease = self._leases.pop(id(m), None)
                if lease is None:
                    call()  # type: ignore[operator]
                else:
                    with lease.lock:  # never ack with a handle a renewal just replaced
                        call()  # type: ignore[operator]
                return
            except ReceiptHandleError:
                log.warning("receipt handle no longer valid; the broker redelivers")
                return
            except Exception as exc:
                log.warning(
                    "settling a message failed; retrying: %r",
                    exc,
                    exc_info=log.isEnabledFor(logging.DEBUG),
                )
                if self._stopped.wait(1.0):
                    return
