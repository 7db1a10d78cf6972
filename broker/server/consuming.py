"""ReceiveMessage (long polling), AckMessage, ChangeInvisibleDuration, dead-lettering, and
the auto-renewal of push consumers' in-flight messages.

Invisible-time consumption happens in the broker (`Broker.receive` / `ack` /
`change_invisible_duration`), which persists in-flight state and counts delivery attempts.
What lives here is the protocol's part:

- A receive whose caller went away before the messages were written releases them at once
  (they reappear after `release_invisible_ms`) instead of leaving them hidden.
- `auto_renew` receives (push consumers) get the server's default invisible time and are
  renewed `renew_ahead_ms` before expiry while the client lives, for at most `max_renew_ms`.
  The client keeps using the *first* receipt handle; the session maps it to the live one.
  Ack, nack (change invisible) and dead-lettering end the renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Collection, Coroutine
from dataclasses import dataclass
from typing import Any

from broker.errors import BrokerError
from broker.pop import ReceivedEntry
from broker.server import convert, validation
from broker.server.calls import CallContext
from broker.server.clients import ClientHandlers
from broker.server.codes import Code
from broker.server.context import CallInfo, ServerContext
from broker.server.errors import (
    BadRequest,
    IllegalInvisibleTime,
    IllegalPollingTime,
    MissingReceiptHandle,
)
from broker.server.polling import REPOLL_S, Waiters
from broker.server.sessions import ClientSession, Renewal
from broker.server.status import make_status, ok, status_of
from protocol.ext import ReceiveMessagesResponse
from protocol.pb import definition_pb2, service_pb2

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReceivePlan:
    """A validated ReceiveMessage request."""

    group: str
    topic: str
    batch: int
    invisible_ms: int
    tags: Collection[str] | None
    poll_ms: int
    fifo: bool
    auto_renew: bool


def _timestamp_response(now_ms: int) -> service_pb2.ReceiveMessageResponse:
    response = service_pb2.ReceiveMessageResponse()
    convert.set_timestamp_ms(response.delivery_timestamp, now_ms)
    return response


def _status_response(status: definition_pb2.Status) -> service_pb2.ReceiveMessageResponse:
    response = service_pb2.ReceiveMessageResponse()
    response.status.CopyFrom(status)
    return response


_OK_STATUS = ok()
_OK_RESPONSE = _status_response(_OK_STATUS)  # never changed: shared by every receive


class ConsumerHandlers:
    def __init__(self, ctx: ServerContext, clients: ClientHandlers) -> None:
        self.ctx = ctx
        self.clients = clients
        self._background: set[asyncio.Future[None]] = set()
        self.waiters = Waiters(ctx.config.max_parked_polls)

    # --- ReceiveMessage
    async def _take(
        self, request: service_pb2.ReceiveMessageRequest, context: CallContext
    ) -> tuple[Any, ReceivePlan | None, list[ReceivedEntry], ClientSession | None]:
        """Validate, poll and lease: (a refusal's status or None, the plan, the leased
        entries, the caller's session). No entries and no status: nothing arrived."""
        try:
            call = self.ctx.call_info(context)
            plan = await self._plan(request, context, call)
        except Exception as exc:
            return status_of(exc), None, [], None
        try:
            entries = await self._poll(plan) if await self._reads_ready(plan) else []
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return status_of(exc), plan, [], None
        if not entries:
            return make_status(Code.MESSAGE_NOT_FOUND, "no new message"), plan, [], None
        now = self.ctx.clock()
        session = self.ctx.session(call)
        if plan.auto_renew:
            for entry in entries:
                session.renewals[entry.receipt_handle] = Renewal(
                    group=plan.group,
                    topic=plan.topic,
                    original=entry.receipt_handle,
                    current=entry.receipt_handle,
                    expires_ms=now + plan.invisible_ms,
                    first_ms=now,
                )
        return None, plan, entries, session

    @staticmethod
    def _fill(
        request: service_pb2.ReceiveMessageRequest,
        plan: ReceivePlan,
        entries: list[ReceivedEntry],
        add: Callable[[], definition_pb2.Message],
    ) -> None:
        """Write each entry into `add()`, a fresh protocol Message; what the messages share
        (topic, digest kind, invisible time) is built once."""
        template = convert.delivery_template(
            topic=plan.topic,
            namespace=request.message_queue.topic.resource_namespace,
            invisible_ms=plan.invisible_ms,
        )
        fill = convert.fill_proto
        for entry in entries:
            fill(
                add(),
                entry.message,
                template=template,
                receipt_handle=entry.receipt_handle,
                delivery_attempt=entry.delivery_attempt,
            )

    def _abandon(
        self, plan: ReceivePlan, entries: list[ReceivedEntry], session: ClientSession
    ) -> None:
        """The caller went away before it had the messages: let them go right away."""
        handles = [e.receipt_handle for e in entries]
        for handle in handles:
            session.renewals.pop(handle, None)
        self._spawn(self._release(plan.group, plan.topic, handles))

    async def receive(
        self, request: service_pb2.ReceiveMessageRequest, context: CallContext
    ) -> AsyncIterator[service_pb2.ReceiveMessageResponse]:
        status, plan, entries, session = await self._take(request, context)
        if status is not None or plan is None or session is None:
            yield _status_response(status)
            yield _timestamp_response(self.ctx.clock())
            return
        finished = False
        try:
            # every response built before the first write: the writes go back to back
            responses = [_OK_RESPONSE]
            response_type = service_pb2.ReceiveMessageResponse

            def add() -> definition_pb2.Message:
                response = response_type()
                responses.append(response)
                return response.message

            self._fill(request, plan, entries, add)
            responses.append(_timestamp_response(self.ctx.clock()))
            for response in responses:
                yield response
            finished = True
        finally:
            if not finished:
                self._abandon(plan, entries, session)

    async def receive_batch(
        self, request: service_pb2.ReceiveMessageRequest, context: CallContext
    ) -> ReceiveMessagesResponse:
        """`reliable.v1.BatchMessaging/ReceiveMessages`: the same receive, one response."""
        response = ReceiveMessagesResponse()
        status, plan, entries, session = await self._take(request, context)
        if status is not None or plan is None or session is None:
            response.status.CopyFrom(status)
        else:
            self._fill(request, plan, entries, response.messages.add)
            response.status.CopyFrom(_OK_STATUS)

            def ended(ctx: CallContext) -> None:  # the call was cancelled before it was answered
                if ctx.cancelled():
                    self._abandon(plan, entries, session)

            context.add_done_callback(ended)
        convert.set_timestamp_ms(response.delivery_timestamp, self.ctx.clock())
        return response

    async def _reads_ready(self, plan: ReceivePlan) -> bool:
        """A master just (re)started holds receives until its slaves reported what they
        acknowledged while serving its receives (`ServerContext.reads_ready`): at most the
        polling time, then nothing is answered."""
        ready = self.ctx.reads_ready
        if ready is None or ready():
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + plan.poll_ms / 1000
        while not ready():
            remaining = deadline - loop.time()
            if remaining <= 0 or self.ctx.closing:
                return False
            await asyncio.sleep(min(0.1, remaining))
        return True

    async def _poll(self, plan: ReceivePlan) -> list[ReceivedEntry]:
        """Ask the broker until it has something or the polling time is over."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + plan.poll_ms / 1000
        broker = self.ctx.broker
        group, topic = plan.group, plan.topic
        while True:
            event = self.waiters.park(topic)
            try:
                if self.ctx.inline:  # nothing to wait for: done by the time it returns
                    future = self.ctx.submit(
                        lambda: broker.receive(
                            group,
                            topic,
                            plan.batch,
                            plan.invisible_ms,
                            plan.tags,
                            long_poll_ms=0,
                            fifo=plan.fifo,
                        )
                    )
                else:  # its leases' fsync awaited on the loop
                    future = asyncio.ensure_future(
                        self.ctx.run_durably(
                            broker.receive,
                            group,
                            topic,
                            plan.batch,
                            plan.invisible_ms,
                            plan.tags,
                            long_poll_ms=0,
                            fifo=plan.fifo,
                        )
                    )
                try:
                    entries = await asyncio.shield(future)
                except asyncio.CancelledError:
                    future.add_done_callback(lambda f: self._release_result(group, topic, f))
                    raise
                remaining = deadline - loop.time()
                if entries or remaining <= 0 or self.ctx.closing:
                    return list(entries)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), min(REPOLL_S, remaining))
            finally:
                self.waiters.unpark(topic, event)

    async def _plan(
        self, request: service_pb2.ReceiveMessageRequest, context: CallContext, call: CallInfo
    ) -> ReceivePlan:
        config = self.ctx.config
        group = validation.check_group(request.group.name)
        topic = validation.check_topic(request.message_queue.topic.name)
        tags = validation.parse_filter(
            request.filter_expression.type, request.filter_expression.expression
        )
        batch = int(request.batch_size)
        if batch <= 0:
            raise BadRequest(f"batch size must be positive, got {batch}")
        batch = min(batch, config.max_receive_batch)
        auto_renew = bool(request.auto_renew)
        if auto_renew:
            invisible_ms = config.default_invisible_ms
        elif not request.HasField("invisible_duration"):
            raise IllegalInvisibleTime("invisible duration is required without auto_renew")
        else:
            invisible_ms = validation.check_invisible_ms(
                convert.duration_ms(request.invisible_duration),
                config.min_invisible_ms,
                config.max_invisible_ms,
            )
        poll_ms = config.max_long_polling_ms
        if request.HasField("long_polling_timeout"):
            poll_ms = convert.duration_ms(request.long_polling_timeout)
        poll_ms = max(config.min_long_polling_ms, min(poll_ms, config.max_long_polling_ms))
        remaining = context.time_remaining()
        if remaining is not None:
            room_ms = int(remaining * 1000) - 200  # answer before the caller's deadline
            if room_ms < config.min_long_polling_ms:
                raise IllegalPollingTime(
                    f"the call's deadline leaves {max(room_ms, 0)} ms; long polling needs "
                    f"{config.min_long_polling_ms} ms"
                )
            poll_ms = min(poll_ms, room_ms)
        group_cfg = self.clients.group_config(group)
        self.clients.topic_config(topic)
        return ReceivePlan(
            group, topic, batch, invisible_ms, tags, poll_ms, group_cfg.fifo, auto_renew
        )

    def _release_result(
        self, group: str, topic: str, future: asyncio.Future[list[ReceivedEntry]]
    ) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        handles = [e.receipt_handle for e in future.result()]
        if handles:
            self._spawn(self._release(group, topic, handles))

    async def _release(self, group: str, topic: str, handles: list[str]) -> None:
        for handle in handles:
            try:
                await self.ctx.run_durably(
                    self.ctx.broker.change_invisible_duration,
                    group,
                    topic,
                    handle,
                    self.ctx.config.release_invisible_ms,
                )
            except Exception as exc:  # already acked or expired: nothing to release
                log.debug("release of %s skipped: %s", handle[:40], exc)

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- handles
    async def _live_handle(self, call: CallInfo, handle: str) -> tuple[str, Renewal | None]:
        """The handle the broker honours now for the one the client holds; ends renewal."""
        if not handle:
            raise MissingReceiptHandle("receipt handle is empty")
        session = self.ctx.sessions.get(call.client_id)
        renewal = session.renewals.get(handle) if session is not None else None
        if renewal is None or session is None:
            return handle, None
        async with renewal.lock:
            session.renewals.pop(handle, None)
            return renewal.current, renewal

    # --- AckMessage
    async def ack(
        self, request: service_pb2.AckMessageRequest, call: CallInfo
    ) -> service_pb2.AckMessageResponse:
        """All entries in one `Broker.ack_batch` (one lock pass, one revive-log record), one
        wake-up of parked receives; an entry that fails is reported for itself alone."""
        group = validation.check_group(request.group.name)
        topic = validation.check_topic(request.topic.name)
        entries = request.entries
        if len(entries) == 0:
            raise BadRequest("AckMessage carries no entry")
        if len(entries) > self.ctx.config.max_batch_messages:
            raise BadRequest("too many entries in one AckMessage")
        response = service_pb2.AckMessageResponse()
        results = response.entries
        # each field read once (a protobuf string field read builds a new str each time)
        handles = [entry.receipt_handle for entry in entries]
        statuses: list[Any] = [None] * len(handles)
        live: list[str] = []
        at: list[int] = []  # index of each live handle's entry
        session = self.ctx.sessions.get(call.client_id)
        renewals = session.renewals if session is not None else None
        for i, handle in enumerate(handles):
            try:
                if renewals and handle in renewals:
                    handle, _ = await self._live_handle(call, handle)
                elif not handle:
                    raise MissingReceiptHandle("receipt handle is empty")
                live.append(handle)
                at.append(i)
            except Exception as exc:
                statuses[i] = status_of(exc)
        if live:
            try:
                errors = await self.ctx.run_durably(self.ctx.broker.ack_batch, group, topic, live)
            except Exception as exc:  # the whole batch failed (e.g. the store refused it)
                failed = status_of(exc)
                for i in at:
                    statuses[i] = failed
            else:
                done = ok()
                for i, error in zip(at, errors, strict=True):
                    statuses[i] = done if error is None else status_of(error)
            self.waiters.wake(topic)
        for entry, handle, status in zip(entries, handles, statuses, strict=True):
            result = results.add()
            result.message_id = entry.message_id
            result.receipt_handle = handle
            result.status.CopyFrom(status)
        first = statuses[0]
        if all(st is first for st in statuses) or all(st.code == first.code for st in statuses):
            response.status.CopyFrom(first)
        else:
            response.status.CopyFrom(make_status(Code.MULTIPLE_RESULTS, "entries differ"))
        return response

    # --- ChangeInvisibleDuration
    async def change_invisible_duration(
        self, request: service_pb2.ChangeInvisibleDurationRequest, call: CallInfo
    ) -> service_pb2.ChangeInvisibleDurationResponse:
        group = validation.check_group(request.group.name)
        topic = validation.check_topic(request.topic.name)
        invisible_ms = validation.check_invisible_ms(
            convert.duration_ms(request.invisible_duration), 0, self.ctx.config.max_invisible_ms
        )
        # 0 (the proxy accepts it; a push consumer's sub-second backoff arrives as 0 s) means
        # "visible again now"; the broker's smallest lease is 1 ms
        invisible_ms = max(invisible_ms, 1)
        handle, _ = await self._live_handle(call, request.receipt_handle)
        new_handle = await self.ctx.run_durably(
            self.ctx.broker.change_invisible_duration, group, topic, handle, invisible_ms
        )
        self.waiters.wake(topic)
        response = service_pb2.ChangeInvisibleDurationResponse()
        response.status.CopyFrom(ok())
        response.receipt_handle = new_handle
        return response

    # --- ForwardMessageToDeadLetterQueue
    async def forward_to_dlq(
        self, request: service_pb2.ForwardMessageToDeadLetterQueueRequest, call: CallInfo
    ) -> service_pb2.ForwardMessageToDeadLetterQueueResponse:
        group = validation.check_group(request.group.name)
        topic = validation.check_topic(request.topic.name)
        handle, _ = await self._live_handle(call, request.receipt_handle)
        await self.ctx.run(self.ctx.broker.forward_to_dlq, group, topic, handle)
        self.waiters.wake(topic)
        response = service_pb2.ForwardMessageToDeadLetterQueueResponse()
        response.status.CopyFrom(ok())
        return response

    # --- background upkeep
    async def release_session(self, session: ClientSession) -> None:
        """Let every auto-renewed message of a departed client reappear soon."""
        renewals = list(session.renewals.values())
        session.renewals.clear()
        by_target: dict[tuple[str, str], list[str]] = {}
        for renewal in renewals:
            by_target.setdefault((renewal.group, renewal.topic), []).append(renewal.current)
        for (group, topic), handles in by_target.items():
            await self._release(group, topic, handles)

    async def upkeep(self) -> None:
        """One pass: renew what is about to expire; release and forget departed clients."""
        now = self.ctx.clock()
        config = self.ctx.config
        due: list[tuple[ClientSession, Renewal]] = []
        for session in self.ctx.sessions:
            if (
                session.renewals
                and not session.connected
                and session.disconnected_ms
                and now - session.disconnected_ms > config.stream_grace_ms
            ):
                await self.release_session(session)
                continue
            for renewal in list(session.renewals.values()):
                if now - renewal.first_ms >= config.max_renew_ms:
                    session.renewals.pop(renewal.original, None)  # let it expire
                elif renewal.expires_ms - now <= config.renew_ahead_ms:
                    due.append((session, renewal))
        if due:
            await asyncio.gather(*(self._renew(s, r) for s, r in due))
        for session in self.ctx.sessions.expired(now, config.session_expiry_ms):
            self.ctx.sessions.remove(session.client_id)
            await self.release_session(session)
            if session.group:
                try:
                    await self.ctx.run(self.ctx.broker.unregister, session.client_id, session.group)
                except BrokerError:
                    log.debug("unregister of %s failed", session.client_id, exc_info=True)

    async def _renew(self, session: ClientSession, renewal: Renewal) -> None:
        async with renewal.lock:
            if session.renewals.get(renewal.original) is not renewal:
                return  # acked or nacked meanwhile
            invisible_ms = self.ctx.config.default_invisible_ms
            try:
                renewal.current = await self.ctx.run_durably(
                    self.ctx.broker.change_invisible_duration,
                    renewal.group,
                    renewal.topic,
                    renewal.current,
                    invisible_ms,
                )
                renewal.expires_ms = self.ctx.clock() + invisible_ms
            except BrokerError as exc:
                log.info("stopped renewing %s: %s", renewal.original[:40], exc)
                session.renewals.pop(renewal.original, None)
