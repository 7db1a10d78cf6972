"""Pre-touching the commitlog file being written, ahead of the writer, on a thread of its
own (`StoreConfig.warm_mapped_file`, `warm_ahead_bytes`)."""

from __future__ import annotations

import logging
import threading

from broker.store.mapped_file_queue import MappedFileQueue

log = logging.getLogger("broker.store.commitlog")


class Warmer:
    """Pre-touches the commitlog file being written, `ahead` bytes past its write position,
    on a thread of its own: woken by the writer each time it has used half the window, so
    only pages about to be written are faulted in (and, under SYNC_FLUSH, written back)."""

    def __init__(self, queue: MappedFileQueue, ahead: int, flush: bool) -> None:
        self._queue = queue
        self._ahead = ahead
        self._flush = flush
        self._event = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="commitlog-warm", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        files = self._queue.mapped_files
        if files:
            files[-1].warming = True  # until this round is done (bench and tests wait on it)
        self._event.set()

    def stop(self) -> None:
        self._stopped = True
        self._event.set()
        if self._thread is not threading.current_thread():
            self._thread.join(10)

    def _run(self) -> None:
        while True:
            self._event.wait()
            self._event.clear()
            if self._stopped:
                return
            files = self._queue.mapped_files
            if not files:
                continue
            mf = files[-1]
            try:
                mf.populate(mf.wrote_position + self._ahead, flush=self._flush)
            except Exception:  # pragma: no cover - populate swallows the expected ones
                log.exception("warming %s failed", mf.path.name)
                mf.warming = False
