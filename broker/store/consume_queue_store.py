"""Every consume queue of a store: created on first dispatch, registered, loaded, cleaned.

    consumequeue/<topic>/<queueId>/...    one `consume_queue.ConsumeQueue` each
    consumequeue.json                     the registry of queues and deleted topics

The dispatcher hands each record to `ConsumeQueueStore.dispatch`, which finds (or creates
and registers) the record's queue and writes its unit. A registered queue whose files are
gone was deleted by hand, and the store rebuilds it from the commitlog.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from broker.store.codec import DispatchRequest
from broker.store.config import StoreConfig
from broker.store.consume_queue import CQ_STORE_UNIT_SIZE, ConsumeQueue, skips_consume_queue
from broker.store.errors import ForeignFile, InvalidMessage, StoreCorrupted
from broker.store.json_config import JsonConfigFile, arr, integer, obj

log = logging.getLogger(__name__)


def _check_topic_dir_name(topic: str) -> None:
    if not topic or topic in (".", "..") or "/" in topic or "\x00" in topic:
        raise InvalidMessage(f"topic {topic!r} cannot name a consume queue directory")


# <store_dir>/consumequeue.json (atomic JSON, `.bak` kept):
#   {"queues":  {"<topic>": [<queueId>, ...], ...},   every queue dispatched to
#    "deleted": {"<topic>": <commitlog offset>, ...}}  topics deleted, and where the log
#                                                      ended then
# A queue is registered (durably) before its first unit is written, so a registered queue
# without files had its directory deleted: the store rebuilds it from the commitlog. A
# deleted topic's records below its offset are never dispatched again (a re-dispatch after
# a restart or a rebuild would bring the topic back); the entry goes once the commitlog's
# min offset passes it.
QUEUE_REGISTRY_NAME = "consumequeue.json"


class ConsumeQueueStore:
    """Every consume queue of the store: create on first dispatch, load, recover, clean."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.root = config.consume_queue_dir
        self.mapped_file_size = config.mapped_file_size_consume_queue
        self._queues: dict[str, dict[int, ConsumeQueue]] = {}
        self._lock = threading.Lock()
        self.registry = JsonConfigFile(config.store_dir / QUEUE_REGISTRY_NAME)
        self._registered: dict[str, set[int]] = {}
        self._deleted: dict[str, int] = {}
        # no registry (nor backup) at load: which queues existed is unknown, and the store
        # rebuilds every queue the commitlog names that has no file
        self.registry_lost = False

    # --- lookup
    def find_or_create(self, topic: str, queue_id: int, *, register: bool = True) -> ConsumeQueue:
        by_id = self._queues.get(topic)
        if by_id is not None:
            cq = by_id.get(queue_id)
            if cq is not None:
                return cq
        _check_topic_dir_name(topic)
        if queue_id < 0:
            raise InvalidMessage(f"queue id {queue_id} is negative")
        with self._lock:
            by_id = self._queues.get(topic, {})
            cq = by_id.get(queue_id)
            if cq is None:
                if register and queue_id not in self._registered.get(topic, ()):
                    self._registered.setdefault(topic, set()).add(queue_id)
                    self._save_registry()  # durable before the queue's first unit
                cq = ConsumeQueue(topic, queue_id, self.root, self.mapped_file_size)
                self._queues = {**self._queues, topic: {**by_id, queue_id: cq}}
            return cq

    def _save_registry(self) -> None:
        self.registry.save(
            {
                "queues": {t: sorted(ids) for t, ids in sorted(self._registered.items()) if ids},
                "deleted": dict(sorted(self._deleted.items())),
            }
        )

    def forget_deleted_below(self, commitlog_min_offset: int) -> None:
        """Drop tombstones of deleted topics whose records are all gone from the log."""
        with self._lock:
            kept = {t: o for t, o in self._deleted.items() if o > commitlog_min_offset}
            if kept != self._deleted:
                self._deleted = kept
                self._save_registry()

    def deleted_below(self, topic: str) -> int:
        """The commitlog offset below which `topic`'s records belong to a deleted
        incarnation of it (where the log ended when it was last deleted); 0 when it never
        was, or when those records have all expired."""
        return self._deleted.get(topic, 0)

    @staticmethod
    def parse_registry(data: dict[str, Any]) -> tuple[dict[str, set[int]], dict[str, int]]:
        """(queues, deleted) of a `consumequeue.json` document (ConfigShapeError)."""
        queues = {
            t: {integer(q, f"queues.{t}[]", minimum=0) for q in arr(ids, f"queues.{t}")}
            for t, ids in obj(data.get("queues"), "queues").items()
        }
        deleted = {
            t: integer(o, f"deleted.{t}")
            for t, o in obj(data.get("deleted", {}), "deleted").items()
        }
        return queues, deleted

    def _load_registry(self) -> None:
        parsed = self.registry.load(self.parse_registry)
        if parsed is None:  # a store from before the registry, or the registry was deleted
            self.registry_lost = True
            self._registered = {
                t: {q for q, cq in by_id.items() if cq.mfq.mapped_files}
                for t, by_id in self._queues.items()
            }
            self._save_registry()
            return
        self._registered, self._deleted = parsed

    def missing_queues(self) -> list[tuple[str, int]]:
        """Registered queues with no file left (their directory was deleted)."""
        out = []
        for topic, ids in sorted(self._registered.items()):
            for qid in sorted(ids):
                cq = self.get(topic, qid)
                if cq is None or not cq.mfq.mapped_files:
                    out.append((topic, qid))
        return out

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        by_id = self._queues.get(topic)
        return None if by_id is None else by_id.get(queue_id)

    def queues(self) -> list[ConsumeQueue]:
        return [cq for by_id in list(self._queues.values()) for cq in list(by_id.values())]

    def topics(self) -> list[str]:
        return sorted(self._queues)

    def queue_ids(self, topic: str) -> list[int]:
        return sorted(self._queues.get(topic, {}))

    # --- lifecycle
    def load(self) -> None:
        """Open every queue under `consumequeue/` (ForeignFile for anything not ours)."""
        self.root.mkdir(parents=True, exist_ok=True)
        for topic_dir in sorted(self.root.iterdir()):
            if not topic_dir.is_dir():
                raise ForeignFile(topic_dir, "a file where a topic directory belongs")
            for queue_dir in sorted(topic_dir.iterdir()):
                if not queue_dir.is_dir() or not queue_dir.name.isdigit():
                    raise ForeignFile(queue_dir, "not a queue-id directory")
                cq = self.find_or_create(topic_dir.name, int(queue_dir.name), register=False)
                cq.load()
        self._load_registry()

    def recover(self) -> None:
        """Recover every queue; a queue whose units are not plausible pointers is dropped
        (`rebuild`) and its (registered) name makes the store rebuild it from the log."""
        for cq in self.queues():
            try:
                cq.recover()
            except StoreCorrupted as exc:
                self.rebuild(cq, str(exc))

    def rebuild(self, cq: ConsumeQueue, reason: str) -> None:
        """Delete a damaged queue's files; it stays registered, so `missing_queues` names it
        and the store dispatches it again from the commitlog."""
        log.warning(
            "consume queue %s-%d is damaged (%s): rebuilding it from the commitlog",
            cq.topic,
            cq.queue_id,
            reason,
        )
        cq.destroy()
        with self._lock:
            if cq.queue_id not in self._registered.get(cq.topic, ()):
                self._registered.setdefault(cq.topic, set()).add(cq.queue_id)
                self._save_registry()

    def get_max_physic_offset(self) -> int:
        """The furthest commitlog end any queue points to; -1 when every queue is empty."""
        return max((cq.get_last_offset() for cq in self.queues()), default=-1)

    def dispatch(self, request: DispatchRequest) -> None:
        """The dispatcher hook: one unit per committed (or non-transactional) message."""
        if skips_consume_queue(request.sys_flag):
            return
        if self._deleted and request.commitlog_offset < self._deleted.get(request.topic, -1):
            return  # a record of a topic deleted after it was written
        cq = self.find_or_create(request.topic, request.queue_id)
        if not cq.put_message_position_info(request):
            raise StoreCorrupted(
                cq.directory,
                request.queue_offset * CQ_STORE_UNIT_SIZE,
                "cannot create a consume queue file",
            )

    def dispatch_batch(self, requests: Sequence[DispatchRequest]) -> None:
        """`dispatch` for records in commitlog order: each run of records of one queue is
        written with one `ConsumeQueue.put_units`."""
        run: list[DispatchRequest] = []
        cq: ConsumeQueue | None = None
        deleted = self._deleted
        for request in requests:
            if skips_consume_queue(request.sys_flag):
                continue
            if deleted and request.commitlog_offset < deleted.get(request.topic, -1):
                continue  # a record of a topic deleted after it was written
            if cq is None or request.topic != cq.topic or request.queue_id != cq.queue_id:
                if run:
                    self._put_run(cq, run)  # type: ignore[arg-type]
                    run = []
                cq = self.find_or_create(request.topic, request.queue_id)
            run.append(request)
        if run:
            self._put_run(cq, run)  # type: ignore[arg-type]

    def _put_run(self, cq: ConsumeQueue, run: list[DispatchRequest]) -> None:
        if not cq.put_units(run):
            for request in run:  # what is written is skipped; raises at the unit that fails
                self.dispatch(request)

    def truncate_dirty(self, phy_offset: int) -> None:
        for cq in self.queues():
            cq.truncate_dirty_logic_files(phy_offset)

    def correct_min_offset(self, commitlog_min_offset: int) -> None:
        for cq in self.queues():
            cq.correct_min_offset(commitlog_min_offset)

    def delete_expired_files(self, commitlog_min_offset: int) -> int:
        return sum(cq.delete_expired_file(commitlog_min_offset) for cq in self.queues())

    def flush(self, least_pages: int = 0) -> bool:
        result = True
        for cq in self.queues():
            result = cq.flush(least_pages) and result
        return result

    def delete_topic(self, topic: str, commitlog_end: int = -1) -> None:
        """Forget the topic's queues; with `commitlog_end`, its records below that offset
        are never dispatched again (they stay in the commitlog until it expires)."""
        with self._lock:
            queues = dict(self._queues)
            by_id = queues.pop(topic, {})
            self._queues = queues
            was = self._registered.pop(topic, None)
            if commitlog_end > 0:
                self._deleted[topic] = max(commitlog_end, self._deleted.get(topic, 0))
            if was is not None or commitlog_end > 0:
                self._save_registry()
        for cq in by_id.values():
            cq.destroy()
        topic_dir = self.root / topic
        for queue_dir in sorted(topic_dir.glob("*")):
            if queue_dir.is_dir() and not any(queue_dir.iterdir()):
                queue_dir.rmdir()
        if topic_dir.is_dir() and not any(topic_dir.iterdir()):
            topic_dir.rmdir()

    def shutdown(self) -> None:
        for cq in self.queues():
            cq.shutdown()

    def destroy(self) -> None:
        for cq in self.queues():
            cq.destroy()
        self._queues.clear()
