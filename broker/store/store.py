"""`MessageStore`: the facade the rest of the broker uses: put, get, query, admin.

It owns the commitlog, the consume queues, the index, the reput (dispatch) service, the
flush services, cleanup, the checkpoint, the abort file and the JSON config files, and
wires them in this order:

start:    lock the directory -> read checkpoint, note the abort file -> load commitlog,
          consume queues, index -> recover the commitlog (normal or abnormal) -> cut consume
          queues and index back to its end -> write the checkpoint -> create the abort file
          -> re-dispatch what the queues lack (synchronously) -> rebuild the topic-queue
          table from the queues -> start flush, reput, checkpoint and cleanup services ->
          check the units below each queue's tail in the background.
          (What each step does: startup.py.)
shutdown: refuse puts -> dispatch the rest -> final flush of commitlog, queues, index ->
          checkpoint -> close files -> remove the abort file (only when every flush
          succeeded) -> unlock.

Hot paths return status values; queries raise `InvalidQuery` for malformed arguments.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path

from broker.futures import LightFuture
from broker.store import query
from broker.store.batch import encode_batch
from broker.store.checkpoint import (
    StoreCheckpoint,
    abort_file_exists,
    create_abort_file,
    remove_abort_file,
)
from broker.store.cleanup import CleanupService, disk_usage_ratio
from broker.store.codec import (
    DispatchRequest,
    EncodeError,
    check_message_and_return_size,
)
from broker.store.commitlog import CommitLog, topic_queue_key
from broker.store.config import (
    StoreConfig,
    describe,
    read_geometry,
    with_store_geometry,
    write_geometry,
)
from broker.store.consume_queue_store import ConsumeQueueStore
from broker.store.dispatcher import CommitLogDispatcher, ReputService
from broker.store.errors import InvalidQuery, StoreNotRunning
from broker.store.index_service import IndexService
from broker.store.json_config import JsonConfigFile
from broker.store.message import (
    GetMessageResult,
    Message,
    MessageExt,
    PutMessageResult,
    PutMessageStatus,
)
from broker.store.queue_reader import QueueReader
from broker.store.recovery import RecoveryReport, recover_commitlog
from broker.store.service import PeriodicService
from broker.store.startup import (
    UnitCheckService,
    align_to_commitlog,
    redispatch,
    repair_units,
    reput_start,
)
from broker.store.store_lock import StoreLock
from protocol.clock import wall_ms

log = logging.getLogger(__name__)

CONFIG_FILES = ("topics.json", "subscriptionGroup.json", "consumerOffset.json", "delayOffset.json")
_SERVICE_NOT_AVAILABLE = PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE)
_DISK_FULL = PutMessageResult(PutMessageStatus.DISK_FULL)


class _DispatchTracker:
    """Last dispatched record's store time: the consume-queue/index checkpoint bound."""

    def __init__(self) -> None:
        self.store_timestamp = 0

    def dispatch(self, request: DispatchRequest) -> None:
        self.store_timestamp = request.store_timestamp


