"""GetOffset and QueryOffset: a consumer group's committed offset and a queue's bounds.

The Apache proxy answers these (its `OffsetActivity`) for pull consumers; the framework's
outbox needs them too: the resend worker's watermark is the group's committed offset per
queue, and a recorded send offset at or past a queue's end was lost by the broker.

- GetOffset(group, queue) -> the group's committed offset (the next offset it will
  consume; for invisible-time consumption the lowest offset not yet acknowledged), or
  `OFFSET_NOT_FOUND` when the group has none on that queue.
- QueryOffset(queue, BEGINNING | END | TIMESTAMP) -> the queue's min offset, max offset
  (one past the last message), or the first offset stored at/after the timestamp
  (`BAD_REQUEST` without one).

Both read: they never create a topic or a group. A queue id outside the topic's queues is
`ILLEGAL_OFFSET`.
"""

from __future__ import annotations

from broker.errors import TopicNotFound
from broker.server import convert
from broker.server.context import CallInfo, ServerContext
from broker.server.errors import BadRequest, IllegalOffset, OffsetNotFound
from broker.server.status import ok
from broker.server.validation import check_group, check_topic
from protocol.pb import definition_pb2, service_pb2

_BEGINNING = definition_pb2.QueryOffsetPolicy.Value("BEGINNING")
_END = definition_pb2.QueryOffsetPolicy.Value("END")
_TIMESTAMP = definition_pb2.QueryOffsetPolicy.Value("TIMESTAMP")


class OffsetHandlers:
    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx

    def _queue(self, mq: definition_pb2.MessageQueue) -> tuple[str, int]:
        topic = check_topic(mq.topic.name)
        cfg = self.ctx.broker.get_topic(topic)
        if cfg is None:
            raise TopicNotFound(topic)
        queue_id = int(mq.id)
        if not 0 <= queue_id < max(cfg.read_queue_nums, cfg.write_queue_nums):
            raise IllegalOffset(f"topic {topic!r} has no queue {queue_id}")
        return topic, queue_id

    async def get_offset(
        self, request: service_pb2.GetOffsetRequest, call: CallInfo
    ) -> service_pb2.GetOffsetResponse:
        group = check_group(request.group.name)
        topic, queue_id = self._queue(request.message_queue)
        offset = await self.ctx.run(self.ctx.broker.query_offset, group, topic, queue_id)
        if offset < 0:
            raise OffsetNotFound(f"group {group!r} has no offset on {topic}#{queue_id}")
        response = service_pb2.GetOffsetResponse()
        response.status.CopyFrom(ok())
        response.offset = offset
        return response

    async def query_offset(
        self, request: service_pb2.QueryOffsetRequest, call: CallInfo
    ) -> service_pb2.QueryOffsetResponse:
        topic, queue_id = self._queue(request.message_queue)
        broker = self.ctx.broker
        policy = int(request.query_offset_policy)
        if policy == _BEGINNING:
            offset = await self.ctx.run(broker.min_offset, topic, queue_id)
        elif policy == _END:
            offset = await self.ctx.run(broker.max_offset, topic, queue_id)
        elif policy == _TIMESTAMP:
            if not request.HasField("timestamp"):
                raise BadRequest("a TIMESTAMP offset query needs a timestamp")
            offset = await self.ctx.run(
                broker.store.get_offset_in_queue_by_time,
                topic,
                queue_id,
                convert.timestamp_ms(request.timestamp),
            )
        else:
            raise BadRequest(f"unknown query offset policy {policy}")
        response = service_pb2.QueryOffsetResponse()
        response.status.CopyFrom(ok())
        response.offset = offset
        return response
