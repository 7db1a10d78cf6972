"""SimpleConsumer: receive with an invisible time, ack, and extend the lease of slow work.

python examples/simple_consumer.py [STORE_DIR]
"""

from __future__ import annotations

import sys
import tempfile

from reliable import Message, Producer, SimpleConsumer

STORE = {
    "mapped_file_size_commitlog": 16 << 20,
    "max_hash_slot_num": 25_000,
    "max_index_num": 100_000,
}


def main(store_dir: str) -> int:
    with Producer("embedded", store_dir=store_dir, **STORE) as producer:
        for i in range(3):
            producer.send(Message("jobs", f"job-{i}".encode()))
        with SimpleConsumer(
            "workers",
            {"jobs": "*"},
            transport=producer.transport,
            await_duration_s=1,
            invisible_duration_s=30,
        ) as consumer:
            done = 0
            while done < 3:
                for job in consumer.receive(max_messages=2):
                    if job.body == b"job-1":
                        # slow work: hide it for longer (the old receipt handle stops working)
                        consumer.change_invisible_duration(job, 60)
                    print(f"{job.body.decode()} attempt {job.delivery_attempt}")
                    consumer.ack(job)
                    done += 1
    return 0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else tmp))
