"""Consume offsets: in the broker for clustering, local for broadcasting.

Updates are cheap and in memory; `persist_all` writes them (every few seconds and at shutdown).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from reliable.consumer.process_queue import ProcessQueue
from reliable.transport.base import PullTransport, QueueRef

log = logging.getLogger(__name__)


class OffsetStore:
    def __init__(self) -> None:
        self._table: dict[QueueRef, int] = {}
        self._lock = threading.Lock()

    def update(
        self,
        queue: QueueRef,
        offset: int,
        *,
        increase_only: bool = True,
        of: ProcessQueue | None = None,
    ) -> None:
        """Record `queue`'s offset. `of`: the queue's process queue, whose progress this is;
        nothing is recorded once it is dropped (the queue rebalanced away). Its flag is read
        under this store's lock, so a consume finishing as its queue is dropped never puts
        back the entry the drop's `remove` took out: a stale entry would be committed for a
        queue this consumer no longer owns, every persist, behind its new owner's progress,
        and resumed from if the queue came back."""
        if offset < 0:
            return
        with self._lock:
            if of is not None and of.dropped:
                return
            old = self._table.get(queue, -1)
            if not increase_only or offset > old:
                self._table[queue] = offset

    def get(self, queue: QueueRef) -> int:
        with self._lock:
            return self._table.get(queue, -1)

    def read(self, queue: QueueRef) -> int:
        """The offset to resume from: memory first, then the persisted value; -1 if none."""
        return self.get(queue)

    def remove(self, queue: QueueRef) -> None:
        with self._lock:
            self._table.pop(queue, None)

    def snapshot(self) -> dict[QueueRef, int]:
        with self._lock:
            return dict(self._table)

    def persist(self, queue: QueueRef) -> None:
        raise NotImplementedError

    def persist_all(self) -> None:
        raise NotImplementedError


class RemoteOffsetStore(OffsetStore):
    """Clustering: the group's offsets live in the broker."""

    def __init__(self, transport: PullTransport, group: str) -> None:
        super().__init__()
        self._transport = transport
        self._group = group

    def read(self, queue: QueueRef) -> int:
        local = self.get(queue)
        if local >= 0:
            return local
        remote = self._transport.query_offset(self._group, queue)
        if remote >= 0:
            self.update(queue, remote)
        return remote

    def persist(self, queue: QueueRef) -> None:
        offset = self.get(queue)
        if offset >= 0:
            self._transport.commit_offset(self._group, queue, offset)

    def persist_all(self) -> None:
        for queue, offset in self.snapshot().items():
            try:
                self._transport.commit_offset(self._group, queue, offset)
            except Exception as exc:  # retried at the next persist
                log.warning(
                    "committing offset %s of %s failed: %r",
                    offset,
                    queue,
                    exc,
                    exc_info=log.isEnabledFor(logging.DEBUG),
                )


class LocalOffsetStore(OffsetStore):
    """Broadcasting: each consumer keeps its own offsets (in a JSON file when `path` is set)."""

    def __init__(self, path: Path | None = None) -> None:
        super().__init__()
        self._path = path
        if path is not None and path.exists():
            for key, offset in json.loads(path.read_text()).items():
                topic, broker, qid = key.rsplit("|", 2)
                self.update(QueueRef(topic, broker, int(qid)), int(offset))

    def persist(self, queue: QueueRef) -> None:
        self.persist_all()

    def persist_all(self) -> None:
        if self._path is None:
            return
        data = {f"{q.topic}|{q.broker}|{q.queue_id}": o for q, o in self.snapshot().items()}
        tmp = self._path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
