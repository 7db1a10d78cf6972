"""A send's copies already in the log: what answers a resend instead of a second copy.

- `recent`: the sends answered OK, by their key (topic, message id, user properties), the
  first answer's serialized entry (bounded by bytes); a resend gets that answer again.
- `unreplicated`: sends stored and answered "not replicated" (a sync-master without a
  slave, or one too slow): the log end a slave must reach, then the entry. A resend waits
  for that copy's replication (`replicated_copy`) instead of storing the message again.
- `stored_before`: right after a start, a send's copy stored before it, by the store's
  unique-key index (a retry that straddles a restart).
"""

from __future__ import annotations

import asyncio
import logging
import struct

from broker.server.context import ServerContext
from broker.server.dedupe import SendResults
from broker.server.status import ok, status_of
from protocol import ext as protocol_ext
from protocol.pb import service_pb2

log = logging.getLogger(__name__)

_END = struct.Struct(">q")  # the log end an unreplicated copy waits for


def _settle_error(
    future: asyncio.Future[BaseException | None], error: BaseException | None
) -> None:
    if not future.done():
        future.set_result(error)


class SendCopies:
    """The copies a resend is answered from; see the module docstring."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.recent = SendResults(ctx.config.dedupe_cache_bytes, ctx.config.dedupe_cache_size)
        self.unreplicated = SendResults(ctx.config.dedupe_cache_bytes // 8)

    def remember_unreplicated(self, key: bytes, entry: service_pb2.SendResultEntry) -> None:
        """A send stored and answered "not replicated": its copy is in the log, below the
        log's end now; a resend is answered from it (`replicated_copy`)."""
        end = self.ctx.broker.store.get_commitlog_max_offset()
        self.unreplicated.put(key, _END.pack(end) + entry.SerializeToString())

    async def replicated_copy(
        self, key: bytes, stored_copy: bytes, loop: asyncio.AbstractEventLoop
    ) -> service_pb2.SendResultEntry:
        """The answer to a resend of a message stored but not replicated: the first
        answer, OK once a slave has the log past that copy (it then counts as answered),
        else "not replicated" again; never a second copy in the log."""
        (end,) = _END.unpack_from(stored_copy)
        entry = service_pb2.SendResultEntry.FromString(stored_copy[_END.size :])
        refused = await self.replicated(end, loop)
        if refused is not None:
            entry.status.CopyFrom(status_of(refused))
            return entry
        entry.status.CopyFrom(ok())
        self.recent.put(key, entry.SerializeToString())
        return entry

    async def replicated(self, end: int, loop: asyncio.AbstractEventLoop) -> BaseException | None:
        """SYNC_MASTER: wait (holding no thread) until a slave has the log up to `end`;
        None then, else the error the send is answered with (the client retries it)."""
        gate = self.ctx.replication
        assert gate is not None
        future: asyncio.Future[BaseException | None] = loop.create_future()

        def done(error: BaseException | None) -> None:  # on a replication thread
            loop.call_soon_threadsafe(_settle_error, future, error)

        gate.when_replicated(end, done)
        return await asyncio.shield(future)

    def stored_before(
        self, topic: str, message_id: str, properties: dict[str, str]
    ) -> service_pb2.SendResultEntry | None:
        """A result for a message stored before this start (a retry across a restart)."""
        try:
            ext = self.ctx.broker.store.query_message_by_unique_key(topic, message_id)
        except Exception:  # the lookup is an optimisation; never fail a send over it
            log.debug("unique-key lookup failed for %s", message_id, exc_info=True)
            return None
        if (
            ext is None
            or ext.topic != topic
            or any(ext.properties.get(k) != v for k, v in properties.items())
        ):
            return None
        entry = service_pb2.SendResultEntry()
        entry.status.CopyFrom(ok())
        entry.message_id = message_id
        entry.offset = ext.queue_offset
        entry.MergeFromString(protocol_ext.queue_id_field(ext.queue_id))
        return entry
