"""Ordered messages: a message group (sharding key) keeps its order end to end.

The producer sends every message of a group to one queue; an orderly handler consumes each
queue on one thread in order, retrying a failure locally instead of skipping ahead.

    python examples/ordered_messages.py [STORE_DIR]
"""

from __future__ import annotations

import logging
import sys
import tempfile
import threading
from collections import defaultdict

from reliable import Message, ReceivedMessage, Worker, handler

STORE = {
    "mapped_file_size_commitlog": 16 << 20,
    "max_hash_slot_num": 25_000,
    "max_index_num": 100_000,
}
STEPS = ["created", "paid", "shipped", "delivered"]

seen: defaultdict[str, list[str]] = defaultdict(list)
failed_once: set[str] = set()
finished = threading.Event()


@handler("order-status", group="tracking", orderly=True, suspend_ms=100, consume_from="first")
def track(message: ReceivedMessage) -> None:
    order, step = message.message_group or "", message.body.decode()
    if step == "paid" and order not in failed_once:
        failed_once.add(order)
        raise RuntimeError("ledger busy")  # the queue pauses, then retries this message
    seen[order].append(step)
    if sum(len(v) for v in seen.values()) == 3 * len(STEPS):
        finished.set()


def main(store_dir: str) -> int:
    with Worker(track, store_dir=store_dir, **STORE) as worker, worker.producer() as producer:
        for step in STEPS:
            for order in ("order-1", "order-2", "order-3"):
                producer.send(Message("order-status", step.encode(), message_group=order))
        if not finished.wait(30):
            return 1
    for order, steps in sorted(seen.items()):
        print(order, " -> ".join(steps))
    return 0 if all(steps == STEPS for steps in seen.values()) else 1


if __name__ == "__main__":
    # handler failures are logged as warnings with tracebacks; keep the demo's output short
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else tmp))
