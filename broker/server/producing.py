"""SendMessage, EndTransaction and RecallMessage (over `Broker.recall_message`).

Each message is checked and its queue chosen by `send_checks.SendChecks` (the client never
sends a queue: round-robin, or a message group's consistent hash). Sends are idempotent on
(topic, message id, user properties): the official client resends the same message with the
same id after a lost response, and gets the first result back instead of a second copy
(`send_copies.SendCopies`). Right after a start the store's unique-key index is consulted
too, so a retry that straddles a restart is not stored twice. A send of the same id with
different user properties is a deliberate new copy (the outbox's resend worker numbers its
resends in a property) and is stored.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from broker.errors import ResponseCode, SendRejected
from broker.results import PUT_STATUS_CODES
from broker.server import convert, validation
from broker.server.clients import ClientHandlers
from broker.server.codes import Code
from broker.server.context import CallInfo, ServerContext
from broker.server.dedupe import send_key
from broker.server.detached import detached
from broker.server.errors import (
    Abandoned,
    BadRequest,
    InvalidTransactionId,
    PayloadTooLarge,
    TooManyRequests,
)
from broker.server.send_checks import SendChecks, Shape
from broker.server.send_copies import SendCopies
from broker.server.send_groups import Group, Stored
from broker.server.status import make_status, ok, status_of
from broker.server.transactions import decode_transaction_id, encode_transaction_id
from broker.store.message import Message, PutMessageResult, PutMessageStatus
from broker.topic import TopicConfig
from protocol import ext as protocol_ext
from protocol.clock import wall_ms
from protocol.pb import definition_pb2, service_pb2
from protocol.props import Prop

log = logging.getLogger(__name__)

RESOLUTION_COMMIT, RESOLUTION_ROLLBACK = 1, 2
# a bucket's messages as one record batch: bodies, ids, keys (or None), shape, born host, born ms
BodyParts = tuple[list[bytes], list[str], list[str] | None, tuple[str, str, bool], str, int]
# (index, message id, queue offset, put status, topic, queue id) of each message stored
StoredMessage = tuple[int, str, int, PutMessageStatus, str, int]
SOURCE_SERVER_CHECK = 2
# whether a sync-flush send may fsync on the loop itself (`_answer_stored`): never, after
# one loop turn given to sends read with it, or at once (`CallInfo.alone`)
NO_LEAD, LEAD_AFTER_A_TURN, LEAD_AT_ONCE = 0, 1, 2
# a sync-master's "stored, no slave confirmed it" answers (docs/ha.md)
_NOT_REPLICATED = frozenset({Code.HA_NOT_AVAILABLE, Code.SLAVE_PERSISTENCE_TIMEOUT})
Messages = Sequence[definition_pb2.Message]  # a SendMessageRequest's


def _failed(message_id: str, exc: BaseException) -> service_pb2.SendResultEntry:
    entry = service_pb2.SendResultEntry()
    entry.message_id = message_id
    entry.status.CopyFrom(status_of(exc))
    return entry


def _not_acknowledged(topic: str, status: PutMessageStatus) -> definition_pb2.Status:
    """The status of a message stored but not acknowledged (e.g. its fsync timed out)."""
    return status_of(
        SendRejected(topic, status.value, PUT_STATUS_CODES.get(status, ResponseCode.SYSTEM_ERROR))
    )


def _settle(future: asyncio.Future[bool], ok: bool) -> None:
    if not future.done():
        future.set_result(ok)


class ProducerHandlers:
    def __init__(self, ctx: ServerContext, clients: ClientHandlers) -> None:
        self.ctx = ctx
        self.clients = clients
        self._checks = SendChecks(ctx, clients)  # each message checked, its queue chosen
        # what makes two sends the same send: a digest of topic, message id, user
        # properties; a resend is answered from the first copy (`send_copies`)
        self._copies = SendCopies(ctx)
        self._recent = self._copies.recent
        self._unreplicated = self._copies.unreplicated
        # sends being stored: key -> (its request's entries once settled, its index there)
        self._pending: dict[bytes, tuple[asyncio.Future[list[Any]], int]] = {}
        self._inflight = 0  # messages of requests being served (flow control)
        # sends of the loop's busy turns stored together (`broker.server.send_groups`)
        self._groups = ctx.send_groups
        self._groups.append = self._append_group

    # --- SendMessage
    async def send(
        self, request: service_pb2.SendMessageRequest, call: CallInfo
    ) -> service_pb2.SendMessageResponse:
        """One request's messages are checked, then stored with one broker call per (topic,
        queue) they go to (one record batch, one lock pass), all on the event loop; under
        SYNC_FLUSH the answer waits for the group commit's fsync on a future, holding no
        thread, so concurrent requests share fsyncs; a lone send over the native wire (no
        other being served, nor read in the same loop turn) is fsynced on the loop instead,
        without the hop to the group-commit thread and back (`Broker.durable_alone`)."""
        messages = request.messages
        count = len(messages)
        if count == 0:
            raise BadRequest("SendMessage carries no message")
        config = self.ctx.config
        if count > config.max_batch_messages:
            raise PayloadTooLarge(
                f"{count} messages in one request; at most {config.max_batch_messages}"
            )
        if self._inflight + count > config.max_inflight_sends:
            self.ctx.overload.refused(f"{config.max_inflight_sends} messages being stored")
            raise TooManyRequests(f"{self._inflight} messages are being stored; retry later")
        remaining = call.time_remaining
        if (
            remaining is not None
            and remaining * 1000 < config.min_send_time_ms
            and (remaining <= 0 or self._inflight or self.ctx.answers.busy)
        ):
            # the server is behind (sends being stored, or the loop busy) and this call
            # waited to be read until its caller is about to give up: stored now, its answer
            # would likely come too late and the client would resend it at once; refused,
            # the client backs off (and a call past its deadline is not answered at all)
            if remaining <= 0:
                raise Abandoned()  # its caller left already: not stored, not answered
            self.ctx.overload.refused(f"calls read with under {config.min_send_time_ms} ms left")
            raise TooManyRequests("the server is behind: the call waited too long; retry later")
        self._inflight += count
        # a send may be fsynced on the loop when it is alone (`_answer_stored`): one over the
        # native wire, or a gRPC one read by a loop that was idle (it had waited for I/O
        # since its last answer: a client sending one call at a time)
        if call.alone:
            lead = LEAD_AT_ONCE
        elif call.native_wire or not self.ctx.answers.busy:
            lead = LEAD_AFTER_A_TURN
        else:
            lead = NO_LEAD
        # admitted: stored to its end even if its caller goes away (`broker.server.detached`),
        # so a result made after the call was cancelled still enters the de-duplication
        # cache, and the client's resend of the same message gets it instead of a copy
        return await detached(self._serve(messages, lead, count))

    async def _serve(
        self, messages: Messages, lead: int, count: int
    ) -> service_pb2.SendMessageResponse:
        """The admitted request's answer (`send`); the in-flight count goes down at its end."""
        started = time.perf_counter()
        response = service_pb2.SendMessageResponse()
        try:
            entries = await self._send_all(messages, lead, response)
        finally:
            self._inflight -= count
            self.ctx.send_seconds.observe(time.perf_counter() - started)
        if not response.entries:  # else built in place, in order (`_store_buckets`)
            response.entries.extend(entries)
        if not response.HasField("status"):
            first = entries[0].status
            if all(e.status.code == first.code for e in entries):
                response.status.CopyFrom(first)
            else:
                response.status.CopyFrom(make_status(Code.MULTIPLE_RESULTS, "entries differ"))
        return response

    async def _send_all(
        self, messages: Messages, may_lead: int = NO_LEAD, response: Any = None
    ) -> list[Any]:
        """Each message's entry, in request order. `response` (a SendMessageResponse) may get
        them in place, with its status, when one record batch answers the whole request."""
        ctx = self.ctx
        loop = asyncio.get_running_loop()
        count = len(messages)
        entries: list[Any] = [None] * count
        settled: asyncio.Future[list[Any]] = loop.create_future()  # one for the request
        mine: list[tuple[int, bytes]] = []
        duplicates: list[tuple[int, tuple[asyncio.Future[list[Any]], int]]] = []
        # (topic, queue) -> its messages: (index, message id, shape), see `SendChecks.prepare`
        buckets: dict[tuple[str, int], list[tuple[int, str, Shape]]] = {}
        one_by_one: list[int] = []  # delayed, transactional; every send while recovering
        recovering = (
            ctx.had_messages and ctx.clock() - ctx.started_ms < ctx.config.dedupe_recovery_window_ms
        )
        queues: dict[str, int] = {}  # the request's queue per topic (round-robin)
        accepted: dict[tuple[str, str], TopicConfig] = {}  # (topic, type) checked
        named: set[str] = set()  # topic names found valid
        for i, pm in enumerate(messages):
            sp = pm.system_properties
            message_id = sp.message_id
            try:
                key = send_key(
                    pm.topic.name, validation.check_message_id(message_id), pm.user_properties
                )
            except Exception as exc:
                entries[i] = _failed(message_id, exc)
                continue
            cached = self._recent.get(key)
            if cached is not None:  # a resend of a send already answered: the first answer
                entries[i] = service_pb2.SendResultEntry.FromString(cached)
                continue
            if self._unreplicated.nbytes:
                stored_copy = self._unreplicated.get(key)
                if stored_copy is not None:  # stored, not replicated: that copy, once it is
                    entries[i] = await self._copies.replicated_copy(key, stored_copy, loop)
                    continue
            pending = self._pending.get(key)
            if pending is not None:
                duplicates.append((i, pending))
                continue
            self._pending[key] = (settled, i)
            mine.append((i, key))
            try:
                topic, queue_id, shape, direct = self._checks.prepare(
                    pm, sp, queues, accepted, named
                )
            except Exception as exc:
                entries[i] = _failed(message_id, exc)
                continue
            if direct and not recovering:
                bucket = buckets.get((topic, queue_id))
                if bucket is None:
                    buckets[(topic, queue_id)] = [(i, message_id, shape)]
                else:
                    bucket.append((i, message_id, shape))
            else:
                one_by_one.append(i)
        try:
            if buckets:
                whole = len(buckets) == 1 and not one_by_one and len(mine) == count
                joined = self._join(buckets, messages) if whole and not may_lead else None
                if joined is not None:
                    await self._store_joined(joined, buckets, messages, entries, loop, response)
                else:
                    await self._store_buckets(
                        buckets, messages, entries, loop, may_lead, response if whole else None
                    )
            for i in one_by_one:  # in request order (a message group's order)
                try:
                    entries[i] = await self._store(messages[i])
                except Exception as exc:
                    entries[i] = _failed(messages[i].system_properties.message_id, exc)
        finally:
            in_flight = self._pending
            answered: list[tuple[bytes, bytes]] = []  # (key, serialized entry) of each OK
            for i, key in mine:
                del in_flight[key]
                entry = entries[i]
                if entry is None:  # cancelled: duplicates waiting on it fail, not hang
                    entries[i] = _failed(
                        messages[i].system_properties.message_id,
                        TooManyRequests("the send was interrupted; retry"),
                    )
                elif entry.status.code == Code.OK:
                    answered.append((key, entry.SerializeToString()))
                elif entry.status.code in _NOT_REPLICATED:
                    self._copies.remember_unreplicated(key, entry)
            self._recent.put_many(answered)
            settled.set_result(entries)
        for i, (future, at) in duplicates:
            entries[i] = (await asyncio.shield(future))[at]
        return entries

    @staticmethod
    def _bodies_of(items: list[tuple[int, str, Shape]], messages: Messages) -> BodyParts | None:
        """What `_append_bodies` stores of a bucket of messages of one shape (`SendChecks.prepare`):
        their bodies, ids and keys, and the first message's born host and time (any record
        batch's); None when the messages differ in shape or born host, or carry user
        properties (the general way then)."""
        first, _, shape = items[0]
        if shape is None:
            return None
        fsp = messages[first].system_properties
        born_host = fsp.born_host
        bodies: list[bytes] = []
        ids: list[str] = []
        keys: list[str] | None = [] if shape[2] else None
        for i, message_id, s in items:
            pm = messages[i]
            sp = pm.system_properties
            if s != shape or sp.born_host != born_host:
                return None
            bodies.append(pm.body)
            ids.append(message_id)
            if keys is not None:
                keys.append(" ".join(sp.keys))  # each key checked not blank
        born = (
            convert.timestamp_ms(fsp.born_timestamp, "born timestamp")
            if fsp.HasField("born_timestamp")
            else 0
        )
        return bodies, ids, keys, shape, born_host, born if born > 0 else wall_ms()

    def _append_bodies(
        self, topic: str, queue_id: int, parts: BodyParts
    ) -> PutMessageResult | None:
        """Messages of one shape stored straight from their bodies and ids as one record
        batch (`Broker.send_bodies`), with no store `Message` and no broker result per
        message: the records `send_batch_pending` stores for them, byte for byte. The put's
        result, or None when the broker refuses the batch as a whole (nothing stored): the
        general way then. Raises what `send_batch_pending` of the messages raises."""
        bodies, ids, keys, (tag, group, _), born_host, born_ms = parts
        shared: dict[str, str] = {}  # in the order `convert.to_store` puts them
        if tag:
            shared[Prop.TAGS] = tag
        if group:
            shared[Prop.SHARDING_KEY] = group
        return self.ctx.broker.send_bodies(
            topic,
            queue_id,
            bodies,
            ids,
            shared,
            keys=keys,
            born_timestamp=born_ms,
            born_host=(convert.host_only(born_host), 0),
            wait=False,
        )

    def _put_bodies(
        self, topic: str, queue_id: int, items: list[tuple[int, str, Shape]], messages: Messages
    ) -> PutMessageResult | None:
        """A bucket of messages of one shape stored as one record batch (`_append_bodies`);
        None when they cannot be (`_bodies_of`) or the broker refuses the batch whole."""
        parts = self._bodies_of(items, messages)
        return None if parts is None else self._append_bodies(topic, queue_id, parts)

    # --- sends stored with the others of the loop's turn (`broker.server.send_groups`)
    def _join(
        self, buckets: dict[tuple[str, int], list[tuple[int, str, Shape]]], messages: Messages
    ) -> asyncio.Future[Stored] | None:
        """A gRPC send whose messages share one record batch (one bucket, one shape, no
        message group, no user properties) joins the group of its topic, shape, born host
        and time while the loop is busy; None: store it now (also a send too large to gain
        from a group, `SendGroups.join`)."""
        if not (self._groups.open and self.ctx.answers.busy):
            return None
        [((topic, queue_id), items)] = buckets.items()
        shape = items[0][2]
        if shape is None or shape[1]:  # user properties; a message group keeps its queue
            return None
        parts = self._bodies_of(items, messages)
        if parts is None:
            return None
        bodies, ids, keys, _, born_host, born_ms = parts
        return self._groups.join((topic, shape, born_host, born_ms), queue_id, bodies, ids, keys)

    def _append_group(self, key: Any, group: Group) -> list[Stored]:
        """`SendGroups.append`: one group's sends as one record batch; a `Stored` for each
        (None for all when the broker refuses the batch whole: each is stored on its own)."""
        topic, shape, born_host, born_ms = key
        bodies: list[bytes] = []
        ids: list[str] = []
        keys: list[str] | None = [] if shape[2] else None
        for joined in group.sends:
            bodies += joined.bodies
            ids += joined.ids
            if keys is not None and joined.keys is not None:
                keys += joined.keys
        result = self._append_bodies(
            topic, group.queue_id, (bodies, ids, keys, shape, born_host, born_ms)
        )
        if result is None:
            return [None] * len(group.sends)
        append = result.append
        assert append is not None
        end = append.wrote_offset + append.wrote_bytes
        offset = append.queue_offset
        out: list[Stored] = []
        for joined in group.sends:
            out.append((offset, result.status, end, group.queue_id))
            offset += len(joined.bodies)
        return out

    async def _store_joined(
        self,
        joined: asyncio.Future[Stored],
        buckets: dict[tuple[str, int], list[tuple[int, str, Shape]]],
        messages: Messages,
        entries: list[Any],
        loop: asyncio.AbstractEventLoop,
        response: Any,
    ) -> None:
        """Wait for the send's group to be stored, then answer it as `_store_buckets` would
        have; a group refused whole: the send is stored on its own (`_store_buckets`)."""
        outcome = await joined
        if outcome is None:
            await self._store_buckets(buckets, messages, entries, loop, False, response)
            return
        base, status, end, queue_id = outcome
        [((topic, _), items)] = buckets.items()
        stored = [
            (i, message_id, base + n, status, topic, queue_id)
            for n, (i, message_id, _) in enumerate(items)
        ]
        await self._answer_stored(stored, end, messages, entries, loop, False, response)
        # answered with the others of its group: not held again (`broker.server.answers`)
        self.ctx.answers.answer_now()

    async def _store_buckets(
        self,
        buckets: dict[tuple[str, int], list[tuple[int, str, Shape]]],
        messages: Messages,
        entries: list[Any],
        loop: asyncio.AbstractEventLoop,
        may_lead: int = NO_LEAD,
        response: Any = None,
    ) -> None:
        """Each bucket (one topic and queue) in one broker call, on the loop: a page-cache
        append. Under SYNC_FLUSH the entries are answered once the group commit has
        fsynced past the last record (a timeout answers MASTER_PERSISTENCE_TIMEOUT), or the
        loop itself has, for a lone send (`may_lead`: it came over the native wire, or
        over gRPC to an idle loop).

        `response`: the request's, given when this one bucket holds every message of the
        request; when every one is stored, the entries are made in it (in request order,
        no copy) and, when they share one status, so is its status."""
        stored, end = self._append_buckets(buckets, messages, entries)
        await self._answer_stored(stored, end, messages, entries, loop, may_lead, response)

    def _append_buckets(
        self,
        buckets: dict[tuple[str, int], list[tuple[int, str, Shape]]],
        messages: Messages,
        entries: list[Any],
    ) -> tuple[list[StoredMessage], int]:
        """Each bucket in one broker call: what was stored, and the end of the last record
        (-1: none); a message not stored gets its failed entry in `entries`."""
        broker = self.ctx.broker
        stored: list[StoredMessage] = []
        end = -1
        for (topic, queue_id), items in buckets.items():
            try:
                result = self._put_bodies(topic, queue_id, items, messages)
                if result is not None:
                    append = result.append
                    assert append is not None
                    base, status = append.queue_offset, result.status
                    stored.extend(
                        (i, message_id, base + n, status, topic, queue_id)
                        for n, (i, message_id, _) in enumerate(items)
                    )
                    end = max(end, append.wrote_offset + append.wrote_bytes)
                    continue
                msgs = [self._to_store(messages[i], queue_id) for i, _, _ in items]
                results, last = broker.send_batch_pending(msgs)
            except Exception as exc:
                if len(items) == 1:
                    i, message_id, _ = items[0]
                    entries[i] = _failed(message_id, exc)
                    continue
                # message by message: each gets its own verdict
                results, last = [], -1
                kept = []
                for item in items:
                    i, message_id, _ = item
                    try:
                        r, e = broker.send_batch_pending([self._to_store(messages[i], queue_id)])
                    except Exception as exc:
                        entries[i] = _failed(message_id, exc)
                        continue
                    kept.append(item)
                    results.extend(r)
                    last = max(last, e)
                items = kept
            stored.extend(
                (i, message_id, r.queue_offset, r.status, r.topic, r.queue_id)
                for (i, message_id, _), r in zip(items, results, strict=True)
            )
            end = max(end, last)
        return stored, end

    async def _answer_stored(
        self,
        stored: list[StoredMessage],
        end: int,
        messages: Messages,
        entries: list[Any],
        loop: asyncio.AbstractEventLoop,
        may_lead: int,
        response: Any,
    ) -> None:
        """The entries of the stored messages, once durable under SYNC_FLUSH (and on a slave
        under SYNC_MASTER); see `_store_buckets`."""
        broker = self.ctx.broker
        durable = True
        if stored and end > 0:
            alone: bool | None = None
            # a send is alone when no other is being served, nor read in the same loop
            # turn (one turn lets those append first); grpc.aio hands the loop one call a
            # turn, so a gRPC send leads only when the loop was idle before it (a burst
            # keeps the loop busy, and its sends share the group commit); the store
            # declines too when another flush is waited for or the disk has been slow
            # (`LEAD_AT_ONCE`: the call was all its loop turn woke for, so no other can be
            # read in it, and the whole call ends in this turn as under async flush)
            if may_lead and broker.sync_flush and self._inflight == len(messages):
                if may_lead != LEAD_AT_ONCE:
                    await asyncio.sleep(0)
                if self._inflight == len(messages):
                    alone = broker.durable_alone(end)
            if alone is not None:  # fsynced here: no hop to the flusher and back
                durable = alone
            else:
                future: asyncio.Future[bool] = loop.create_future()

                def flushed(ok: bool) -> None:  # on the group-commit thread
                    loop.call_soon_threadsafe(_settle, future, ok)

                if broker.when_durable(end, flushed):
                    durable = await asyncio.shield(future)
        status = (
            ok()
            if durable
            else make_status(
                Code.MASTER_PERSISTENCE_TIMEOUT, "stored, but not flushed to disk in time"
            )
        )
        if durable and stored and end > 0 and self.ctx.replication is not None:
            refused = await self._copies.replicated(end, loop)
            if refused is not None:
                status = status_of(refused)
        template = service_pb2.SendResultEntry()
        template.status.CopyFrom(status)
        in_place = response is not None and len(stored) == len(messages)
        new_entry = response.entries.add if in_place else service_pb2.SendResultEntry
        same = stored[0][3] if stored else None  # every put status this one?
        queue_field = protocol_ext.queue_id_field
        for i, message_id, offset, put_status, topic, queue_id in stored:
            entry = new_entry()
            entry.CopyFrom(template)
            entry.message_id = message_id
            entry.offset = offset
            entry.MergeFromString(queue_field(queue_id))  # where it went (`protocol.ext`)
            if put_status is not PutMessageStatus.PUT_OK:  # stored, not acknowledged
                entry.status.CopyFrom(_not_acknowledged(topic, put_status))
            if put_status is not same:
                same = None
            entries[i] = entry
        if in_place and same is not None:  # one status for all: the request's
            response.status.CopyFrom(entries[0].status)

    @staticmethod
    def _to_store(pm: definition_pb2.Message, queue_id: int) -> Message:
        """The store form of a message `SendChecks.prepare` accepted for a record batch."""
        return convert.to_store(pm, queue_id, transactional=False, producer_group=None)

    async def _store(self, pm: definition_pb2.Message) -> service_pb2.SendResultEntry:
        """One message through `Broker.send_message` (delayed, transactional, and every
        send of the recovery window, which first looks for a copy stored before the start)."""
        config = self.ctx.config
        sp = pm.system_properties
        topic = validation.check_topic(pm.topic.name)
        message_type = convert.message_type_of(sp)
        if (
            self.ctx.had_messages
            and self.ctx.clock() - self.ctx.started_ms < config.dedupe_recovery_window_ms
        ):
            earlier = await self.ctx.run_in_pool(
                self._copies.stored_before, topic, sp.message_id, dict(pm.user_properties)
            )
            if earlier is not None:
                return earlier
        transactional = message_type == "TRANSACTION"
        cfg = self.clients.topic_config(topic)
        if transactional:
            self.clients.watch_transactions(topic)
        msg = convert.to_store(
            pm,
            self._checks.queue_for(cfg, sp),
            transactional=transactional,
            producer_group=topic if transactional else None,
        )
        result = await self.ctx.run(
            self.ctx.broker.send_message, msg, producer_group=topic if transactional else None
        )
        entry = service_pb2.SendResultEntry()
        entry.status.CopyFrom(ok())
        entry.message_id = sp.message_id
        entry.offset = result.queue_offset
        if result.queue_offset >= 0 and not transactional:  # in its queue: say which
            entry.MergeFromString(protocol_ext.queue_id_field(result.queue_id))
        if result.status is not PutMessageStatus.PUT_OK:  # stored, not acknowledged
            entry.status.CopyFrom(_not_acknowledged(result.topic, result.status))
        elif self.ctx.replication is not None:
            # the log's end now is at or past this record's: a slave having it has the record
            end = self.ctx.broker.store.get_commitlog_max_offset()
            refused = await self._copies.replicated(end, asyncio.get_running_loop())
            if refused is not None:
                entry.status.CopyFrom(status_of(refused))
        if transactional:
            entry.transaction_id = encode_transaction_id(
                result.offset_msg_id, result.transaction_id or sp.message_id
            )
        if result.recall_handle:  # a delayed message, waiting in the schedule topic
            entry.recall_handle = result.recall_handle
            if self.ctx.cluster is not None:  # RecallMessage may reach another group
                entry.recall_handle = f"{self.ctx.config.broker_name}@{result.recall_handle}"
        return entry

    # --- EndTransaction
    async def end_transaction(
        self, request: service_pb2.EndTransactionRequest, call: CallInfo
    ) -> service_pb2.EndTransactionResponse:
        topic = validation.check_topic(request.topic.name)
        if not request.transaction_id:
            raise InvalidTransactionId("transaction id is empty")
        offset, broker_txn_id = decode_transaction_id(request.transaction_id)
        response = service_pb2.EndTransactionResponse()
        response.status.CopyFrom(ok())
        resolution = int(request.resolution)
        if resolution not in (RESOLUTION_COMMIT, RESOLUTION_ROLLBACK):
            if int(request.source) == SOURCE_SERVER_CHECK:
                return response  # "unknown": the check service asks again later
            raise BadRequest("resolution must be COMMIT or ROLLBACK")
        await self.ctx.run(
            self.ctx.broker.end_transaction,
            topic,
            broker_txn_id,
            offset,
            resolution == RESOLUTION_COMMIT,
            from_check=int(request.source) == SOURCE_SERVER_CHECK,
        )
        return response

    # --- RecallMessage
    async def recall(
        self, request: service_pb2.RecallMessageRequest, call: CallInfo
    ) -> service_pb2.RecallMessageResponse:
        topic = validation.check_topic(request.topic.name)
        if not request.recall_handle:
            raise BadRequest("recall handle is empty")
        handle = request.recall_handle
        cluster = self.ctx.cluster
        if cluster is not None and "@" in handle:
            # a cluster's handle names the group whose schedule holds the message: clients
            # send RecallMessage to their access point, which may be another group's
            group, _, handle = handle.partition("@")
            if group != self.ctx.config.broker_name:
                return await cluster.forward_recall(group, request, call.metadata)
        # the broker's schedule service cancels it (durably) before it is due; every
        # consumer, whatever its transport, then never sees it
        message_id = await self.ctx.run_in_pool(self.ctx.broker.recall_message, topic, handle)
        response = service_pb2.RecallMessageResponse()
        response.status.CopyFrom(ok())
        response.message_id = message_id
        return response
