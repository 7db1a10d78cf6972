"""PushConsumer with a listener: two consumers of one group share the queues; when one
stops, the other takes its queues over. Broadcasting gives every consumer every message.

    python examples/push_consumer.py [STORE_DIR]
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from collections import Counter

from reliable import (
    ConsumeContext,
    ConsumeFrom,
    ConsumeResult,
    Message,
    MessageModel,
    Producer,
    PushConsumer,
    ReceivedMessage,
)

STORE = {
    "mapped_file_size_commitlog": 16 << 20,
    "max_hash_slot_num": 25_000,
    "max_index_num": 100_000,
}
FAST = {
    "rebalance_interval_s": 0.5,
    "heartbeat_interval_s": 0.5,
    "consume_from": ConsumeFrom.FIRST,
    "consume_threads": 4,
}

seen: Counter[str] = Counter()
by_consumer: Counter[str] = Counter()
lock = threading.Lock()


def listener_for(name: str):  # type: ignore[no-untyped-def]
    def consume(messages: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        with lock:
            for m in messages:
                seen[m.message_id] += 1
                by_consumer[name] += 1
        return ConsumeResult.SUCCESS

    return consume


def wait_for(predicate, seconds: float = 30) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.time() + seconds
    while not predicate() and time.time() < deadline:
        time.sleep(0.05)
    return bool(predicate())


def main(store_dir: str) -> int:
    with Producer("embedded", store_dir=store_dir, **STORE) as producer:
        t = producer.transport
        a = PushConsumer("stats", listener_for("a"), {"clicks": "*"}, transport=t, **FAST)
        b = PushConsumer("stats", listener_for("b"), {"clicks": "*"}, transport=t, **FAST)
        with a, b:
            ids = {producer.send(Message("clicks", b"click")).message_id for _ in range(50)}
            ok = wait_for(lambda: ids <= set(seen))
            ok = ok and wait_for(lambda: not set(a.assigned_queues) & set(b.assigned_queues))
            print(
                "a holds",
                [q.queue_id for q in a.assigned_queues if q.topic == "clicks"],
                "b holds",
                [q.queue_id for q in b.assigned_queues if q.topic == "clicks"],
            )
            b.shutdown()  # graceful: commits its offsets, leaves the group
            ids |= {producer.send(Message("clicks", b"click")).message_id for _ in range(50)}
            ok = ok and wait_for(lambda: ids <= set(seen))
            print(
                "after b left, a holds",
                [q.queue_id for q in a.assigned_queues if q.topic == "clicks"],
            )
        print(f"100 sent, {len(seen)} consumed, by consumer {dict(by_consumer)}")

        everyone: Counter[str] = Counter()

        def count(name: str):  # type: ignore[no-untyped-def]
            def consume(messages: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
                with lock:
                    everyone[name] += len(messages)
                return ConsumeResult.SUCCESS

            return consume

        x = PushConsumer(
            "cache-refresh",
            count("x"),
            {"config": "*"},
            transport=t,
            message_model=MessageModel.BROADCASTING,
            **FAST,
        )
        y = PushConsumer(
            "cache-refresh",
            count("y"),
            {"config": "*"},
            transport=t,
            message_model=MessageModel.BROADCASTING,
            **FAST,
        )
        with x, y:
            for _ in range(5):
                producer.send(Message("config", b"reload"))
            ok = ok and wait_for(lambda: everyone["x"] == 5 and everyone["y"] == 5)
        print("broadcast:", dict(everyone))
    return 0 if ok else 1


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else tmp))
