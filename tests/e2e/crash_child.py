"""A consumer process for the SIGKILL test: the broker (embedded, SYNC_FLUSH) and the
consumer live here; the parent kills this process and starts it again.

    python crash_child.py STORE_DIR OUT_DIR produce N   # send N while consuming
    python crash_child.py STORE_DIR OUT_DIR recover     # consume until everything sent is done

`sent.log` gets a message id once the broker acknowledged it (on disk: SYNC_FLUSH);
`processed.log` gets a message id once the handler finished it. Both are fsynced per line.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import reliable
from broker.store.config import FlushMode
from reliable import Message, Producer, ReceivedMessage, Worker, handler
from tests.e2e.helpers import FAST, broker_config, store_config


class Log:
    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def add(self, line: str) -> None:
        with self._lock:
            os.write(self._fd, (line + "\n").encode())
            os.fsync(self._fd)


def main() -> None:
    store_dir, out_dir, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    sent, processed = Log(out_dir / "sent.log"), Log(out_dir / "processed.log")
    transport = reliable.connect(
        "embedded",
        store_config=store_config(store_dir, flush_mode=FlushMode.SYNC_FLUSH),
        broker_config=broker_config(),
    )
    transport.start()

    @handler("crash", group="crash-g", **dict(FAST, consume_threads=2))
    def work(message: ReceivedMessage) -> None:
        time.sleep(0.01)  # slower than the producer: a backlog builds up
        processed.add(message.message_id)

    with Worker(work, transport=transport):
        if mode == "produce":
            with Producer(transport) as producer:
                for i in range(int(sys.argv[4])):
                    receipt = producer.send(Message("crash", str(i).encode()))
                    sent.add(receipt.message_id)
            (out_dir / "produced").touch()
            time.sleep(3600)  # the parent kills us
        else:
            want = set((out_dir / "sent.log").read_text().split())
            while not want <= set((out_dir / "processed.log").read_text().split()):
                time.sleep(0.05)
            (out_dir / "recovered").touch()
    transport.close()


if __name__ == "__main__":
    main()
