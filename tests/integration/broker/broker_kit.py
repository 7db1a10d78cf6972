"""Helpers shared by the delivery-layer tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from broker.broker import Broker, PullStatus
from broker.config import BrokerConfig
from broker.store.config import WATERMARKS_OFF, FlushMode, StoreConfig
from broker.store.message import Message, MessageExt
from protocol.props import Prop

T0 = 1_763_790_000_000
LEVELS = "100ms 200ms 300ms 400ms 500ms 600ms 700ms 800ms"


class ManualClock:
    """Milliseconds since the epoch that move only when a test moves them."""

    def __init__(self, start: int = T0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return self._now

    def advance(self, ms: int) -> int:
        with self._lock:
            self._now += ms
            return self._now


def store_config(path: Path, flush: FlushMode = FlushMode.ASYNC_FLUSH) -> StoreConfig:
    return StoreConfig(
        store_dir=path,
        mapped_file_size_commitlog=256 * 1024,
        mapped_file_size_consume_queue=20 * 1024,
        max_hash_slot_num=1024,
        max_index_num=4096,
        warm_mapped_file=False,
        flush_mode=flush,
        **WATERMARKS_OFF,
    )  # the host's disk is shared


def broker_config(**overrides: object) -> BrokerConfig:
    values: dict[str, object] = {
        "message_delay_level": LEVELS,
        "schedule_interval_ms": 10_000,
        "pop_revive_interval_ms": 50,
        "transaction_timeout_ms": 1_000,
        "transaction_check_interval_ms": 500,
        "transaction_check_max": 3,
    }
    values.update(overrides)
    return BrokerConfig(**values)  # type: ignore[arg-type]


BrokerFactory = Callable[..., Broker]


_counter = [0]


def msg(
    topic: str,
    body: bytes = b"hello",
    *,
    queue_id: int = 0,
    tags: str | None = None,
    keys: str | None = None,
    **props: str,
) -> Message:
    _counter[0] += 1
    properties = {Prop.UNIQ_KEY: f"ID{_counter[0]:030d}", **props}
    if tags:
        properties[Prop.TAGS] = tags
    if keys:
        properties[Prop.KEYS] = keys
    return Message(topic=topic, body=body, queue_id=queue_id, properties=properties)


def settle(broker: Broker) -> None:
    """Everything put so far is dispatched (readable from the consume queues)."""
    assert broker.store.wait_dispatched(timeout_s=10.0)


def drain(broker: Broker, group: str, topic: str) -> list[MessageExt]:
    """Pull every queue of `topic` from the group's offset to the end, committing."""
    settle(broker)
    route = broker.route(topic)
    out: list[MessageExt] = []
    for qid in route.read_queue_ids:
        offset = broker.query_offset(group, topic, qid)
        if offset < 0:
            offset = broker.min_offset(topic, qid)
        while True:
            result = broker.pull_message(group, topic, qid, offset, 32)
            out.extend(result.messages)
            if result.status is not PullStatus.FOUND and result.next_begin_offset == offset:
                break
            if result.next_begin_offset == offset:
                break
            offset = result.next_begin_offset
        broker.commit_offset(group, topic, qid, offset)
    return out