class MessageStore:
    """Put, get, query; start and shut down every part of the store."""

    def __init__(
        self,
        config: StoreConfig,
        *,
        clock: Callable[[], int] | None = None,
        fsync: Callable[[int], None] = os.fdatasync,
        disk_usage: Callable[[Path], float] = disk_usage_ratio,
    ) -> None:
        """`clock` gives store timestamps (wall ms); `fsync` and `disk_usage` are seams
        for fault injection (a slow or failing disk, a full disk). The file sizes of an
        existing store are its own (`geometry.json`), whatever `config` says."""
        self.created = read_geometry(config.store_dir) is None  # a new store
        config = with_store_geometry(config)
        self.config = config
        self._clock = clock or wall_ms
        self.running = False
        self.commitlog = CommitLog(config, self._clock, fsync=fsync)
        self.consume_queues = ConsumeQueueStore(config)
        self.index = IndexService(config, clock=self._clock)
        self._tracker = _DispatchTracker()
        self.reput = ReputService(
            self.commitlog,
            [self.consume_queues, self.index],
            interval_ms=config.dispatch_interval_ms,
        )
        self.reput.add_dispatcher(self._tracker)
        # every append wakes the dispatcher (no polling while idle, no wait once written)
        self.set_append_hook(None)
        self.cleanup = CleanupService(
            config,
            self.commitlog,
            self.consume_queues,
            self.index,
            disk_usage=disk_usage,
            clock=self._clock,
            dispatched_offset=self._dispatched_offset,
        )
        self.checkpoint = StoreCheckpoint(config.checkpoint_path)
        self._checkpoint_service = PeriodicService(
            "flush-logics", config.flush_interval_consume_queue_ms, self._flush_logics
        )
        self._checkpoint_lock = threading.Lock()
        self._lock = StoreLock(config.store_dir / "lock")
        self._config_files: dict[str, JsonConfigFile] = {}
        self._repair_lock = threading.Lock()
        self.queue_reader = QueueReader(self.consume_queues, self.commitlog, self.repair_queue)
        self.recovery: RecoveryReport | None = None
        self.unit_check: UnitCheckService | None = None  # started by `start`
        self.abnormal_start = False
        # set before `start` to cut the commitlog back to this offset as it recovers (a
        # slave rejoining a new master, broker/ha/rejoin.py): the consume queues and the
        # index are cut with it, as after a torn tail
        self.truncate_to: int | None = None

    def _dispatched_offset(self) -> int:
        """The dispatcher's exact position: cleanup never deletes what is not behind it."""
        return self.reput.reput_from_offset

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Load, recover, re-dispatch, start the background services."""
        if self.running:
            return
        cfg = self.config
        cfg.store_dir.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            self._start_locked()
        except BaseException:
            self._close_files()
            self._lock.release()
            raise

    def _start_locked(self) -> None:
        """The start-up sequence (startup.py: what each step does)."""
        cfg = self.config
        abnormal = abort_file_exists(cfg.abort_path)
        self.abnormal_start = abnormal
        self.checkpoint = StoreCheckpoint.open(cfg.checkpoint_path)
        cfg.config_dir.mkdir(parents=True, exist_ok=True)
        if write_geometry(cfg) and self.created:
            log.info("store created: %s", describe(cfg))
        self.commitlog.load()
        self.consume_queues.load()
        self.index.load(last_exit_ok=not abnormal)

        report = recover_commitlog(self.commitlog, self.checkpoint, abnormal, index_safe=True)
        cut = self.truncate_to
        if cut is not None and 0 <= cut < report.end:
            self.commitlog.queue.truncate_dirty_files(cut, zero_tail=True)
            log.warning(
                "store %s: commitlog cut back from %d to %d (%d bytes)",
                cfg.store_dir,
                report.end,
                cut,
                report.end - cut,
            )
            # what follows treats the cut as a torn tail: queue units and index entries
            # past the new end are cut, and dispatching resumes from before it
            report = dataclasses.replace(report, end=cut, abnormal=True, torn_tail=True)
        self.recovery = report
        unchecked = align_to_commitlog(self.commitlog, self.consume_queues, self.index, report)
        self.reput.reput_from_offset = reput_start(
            self.commitlog, self.consume_queues, self.index, report
        )
        self.reput.skip = dict(report.quarantined)
        self.commitlog.reader.quarantined = frozenset(self.reput.skip)
        log.info(
            "store %s: %s recovery, commitlog end %d, dispatching from %d",
            cfg.store_dir,
            "abnormal" if report.abnormal else "normal",
            report.end,
            self.reput.reput_from_offset,
        )

        self.checkpoint.physic_flushed_offset = report.end
        self.checkpoint.flush()
        create_abort_file(cfg.abort_path)

        # rebuild what was deleted (index/, a queue's directory) from the commitlog, then
        # dispatch what the queues lack, before any put can take a queue offset
        redispatch(cfg.store_dir, self.commitlog, self.consume_queues, self.index, self.reput)

        self.commitlog.start()
        self.reput.start()
        self._checkpoint_service.start()
        self.cleanup.start()
        self.running = True
        # the units below each queue's tail, checked once the store is open (startup.py)
        self.unit_check = UnitCheckService(
            self.commitlog, self.consume_queues, unchecked, report.end, self.repair_queue
        )
        self.unit_check.start()

    def repair_queue(self, topic: str, queue_id: int) -> int:
        """Rewrite every unit of a queue that disagrees with the commitlog (a read found
        one); returns how many were wrong. Reads the whole log: meant for the rare case."""
        cq = self.consume_queues.get(topic, queue_id)
        if cq is None:
            return 0
        with self._repair_lock:
            # every record below the dispatcher's position has its unit
            fixed = repair_units(self.commitlog, cq, self.reput.skip, self.reput.reput_from_offset)
        log.warning(
            "consume queue %s-%d: %d units did not match the commitlog; rewritten",
            topic,
            queue_id,
            fixed,
        )
        return fixed

    def cut_back(self, offset: int) -> int:
        """Cut the running store's commitlog back to `offset` (a record's start), and the
        consume queues, the index and the topic-queue table with it, as `truncate_to` does
        at a start, without closing the store (a slave rejoining its group in-process,
        broker/ha/rejoin.py). Nobody may append meanwhile (a slave's replication is
        stopped first). Returns the bytes cut (0: the log ends at or before `offset`).

        In this order, so a reader never finds a unit whose record is gone: dispatching
        pauses (a round under way ends first); the queues and the index forget what
        points at `offset` or beyond; the commitlog's end moves back, then the bytes
        beyond are zeroed and later files deleted (a file a reader holds goes once it is
        released); dispatching resumes from `offset`; the checkpoint says the log is
        flushed to `offset`, no further.
        """
        if not self.running:
            raise StoreNotRunning(self.config.store_dir, "store", "not running")
        with self.reput.paused(), self._checkpoint_lock:
            end = self.commitlog.get_max_offset()
            if offset >= end:
                return 0
            self.consume_queues.truncate_dirty(offset)
            self.index.truncate_dirty(offset)
            self.commitlog.truncate(offset)
            self.reput.reput_from_offset = min(self.reput.reput_from_offset, offset)
            self.commitlog.reset_table(
                {
                    topic_queue_key(cq.topic, cq.queue_id): cq.get_max_offset_in_queue()
                    for cq in self.consume_queues.queues()
                }
            )
            self.checkpoint.physic_flushed_offset = offset
            self.checkpoint.flush()
        log.warning(
            "store %s: commitlog cut back from %d to %d (%d bytes), running",
            self.config.store_dir,
            end,
            offset,
            end - offset,
        )
        return end - offset

    def shutdown(self) -> None:
        """Stop services, flush everything, checkpoint, remove the abort file."""
        if not self.running:
            return
        self.running = False
        if self.unit_check is not None:
            self.unit_check.shutdown()
        self.cleanup.shutdown()
        self.reput.shutdown()
        clean = self.commitlog.shutdown()
        self._checkpoint_service.shutdown()
        try:
            self._flush_logics(final=True)
        except OSError as exc:
            log.error("final consume queue/index flush failed: %s", exc)
            clean = False
        self._close_files()
        if clean:
            remove_abort_file(self.config.abort_path)
        else:
            log.error(
                "store %s: not every flush succeeded; the next start recovers abnormally",
                self.config.store_dir,
            )
        self._lock.release()

    def _close_files(self) -> None:
        self.consume_queues.shutdown()
        self.index.shutdown()
        self.commitlog.close()

    def _flush_logics(self, final: bool = False) -> None:
        """Flush consume queues and index, then write the checkpoint (lower bounds only)."""
        with self._checkpoint_lock:
            logics_ts = self._tracker.store_timestamp  # read before the flushes it bounds
            for cq in self.consume_queues.queues():  # every dirty file, not one per queue
                cq.mfq.flush_to(cq.mfq.get_max_offset())
            self.index.flush()
            cp = self.checkpoint
            service = self.commitlog.flush_service
            if final and service.failed is None:
                cp.physic_msg_timestamp = max(
                    cp.physic_msg_timestamp,
                    self.commitlog.last_store_timestamp
                    if self.commitlog.get_flushed_offset() >= self.commitlog.get_max_offset()
                    else 0,
                )
            cp.physic_msg_timestamp = max(cp.physic_msg_timestamp, service.flushed_store_timestamp)
            cp.physic_flushed_offset = max(
                cp.physic_flushed_offset, self.commitlog.get_flushed_offset()
            )
            if logics_ts:
                cp.logics_msg_timestamp = max(cp.logics_msg_timestamp, logics_ts)
                cp.index_msg_timestamp = max(cp.index_msg_timestamp, logics_ts)
            cp.flush()

    # ------------------------------------------------------------------ puts
    def _refuse(self) -> PutMessageResult | None:
        if not self.running:
            return _SERVICE_NOT_AVAILABLE
        if self.cleanup.is_disk_full():
            return _DISK_FULL
        return None

    def put_message(self, msg: Message) -> PutMessageResult:
        refused = self._refuse()
        if refused is not None:
            return refused
        return self.commitlog.put_message(msg)

    def put_messages(
        self, msgs: Sequence[Message], *, wait: bool = True, wake: bool = True
    ) -> list[PutMessageResult]:
        """`wait=False`: no SYNC_FLUSH wait here; the caller waits with `when_flushed`.
        `wake=False`: the dispatcher is not woken for these records (see
        `CommitLog.put_messages`); a reader that needs them indexed calls `wait_dispatched`."""
        refused = self._refuse()
        if refused is not None:
            return [refused] * len(msgs)
        return self.commitlog.put_messages(msgs, wait=wait, wake=wake)

    def put_batch(
        self,
        topic: str,
        queue_id: int,
        bodies: Sequence[bytes],
        properties: Mapping[str, str] | None = None,
        *,
        keys: Sequence[str] | None = None,
        uniq_keys: Sequence[str] | None = None,
        flag: int = 0,
        sys_flag: int = 0,
        born_timestamp: int | None = None,
        born_host: tuple[str, int] = ("127.0.0.1", 0),
        wait: bool = True,
    ) -> PutMessageResult:
        """Store `bodies` as consecutive records of one topic/queue (a RocketMQ batch).

        All records share `properties`, flag, sys flag, born time (default: now) and host;
        `keys` / `uniq_keys`, when given, hold one KEYS / UNIQ_KEY value per body. Each
        record is an ordinary record, the same bytes as `put_message` of
        `Message(topic, body, queue_id, flag, {**properties, KEYS: k, UNIQ_KEY: u}, ...)`
        but for offsets and store time. One result with `msg_num == len(bodies)`, the
        first record's offsets and queue offset; an invalid batch (empty, a record or the
        whole batch above `max_message_size`, bad topic/properties) stores nothing.
        """
        refused = self._refuse()
        if refused is not None:
            return refused
        log = self.commitlog
        try:
            batch, key = encode_batch(
                topic,
                queue_id,
                bodies,
                properties,
                keys,
                uniq_keys,
                flag,
                sys_flag,
                self._clock() if born_timestamp is None else born_timestamp,
                born_host,
                log.store_host_raw,
                self.config.max_message_size,
                log.max_record,
            )
        except EncodeError as exc:
            return PutMessageResult(exc.status)
        return log.put_batch(batch, key, wait=wait)

    def when_flushed(self, end: int, callback: Callable[[bool], None]) -> bool:
        """For puts made with `wait=False`: under SYNC_FLUSH call `callback(ok)` (on the
        group-commit thread; keep it short) once the commitlog is on disk past `end`, or
        with False on timeout; False, and no call, when nothing needs waiting for."""
        return self.commitlog.when_flushed(end, callback)

    def flush_alone(self, end: int) -> bool | None:
        """For a put made with `wait=False` by a lone producer: under SYNC_FLUSH fsync past
        `end` on the calling thread, no thread hop, when no one else waits for a flush and
        the disk has been fast; True once on disk, False when the fsync failed. None, and
        nothing done, otherwise (or under ASYNC_FLUSH): wait with `when_flushed` then."""
        return self.commitlog.flush_alone(end)

    def put_message_async(self, msg: Message) -> Future[PutMessageResult]:
        """Append now; the future completes once the flush mode acknowledges the record.

        Under SYNC_FLUSH the future completes on the group-commit thread (or its timeout
        reaper): callbacks added to it must be short or hand their work to an executor,
        or they delay every later acknowledgement.
        """
        refused = self._refuse()
        if refused is not None:
            future: Future[PutMessageResult] = LightFuture()
            future.set_result(refused)
            return future
        return self.commitlog.put_message_async(msg)

    # ------------------------------------------------------------------ consume
    def get_messages(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int,
        tags: Collection[str] | None = None,
    ) -> GetMessageResult:
        """Up to `max_msgs` messages from queue offset `offset`, filtered by tags.

        `tags` None, empty or containing "*" means all. Units are filtered by tag code first,
        then each message's TAGS is checked exactly (hash codes collide). A unit that does
        not point at its record (a damaged queue file) makes the queue be repaired from the
        commitlog (`repair_queue`) and the read start over.
        """
        return self.queue_reader.get_messages(topic, queue_id, offset, max_msgs, tags)

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queues.get(topic, queue_id)
        return 0 if cq is None else cq.get_max_offset_in_queue()

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queues.get(topic, queue_id)
        return 0 if cq is None else cq.get_min_offset_in_queue()

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First queue offset stored at or after `timestamp_ms` (max offset when none)."""
        cq = self.consume_queues.get(topic, queue_id)
        if cq is None:
            return 0
        return cq.get_offset_in_queue_by_time(
            timestamp_ms, query.store_timestamp_lookup(self.commitlog.get_message)
        )

    # ------------------------------------------------------------------ lookups
    def look_message_by_offset(self, commitlog_offset: int) -> MessageExt | None:
        return self.commitlog.look_message(commitlog_offset)

    def is_deleted_incarnation(self, msg: MessageExt) -> bool:
        """The record was written before its topic was last deleted: a topic re-created
        under the same name never shows it (`ConsumeQueueStore.deleted_below`)."""
        return msg.commitlog_offset < self.consume_queues.deleted_below(msg.topic)

    def look_current_message(self, commitlog_offset: int) -> MessageExt | None:
        """The record at `commitlog_offset`, unless it belongs to a deleted incarnation of
        its topic: what the index and message-id lookups return."""
        msg = self.commitlog.look_message(commitlog_offset)
        return None if msg is None or self.is_deleted_incarnation(msg) else msg

    def _look_checked(self, commitlog_offset: int) -> MessageExt | None:
        """The record at `commitlog_offset` only if it is a valid record starting there, of
        its topic's current incarnation."""
        if commitlog_offset < 0:
            return None
        msg = self.look_current_message(commitlog_offset)
        if msg is None:
            return None
        raw = self.commitlog.get_message(commitlog_offset, msg.store_size)
        if raw is None:
            return None
        size, _ = check_message_and_return_size(raw, 0, True, commitlog_offset)
        return msg if size == msg.store_size else None

    def look_message_by_msg_id(self, offset_msg_id: str) -> MessageExt | None:
        """By offset message id (store host + commitlog offset, 32 hex characters)."""
        try:
            return query.look_by_offset_msg_id(self._look_checked, offset_msg_id)
        except InvalidQuery:
            return None

    def get_message_by_queue_offset(
        self, topic: str, queue_id: int, queue_offset: int
    ) -> MessageExt | None:
        cq = self.consume_queues.get(topic, queue_id)
        unit = None if cq is None else cq.get_unit(queue_offset)
        if unit is None:
            return None
        return self.commitlog.look_message(unit[0])

    def query_message_by_key(
        self, topic: str, key: str, max_num: int = 64, begin_ms: int = 0, end_ms: int | None = None
    ) -> list[MessageExt]:
        """Messages of `topic` with exactly `key` among their KEYS, newest first, capped."""
        return query.query_by_key(
            self.index,
            self._look_checked,
            topic,
            key,
            max_num=max_num,
            begin_ms=begin_ms,
            end_ms=end_ms,
        )

    def query_message_by_unique_key(self, topic: str, unique_key: str) -> MessageExt | None:
        """By UNIQ_KEY through the index; else `unique_key` read as an offset message id."""
        try:
            return query.query_by_unique_key(self.index, self._look_checked, topic, unique_key)
        except InvalidQuery:
            return None

    # ------------------------------------------------------------------ admin
    def get_commitlog_min_offset(self) -> int:
        return self.commitlog.get_min_offset()

    def append_replica(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        """A slave's write: records replicated from its master, at the same offsets
        (`CommitLog.append_raw`); the new commitlog end. Raises `StoreNotRunning` when
        stopped, `ReplicaRejected` when the bytes are not valid records at the log's end."""
        if not self.running:
            raise StoreNotRunning(self.config.store_dir, "store", "not running")
        return self.commitlog.append_raw(offset, data)

    def read_replica(self, offset: int, limit: int) -> bytes:
        """A master's read for its slaves: whole records from `offset`, within one file."""
        return self.commitlog.read_records(offset, limit)

    def get_commitlog_max_offset(self) -> int:
        return self.commitlog.get_max_offset()

    def topics(self) -> list[str]:
        names = set(self.consume_queues.topics())
        for key in list(self.commitlog.topic_queue_table):
            names.add(key.rpartition("-")[0])
        return sorted(names)

    def queue_ids(self, topic: str) -> list[int]:
        ids = set(self.consume_queues.queue_ids(topic))
        prefix = f"{topic}-"
        for key in list(self.commitlog.topic_queue_table):
            if key.startswith(prefix) and key[len(prefix) :].isdigit():
                ids.add(int(key[len(prefix) :]))
        return sorted(ids)

    def delete_topics(self, topics: Collection[str]) -> None:
        """Forget the topics' queues and offsets (their records expire with the commitlog)."""
        for topic in topics:
            # records not dispatched yet, or dispatched again after a restart, stay deleted
            self.consume_queues.delete_topic(topic, self.commitlog.get_max_offset())
            self.commitlog.remove_queue_offsets(topic)

    def add_dispatcher(self, d: CommitLogDispatcher) -> None:
        self.reput.add_dispatcher(d)

    def set_append_hook(self, hook: Callable[[], None] | None) -> None:
        """What an append calls so its records get dispatched: by default the reput thread's
        wake-up; a thread that dispatches its own appends (the server's event loop,
        `broker.server.loop_dispatch`) sets its own. None restores the default."""
        self.commitlog.on_append = hook if hook is not None else self.reput.wakeup

    def wait_dispatched(self, timeout_s: float = 5.0) -> bool:
        """Wait until everything put so far is readable through the consume queues."""
        return self.reput.wait_dispatched(self.commitlog.get_max_offset(), timeout_s)

    def is_disk_full(self) -> bool:
        return self.cleanup.is_disk_full()

    def config_file(self, name: str) -> JsonConfigFile:
        """An atomic JSON file under `config/` (topics.json, consumerOffset.json, ...)."""
        if not name or "/" in name or name.startswith(".") or not name.endswith(".json"):
            raise ValueError(f"config file name {name!r} must be a plain *.json name")
        f = self._config_files.get(name)
        if f is None:
            self.config.config_dir.mkdir(parents=True, exist_ok=True)
            f = self._config_files.setdefault(name, JsonConfigFile(self.config.config_dir / name))
        return f

    @property
    def fsync_count(self) -> int:
        """Commitlog fsyncs so far (messages per fsync = puts / this)."""
        return self.commitlog.fsync_count


__all__ = ["CONFIG_FILES", "MessageStore"]
