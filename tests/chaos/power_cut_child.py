"""Child process for the power-cut test: appends under SYNC_FLUSH until killed, and records
how much of the commitlog each fdatasync made durable.

Usage: python power_cut_child.py STORE_DIR DURABLE_FILE

The store's fsync seam is wrapped: before each fdatasync the commitlog's written end is
read (every byte below it is in the file's page cache), and once fdatasync returns that
offset is written to DURABLE_FILE. Prints `READY`, then `<offset> <size> <index>` per
acknowledged message (one os.write each: a line is whole or absent after SIGKILL).
"""

from __future__ import annotations

import os
import struct
import sys
import threading
from pathlib import Path

from broker.store.config import WATERMARKS_OFF, FlushMode, StoreConfig
from broker.store.message import Message
from broker.store.store import MessageStore
from protocol.props import Prop

TOPIC = "PowerCut"
QUEUES = 2
# one commitlog file for the whole run (so "the commitlog's end" is in the file being
# fsynced), far from half full (no next file prepared, whose fsync would be recorded)
FILE_SIZE = 64 << 20


def config(store_dir: Path) -> StoreConfig:
    return StoreConfig(
        store_dir=store_dir,
        mapped_file_size_commitlog=FILE_SIZE,
        mapped_file_size_consume_queue=20 * 4096,
        max_hash_slot_num=1024,
        max_index_num=8192,
        flush_mode=FlushMode.SYNC_FLUSH,
        flush_interval_consume_queue_ms=50,
        **WATERMARKS_OFF,
    )


def message(index: int) -> Message:
    return Message(
        TOPIC,
        f"m{index}-".encode() * (index % 50 + 1),
        queue_id=index % QUEUES,
        properties={Prop.KEYS: f"k{index}", Prop.UNIQ_KEY: f"U{index:010d}"},
    )


def main() -> None:
    store_dir, durable = Path(sys.argv[1]), Path(sys.argv[2])
    out = os.open(durable, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    store: MessageStore | None = None

    def fsync(fd: int) -> None:
        end = store.commitlog.get_max_offset() if store is not None else 0
        os.fdatasync(fd)
        os.pwrite(out, struct.pack(">q", end), 0)

    store = MessageStore(config(store_dir), fsync=fsync)
    store.start()
    os.write(1, b"READY\n")
    counter = iter(range(10**9))
    lock = threading.Lock()

    def produce() -> None:
        while True:
            with lock:
                i = next(counter)
            r = store.put_message(message(i))
            if r.ok and r.append is not None:
                os.write(1, f"{r.append.wrote_offset} {r.append.wrote_bytes} {i}\n".encode())

    workers = [threading.Thread(target=produce, daemon=True) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


if __name__ == "__main__":
    main()
