"""Delayed and timed messages: by delay level, or at an absolute time.

python examples/delayed_messages.py [STORE_DIR]
"""

from __future__ import annotations

import sys
import tempfile
import time

from reliable import Message, Producer, SimpleConsumer

# level 1 = 200 ms, level 2 = 1 s in this demo's table (default: 1s 5s 10s 30s 1m ...)
STORE = {
    "mapped_file_size_commitlog": 16 << 20,
    "max_hash_slot_num": 25_000,
    "max_index_num": 100_000,
    "delay_levels": "200ms 1s",
}


def main(store_dir: str) -> int:
    with (
        Producer("embedded", store_dir=store_dir, **STORE) as producer,
        SimpleConsumer(
            "reminders", {"reminders": "*"}, store_dir=store_dir, await_duration_s=0.5, **STORE
        ) as consumer,
    ):
        start = time.time()
        producer.send(Message("reminders", b"in 1 s (level 2)", delay_level=2))
        producer.send(
            Message("reminders", b"at start + 0.5 s", deliver_at_ms=int((start + 0.5) * 1000))
        )
        got = 0
        while got < 2 and time.time() - start < 30:
            for m in consumer.receive(10):
                print(f"{time.time() - start:4.1f}s  {m.body.decode()}")
                consumer.ack(m)
                got += 1
    return 0 if got == 2 else 1


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else tmp))
