"""Producer send modes: sync, async with a callback, awaitable, oneway and batch.

python examples/producer_modes.py [STORE_DIR]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile

from reliable import Message, Producer, SendReceipt

STORE = {
    "mapped_file_size_commitlog": 16 << 20,
    "max_hash_slot_num": 25_000,
    "max_index_num": 100_000,
}


def main(store_dir: str) -> int:
    with Producer(
        "embedded", store_dir=store_dir, retry_times_when_send_failed=2, **STORE
    ) as producer:
        # sync: returns once the broker stored it (retried on another queue if needed)
        r = producer.send(Message("events", b"sync", tags="created", keys=["order-1"]))
        print(f"sync     -> queue {r.queue_id} offset {r.queue_offset} id {r.message_id}")

        # async with a callback, and as a future
        def on_success(receipt: SendReceipt) -> None:
            print(f"callback -> queue {receipt.queue_id} offset {receipt.queue_offset}")

        producer.send_async(Message("events", b"async"), on_success=on_success).result(10)

        # awaitable, from asyncio code
        r = asyncio.run(producer.asend(Message("events", b"awaited")))
        print(f"awaited  -> queue {r.queue_id} offset {r.queue_offset}")

        # oneway: fire and forget (no receipt, no error)
        producer.send_oneway(Message("events", b"oneway"))

        # batch: one topic, one queue, one round trip
        rs = producer.send_batch([Message("events", f"item-{i}".encode()) for i in range(3)])
        print(f"batch    -> queue {rs[0].queue_id} offsets {[x.queue_offset for x in rs]}")
    return 0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else tmp))
