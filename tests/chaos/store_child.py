"""Child process for the store crash tests: appends under SYNC_FLUSH until killed.

Usage: python store_child.py STORE_DIR RUN THREADS

Prints `READY` once the store has started (after recovering from the previous kill), then
one line `<commitlog offset> <run> <index>` per acknowledged (PUT_OK) message, each written
with a single os.write so a line is either whole or absent when the process is killed.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from pathlib import Path

from broker.store.config import WATERMARKS_OFF, FlushMode, StoreConfig
from broker.store.message import Message
from broker.store.store import MessageStore
from protocol.props import Prop

TOPIC = "CrashTopic"
QUEUES = 3


def crash_config(store_dir: Path) -> StoreConfig:
    return StoreConfig(
        store_dir=store_dir,
        mapped_file_size_commitlog=64 * 1024,
        mapped_file_size_consume_queue=20 * 256,
        max_hash_slot_num=512,
        max_index_num=2048,
        flush_mode=FlushMode.SYNC_FLUSH,
        **WATERMARKS_OFF,  # the host's disk is shared
        warm_mapped_file=True,
        flush_interval_consume_queue_ms=100,
    )


def body_for(run: int, index: int) -> bytes:
    digest = hashlib.sha256(f"{run}-{index}".encode()).digest()
    return digest * (index % 40 + 1)


def key_for(run: int, index: int) -> str:
    return f"k{run}-{index}"


def uniq_for(run: int, index: int) -> str:
    return f"U{run:04d}{index:08d}"


def message_for(run: int, index: int) -> Message:
    return Message(
        TOPIC,
        body_for(run, index),
        queue_id=index % QUEUES,
        properties={
            Prop.KEYS: f"{key_for(run, index)} run{run}",
            Prop.UNIQ_KEY: uniq_for(run, index),
            Prop.TAGS: f"t{index % 2}",
        },
    )


def main() -> None:
    store_dir, run, threads = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    store = MessageStore(crash_config(store_dir))
    store.start()
    os.write(1, b"READY\n")
    counter = iter(range(10**9))
    lock = threading.Lock()

    def produce() -> None:
        while True:
            with lock:
                i = next(counter)
            r = store.put_message(message_for(run, i))
            if r.ok and r.append is not None:
                os.write(1, f"{r.append.wrote_offset} {run} {i}\n".encode())
            time.sleep(0.001)

    workers = [threading.Thread(target=produce, daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


if __name__ == "__main__":
    main()
