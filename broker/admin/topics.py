"""`TopicStatus {topic}`: per queue the min and max offset, message count and the store
time of its first and last message still held (mqadmin topicStatus)."""

from __future__ import annotations

from typing import Any

from broker.admin import params as p
from broker.broker import Broker
from broker.errors import TopicNotFound
from broker.store.store import MessageStore
from protocol.admin import Params


def _store_time(store: MessageStore, topic: str, queue_id: int, offset: int) -> int:
    """Store time of the message at a queue offset; -1 when there is none (any more)."""
    msg = store.get_message_by_queue_offset(topic, queue_id, offset) if offset >= 0 else None
    return -1 if msg is None else msg.store_timestamp


def topic_status(broker: Broker, params: Params) -> dict[str, object]:
    topic = p.topic(params, required=True)
    assert topic is not None
    cfg = broker.get_topic(topic)
    store = broker.store
    queue_ids = set(store.queue_ids(topic))
    if cfg is not None:
        queue_ids |= set(range(max(cfg.read_queue_nums, cfg.write_queue_nums)))
    elif not queue_ids:
        raise TopicNotFound(topic)
    queues: list[dict[str, Any]] = []  # rows read back below
    for q in sorted(queue_ids):
        low, high = store.get_min_offset_in_queue(topic, q), store.get_max_offset_in_queue(topic, q)
        first, last = _store_time(store, topic, q, low), _store_time(store, topic, q, high - 1)
        queues.append(
            {
                "queue_id": q,
                "min_offset": low,
                "max_offset": high,
                "messages": high - low,
                "first_store_time_ms": first if first >= 0 else None,
                "first_store_time": p.iso_ms(first) if first >= 0 else None,
                "last_store_time_ms": last if last >= 0 else None,
                "last_store_time": p.iso_ms(last) if last >= 0 else None,
            }
        )
    lasts = [q["last_store_time_ms"] for q in queues if q["last_store_time_ms"] is not None]
    return {
        "topic": topic,
        "exists": cfg is not None,
        "queues": queues,
        "messages": sum(q["messages"] for q in queues),
        "last_store_time_ms": max(lasts) if lasts else None,
        "last_store_time": p.iso_ms(max(lasts)) if lasts else None,
    }
