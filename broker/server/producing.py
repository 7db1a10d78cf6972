"""SendMessage, EndTransaction and RecallMessage (over `Broker.recall_message`).

The server chooses the queue (the client never sends one): round-robin over the topic's write
queues, or, for FIFO messages, a consistent hash of the message group so that one group
always lands in one queue. Sends are idempotent on (topic, message id, user properties): the
official client resends the same message with the same id after a lost response, and gets
the first result back instead of a second copy. Right after a start the store's unique-key
index is consulted too, so a retry that straddles a restart is not stored twice. A send of
the same id with different user properties is a deliberate new copy (the outbox's resend
worker numbers its resends in a property) and is stored.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
from typing import Any

from broker.protocol_stubs import service_pb2
from broker.server import convert, validation
from broker.server.clients import ClientHandlers
from broker.server.codes import Code
from broker.server.context import CallInfo, ServerContext
from broker.server.dedupe import SendResults, send_key
from broker.server.errors import (
    BadRequest,
    Forbidden,
    InvalidTransactionId,
    PayloadTooLarge,
    TooManyRequests,
)
from broker.server.status import make_status, ok, status_of
from broker.server.transactions import decode_transaction_id, encode_transaction_id
from broker.topic import PERM_WRITE, TopicConfig

log = logging.getLogger(__name__)

RESOLUTION_COMMIT, RESOLUTION_ROLLBACK = 1, 2
SOURCE_SERVER_CHECK = 2


def jump_hash(key: int, buckets: int) -> int:
    """Jump consistent hash (Lamping & Veach): stable bucket for a key, minimal moves."""
    b, j = -1, 0
    key &= 0xFFFFFFFFFFFFFFFF
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & 0xFFFFFFFFFFFFFFFF
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


def group_queue(message_group: str, write_queues: int) -> int:
    digest = hashlib.sha256(message_group.encode()).digest()
    return jump_hash(int.from_bytes(digest[:8], "big"), write_queues)


class ProducerHandlers:
    def __init__(self, ctx: ServerContext, clients: ClientHandlers) -> None:
        self.ctx = ctx
        self.clients = clients
        self._round_robin: dict[str, itertools.count[int]] = {}
        # what makes two sends the same send: a digest of topic, message id, user properties
        self._recent = SendResults(ctx.config.dedupe_cache_bytes, ctx.config.dedupe_cache_size)
        self._pending: dict[bytes, asyncio.Future[bytes]] = {}
        self._inflight = 0  # messages of requests being served (flow control)

    # --- SendMessage
    async def send(self, request: Any, call: CallInfo) -> Any:
        count = len(request.messages)
        if count == 0:
            raise BadRequest("SendMessage carries no message")
        if count > self.ctx.config.max_batch_messages:
            raise PayloadTooLarge(
                f"{count} messages in one request; at most {self.ctx.config.max_batch_messages}")
        if self._inflight + count > self.ctx.config.max_inflight_sends:
            raise TooManyRequests(f"{self._inflight} messages are being stored; retry later")
        self._inflight += count
        try:
            if any(pm.system_properties.message_group for pm in request.messages):
                # FIFO: one message group's messages are stored in request order
                entries = [await self._send_one(pm) for pm in request.messages]
            else:  # concurrently: under sync flush one group commit covers the batch
                entries = list(await asyncio.gather(
                    *(self._send_one(pm) for pm in request.messages)))
        finally:
            self._inflight -= count
        response = service_pb2.SendMessageResponse()
        response.entries.extend(entries)
        codes = {int(e.status.code) for e in entries}
        if len(codes) == 1:
            response.status.CopyFrom(entries[0].status)
        else:
            response.status.CopyFrom(make_status(Code.MULTIPLE_RESULTS, "entries differ"))
        return response

    async def _send_one(self, pm: Any) -> Any:
        entry = service_pb2.SendResultEntry()
        try:
            sp = pm.system_properties
            entry.message_id = sp.message_id
            key = send_key(pm.topic.name, validation.check_message_id(sp.message_id),
                           pm.user_properties)
            cached = self._recent.get(key)
            if cached is not None:
                entry.ParseFromString(cached)
                return entry
            pending = self._pending.get(key)
            if pending is not None:
                entry.ParseFromString(await asyncio.shield(pending))
                return entry
            future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            self._pending[key] = future
            try:
                result = await self._store(pm)
                raw = result.SerializeToString()
                self._recent.put(key, raw)
                future.set_result(raw)
                return result
            except BaseException as exc:
                future.set_exception(exc)
                future.exception()  # retrieved: duplicates waiting on it re-raise it
                raise
            finally:
                del self._pending[key]
        except Exception as exc:
            entry.status.CopyFrom(status_of(exc))
            return entry

    async def _store(self, pm: Any) -> Any:
        config = self.ctx.config
        sp = pm.system_properties
        topic = validation.check_topic(pm.topic.name)
        validation.check_body(pm.body, config)
        tag = sp.tag if sp.HasField("tag") else ""
        validation.check_tag(tag)
        validation.check_keys(sp.keys)
        message_type = convert.message_type_of(sp)
        if sp.HasField("message_group"):
            validation.check_message_group(sp.message_group, config)
        validation.check_properties(dict(pm.user_properties), tag, sp.keys, config)
        if sp.HasField("delivery_timestamp"):
            validation.check_delivery_time(convert.timestamp_ms(sp.delivery_timestamp),
                                           self.ctx.clock(), config)
        cfg = self.clients.topic_config(topic)
        validation.check_type_accepted(topic, cfg.message_type.value, message_type)
        if not cfg.perm & PERM_WRITE:
            raise Forbidden(f"topic {topic!r} is not writeable")
        if self.ctx.had_messages and \
                self.ctx.clock() - self.ctx.started_ms < config.dedupe_recovery_window_ms:
            earlier = await self.ctx.run_in_pool(self._stored_before, topic, sp.message_id,
                                                 dict(pm.user_properties))
            if earlier is not None:
                return earlier
        transactional = message_type == "TRANSACTION"
        if transactional:
            self.clients.watch_transactions(topic)
        msg = convert.to_store(pm, self._queue_for(cfg, sp), transactional=transactional,
                               producer_group=topic if transactional else None)
        result = await self.ctx.run(self.ctx.broker.send_message, msg,
                                    producer_group=topic if transactional else None)
        entry = service_pb2.SendResultEntry()
        entry.status.CopyFrom(ok())
        entry.message_id = sp.message_id
        entry.offset = result.queue_offset
        if transactional:
            entry.transaction_id = encode_transaction_id(
                result.offset_msg_id, result.transaction_id or sp.message_id)
        if result.recall_handle:  # a delayed message, waiting in the schedule topic
            entry.recall_handle = result.recall_handle
        return entry

    def _stored_before(self, topic: str, message_id: str, properties: dict[str, str]) -> Any:
        """A result for a message stored before this start (a retry across a restart)."""
        try:
            ext = self.ctx.broker.store.query_message_by_unique_key(topic, message_id)
        except Exception:  # the lookup is an optimisation; never fail a send over it
            log.debug("unique-key lookup failed for %s", message_id, exc_info=True)
            return None
        if ext is None or ext.topic != topic or any(
                ext.properties.get(k) != v for k, v in properties.items()):
            return None
        entry = service_pb2.SendResultEntry()
        entry.status.CopyFrom(ok())
        entry.message_id = message_id
        entry.offset = ext.queue_offset
        return entry

    def _queue_for(self, cfg: TopicConfig, sp: Any) -> int:
        queues = cfg.write_queue_nums
        if sp.HasField("message_group") and sp.message_group:
            return group_queue(sp.message_group, queues)
        counter = self._round_robin.setdefault(cfg.name, itertools.count())
        return next(counter) % queues

    # --- EndTransaction
    async def end_transaction(self, request: Any, call: CallInfo) -> Any:
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
        await self.ctx.run(self.ctx.broker.end_transaction, topic, broker_txn_id, offset,
                           resolution == RESOLUTION_COMMIT,
                           from_check=int(request.source) == SOURCE_SERVER_CHECK)
        return response

    # --- RecallMessage
    async def recall(self, request: Any, call: CallInfo) -> Any:
        topic = validation.check_topic(request.topic.name)
        if not request.recall_handle:
            raise BadRequest("recall handle is empty")
        # the broker's schedule service cancels it (durably) before it is due; every
        # consumer, whatever its transport, then never sees it
        message_id = await self.ctx.run_in_pool(self.ctx.broker.recall_message, topic,
                                                request.recall_handle)
        response = service_pb2.RecallMessageResponse()
        response.status.CopyFrom(ok())
        response.message_id = message_id
        return response
