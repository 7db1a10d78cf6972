"""Adapters from `reliable` transports to the outbox's contracts.

`TransportOffsets(transport)` is an `OffsetSource` and a `QueueBounds` over any transport
that can report a group's committed offset (`query_offset(group, queue)`) and a queue's end
(`max_offset(queue)`): the embedded transport (from its broker) and the grpc transport
(GetOffset / QueryOffset, which our server and the Apache RocketMQ 5 proxy both answer).
A `reliable.Producer` already is a `Sender`.

Queue ids are taken on the topic's first broker holding that queue id: stubs record the
queue id and offset of a send, not the broker (one broker, or per-broker outbox tables).
A queue id of -1 (a send over gRPC: the protocol does not say which queue the server
chose) names no queue: both answers are None, and the resend worker treats such a stub as
due by age.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reliable.transport.base import QueueRef


class TransportOffsets:
    """Committed consumer offsets and queue max offsets from a transport."""

    def __init__(self, transport: Any) -> None:
        if not callable(getattr(transport, "query_offset", None)):
            raise TypeError(
                "TransportOffsets needs a transport with query_offset() "
                "(the embedded or the grpc transport)"
            )
        self.transport = transport
        self._routes: dict[str, dict[int, QueueRef]] = {}

    def _queue(self, topic: str, queue_id: int) -> QueueRef | None:
        if queue_id < 0:
            return None
        queues = self._routes.get(topic)
        if queues is None or queue_id not in queues:  # first look, or the route changed
            queues = {q.queue_id: q for q in self.transport.route(topic).read_queues}
            self._routes[topic] = queues
        return queues.get(queue_id)

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        queue = self._queue(topic, queue_id)
        if queue is None:
            return None
        value = int(self.transport.query_offset(group, queue))
        return None if value < 0 else value

    def max_offset(self, topic: str, queue_id: int) -> int | None:
        if not callable(getattr(self.transport, "max_offset", None)):
            return None
        try:
            queue = self._queue(topic, queue_id)
            return None if queue is None else int(self.transport.max_offset(queue))
        except Exception:  # unknown topic or queue, unreachable broker: no bound to offer
            return None
