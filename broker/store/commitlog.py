"""The commitlog: every message of every topic, appended to one sequence of mapped files.

Append path (the hot path of the whole broker):

1. outside the lock: encode the complete record (`codec.encode_record`: topic, properties,
   hosts, the partial checksum) into a bytearray of its final size, and build the
   topic-queue key;
2. under the lock: take the last file (rolling over with a blank record when the record
   plus an 8-byte blank would not fit), patch QUEUEOFFSET, PHYSICALOFFSET and
   STORETIMESTAMP in and complete RECORDCRC over them (`codec.seal`: one C call), copy
   the record into the file with one slice assignment into the mapping (one `pwrite`
   under SYNC_FLUSH: `MappedFile.pwrite` says why), move `wrote_position` (readers
   never see a half-copied record), bump the queue offset;
3. outside the lock: build the result and, under SYNC_FLUSH, wait for the group commit.

Transaction PREPARED and ROLLBACK records get queue offset 0 and do not advance the
topic-queue table: they never reach a consume queue.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from broker.futures import LightFuture
from broker.store import codec
from broker.store.batch import RecordBatch
from broker.store.codec import (
    END_FILE_MIN_BLANK_LENGTH,
    EncodeError,
    encode_blank,
    encode_host,
    encode_record,
    is_queued,
)
from broker.store.commitlog_reader import CommitLogReader
from broker.store.config import FlushMode, StoreConfig
from broker.store.errors import ReplicaRejected, StoreNotRunning
from broker.store.flush import FlushCommitLogService, GroupCommitService
from broker.store.mapped_file import MappedFile
from broker.store.mapped_file_queue import MappedFileAllocator, MappedFileQueue
from broker.store.message import (
    AppendMessageResult,
    Message,
    MessageExt,
    PutMessageResult,
    PutMessageStatus,
)
from broker.store.replica_check import check_replica
from broker.store.warmer import Warmer

log = logging.getLogger(__name__)

_PUT_OK = PutMessageStatus.PUT_OK
_seal = codec.seal  # QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP and RECORDCRC


def topic_queue_key(topic: str, queue_id: int) -> str:
    return f"{topic}-{queue_id}"


class CommitLog:
    """Append-only log of all records, with the topic-queue offset table and flushing."""

    def __init__(
        self,
        config: StoreConfig,
        clock: Callable[[], int],
        fsync: Callable[[int], None] = os.fdatasync,
    ) -> None:
        self.config = config
        self._clock = clock
        self.file_size = config.mapped_file_size_commitlog
        sync = config.flush_mode is FlushMode.SYNC_FLUSH
        self._warm_ahead = max(config.warm_ahead_bytes, 0)
        allocator = MappedFileAllocator(
            warm=config.warm_mapped_file and self._warm_ahead > 0,
            flush_on_warm=sync,
            warm_limit=self._warm_ahead,
        )
        self.queue = MappedFileQueue(config.commitlog_dir, self.file_size, allocator, fsync=fsync)
        self.topic_queue_table: dict[str, int] = {}
        self.last_store_timestamp = 0
        self.records_put = 0  # records appended since start, under `_lock` (metrics)
        # (log end, records_put) after each append, when a master counts its slaves' lag
        # in messages (broker.ha); None: not kept, no work on the put path
        self.count_marks: deque[tuple[int, int]] | None = None
        self._lock = threading.Lock()
        self._store_host_raw = encode_host(config.store_host)
        self._max_message_size = config.max_message_size
        self._max_record = self.file_size - END_FILE_MIN_BLANK_LENGTH
        self._prepare_next_at = self.file_size // 2
        # the writer wakes the warmer once it passes this position of the current file
        self._warm_next_at = 0
        self._warmer: Warmer | None = None
        # called (no lock held) after an append: the dispatcher's wake-up (store.py); not
        # for records put with `wake=False`
        self.on_append: Callable[[], None] | None = None
        # called (no lock held) after every append, `wake=False` ones included: the
        # replication's wake-up (broker/ha/master.py), for every byte must reach a slave
        self.on_any_append: Callable[[], None] | None = None
        self._closed = False
        self._msg_id_prefix = self._store_host_raw.hex().upper()
        self.flush_service: FlushCommitLogService | GroupCommitService
        if sync:
            self.flush_service = GroupCommitService(
                self, config.sync_flush_timeout_ms, config.group_commit_max_wait_ms
            )
        else:
            self.flush_service = FlushCommitLogService(self, config, clock)
        self._sync = sync
        # reads take no lock (commitlog_reader.py)
        self.reader = CommitLogReader(self.queue)

    # --- lifecycle
    def load(self) -> None:
        self.queue.load()

    def start(self) -> None:
        self.flush_service.start()
        if self.config.warm_mapped_file and self._warm_ahead > 0 and self._warmer is None:
            self._warmer = Warmer(self.queue, self._warm_ahead, self._sync)
            self._warmer.start()
        files = self.queue.mapped_files
        if files:
            self._warm_in_place(files[-1])

    def shutdown(self) -> bool:
        """Stop flushing after a final flush; False when the data is not known on disk."""
        if self._warmer is not None:
            self._warmer.stop()
            self._warmer = None
        self.flush_service.shutdown()
        if self.flush_service.failed is not None:
            return False  # never fsync again after a failed fsync (see flush.py)
        try:
            return self.queue.flush_to(self.get_max_offset()) >= self.get_max_offset()
        except OSError as exc:
            log.error("final commitlog flush failed: %s", exc)
            return False

    def close(self) -> None:
        """Unmap every file; a put still in flight gets SERVICE_NOT_AVAILABLE, not a crash."""
        with self._lock:
            self._closed = True
        if self._warmer is not None:
            self._warmer.stop()
            self._warmer = None
        self.queue.shutdown(0)

    @property
    def store_host_raw(self) -> bytes:
        return self._store_host_raw

    @property
    def max_record(self) -> int:
        """The largest record a file holds (its size less the end blank)."""
        return self._max_record

    # --- encoding (no lock)
    def _encode(self, msg: Message) -> tuple[bytearray, str | None]:
        """The record's bytes and its topic-queue key (None: takes no queue offset)."""
        rec = encode_record(
            msg.topic,
            msg.queue_id,
            msg.body,
            msg.flag,
            msg.properties,
            msg.sys_flag,
            msg.born_timestamp,
            msg.born_host,
            self._store_host_raw,
            msg.reconsume_times,
            msg.prepared_tx_offset,
            self._max_message_size,
        )
        if len(rec) > self._max_record:
            raise EncodeError(
                PutMessageStatus.MESSAGE_ILLEGAL,
                f"record of {len(rec)} bytes cannot fit a commitlog file of {self.file_size}",
            )
        return rec, (f"{msg.topic}-{msg.queue_id}" if is_queued(msg.sys_flag) else None)

    # --- appending (under the lock)
    def _roll(self, mf: MappedFile | None) -> MappedFile:
        """Fill the rest of `mf` with a blank record; the next file (pre-allocated)."""
        if mf is not None and not mf.is_full():
            left = mf.file_size - mf.wrote_position
            self._copy(mf, mf.wrote_position, encode_blank(left))
            mf.wrote_position = mf.committed_position = mf.file_size
        new = self.queue.get_last_mapped_file(0, create=True)
        if new is None:  # pragma: no cover - create=True always returns a file
            raise OSError("no commitlog file")
        self._warm_next_at = 0  # _file_for wakes the warmer for it
        # the next file is allocated (and warmed) once this one is half written: early
        # enough to be ready, late enough not to hold two idle files per idle store
        self._prepare_next_at = self.file_size // 2
        return new

    def _copy(self, mf: MappedFile, pos: int, data: bytes | bytearray | memoryview) -> None:
        """Bytes into `mf` at `pos`: with `pwrite` under SYNC_FLUSH, where each put waits
        for an fdatasync that then writes back only the blocks written (`MappedFile.pwrite`
        says why), else into the mapping (cheaper; its write-back is off the put's path)."""
        if self._sync:
            mf.pwrite(pos, data)
        else:
            mf.mapping[pos : pos + len(data)] = data

    def _warm_in_place(self, mf: MappedFile) -> None:
        """Have the warmer pre-touch the next `warm_ahead_bytes` of the file being written
        (called under the lock when the writer has used a quarter of the window, and at
        start).

        The warmer faults the pages in without changing a byte, in the background; under
        SYNC_FLUSH it also writes the (zero) pages back, so the group commit's fdatasyncs
        carry data only, as the allocator does for the start of each next file.
        """
        warmer = self._warmer
        if warmer is None or mf.warmed or mf.is_full():
            self._warm_next_at = self.file_size + 1
            return
        self._warm_next_at = mf.wrote_position + self._warm_ahead // 4
        warmer.wake()

    def _file_for(self, n: int) -> MappedFile:
        """The file the next `n` bytes go to (rolling over when they do not fit)."""
        if self._closed:
            raise StoreNotRunning(self.queue.directory, "commitlog", "closed")
        files = self.queue.mapped_files
        mf = files[-1] if files else None
        if mf is None or mf.file_size - mf.wrote_position < n + END_FILE_MIN_BLANK_LENGTH:
            mf = self._roll(mf)
        if mf.wrote_position >= self._prepare_next_at:
            self._prepare_next_at = self.file_size + 1
            self.queue.prepare_next_file()
        if mf.wrote_position >= self._warm_next_at:
            self._warm_in_place(mf)
        return mf

    def _now(self) -> int:
        ts = self._clock()
        return ts if ts >= self.last_store_timestamp else self.last_store_timestamp

    def _place(self, rec: bytearray, key: str | None) -> tuple[int, int, int]:
        """Copy `rec` in and patch its offsets and store time; (phy, queue offset, ts)."""
        n = len(rec)
        mf = self._file_for(n)
        pos = mf.wrote_position
        phy = mf.file_from_offset + pos
        ts = self._clock()
        if ts < self.last_store_timestamp:  # store time never goes back (binary searches)
            ts = self.last_store_timestamp
        table = self.topic_queue_table
        qoff = 0 if key is None else table.get(key, 0)
        # offsets, store time, and RECORDCRC: the partial checksum encoded outside the
        # lock continued over those 24 bytes (codec.py)
        _seal(rec, 0, qoff, phy, ts)
        if self._sync:  # `_copy`, inline: the single put's hot path
            mf.pwrite(pos, rec)
        else:
            mf.mapping[pos : pos + n] = rec
        # only now is the record visible to readers (they stop at wrote_position)
        mf.wrote_position = mf.committed_position = pos + n
        if key is not None:
            table[key] = qoff + 1
        self.last_store_timestamp = ts
        return phy, qoff, ts

    def _place_batch(
        self, recs: list[tuple[bytearray, str | None]], out: list[tuple[int, int, int]]
    ) -> None:
        """Place consecutive records with one copy per file: they are laid out (offsets
        and store time patched) in one buffer, copied into the mapping at once, and made
        visible together by one move of `wrote_position`. `out` gets (phy, queue offset,
        store time) of each record placed, also when a later roll-over fails."""
        table = self.topic_queue_table
        i = 0
        count = len(recs)
        while i < count:
            mf = self._file_for(len(recs[i][0]))
            start = pos = mf.wrote_position
            room = mf.file_size - END_FILE_MIN_BLANK_LENGTH
            base = mf.file_from_offset
            ts = self._now()
            j = i
            while j < count and pos + len(recs[j][0]) <= room:
                pos += len(recs[j][0])
                j += 1
            buf = bytearray(b"".join([rec for rec, _ in recs[i:j]]))
            at = 0
            taken: dict[str, int] = {}  # next queue offsets, applied once copied
            placed = []
            for rec, key in recs[i:j]:
                qoff = 0
                if key is not None:
                    qoff = taken.get(key, -1)
                    if qoff < 0:
                        qoff = table.get(key, 0)
                    taken[key] = qoff + 1
                phy = base + start + at
                _seal(buf, at, qoff, phy, ts)
                placed.append((phy, qoff, ts))
                at += len(rec)
            self._copy(mf, start, buf)
            # only now are the records visible to readers (they stop at wrote_position)
            mf.wrote_position = mf.committed_position = pos
            table.update(taken)
            self.last_store_timestamp = ts
            out.extend(placed)
            i = j

    def append(self, msg: Message) -> PutMessageResult:
        """Write one record into the page cache (no flush wait)."""
        try:
            rec = encode_record(
                msg.topic,
                msg.queue_id,
                msg.body,
                msg.flag,
                msg.properties,
                msg.sys_flag,
                msg.born_timestamp,
                msg.born_host,
                self._store_host_raw,
                msg.reconsume_times,
                msg.prepared_tx_offset,
                self._max_message_size,
            )
        except EncodeError as exc:
            return PutMessageResult(exc.status)
        n = len(rec)
        if n > self._max_record:
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL)
        key = f"{msg.topic}-{msg.queue_id}" if is_queued(msg.sys_flag) else None
        try:
            with self._lock:
                phy, qoff, ts = self._place(rec, key)
                self.records_put += 1
                if self.count_marks is not None:
                    self.count_marks.append((self.queue.get_max_offset(), self.records_put))
        except StoreNotRunning:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE)
        except OSError:
            log.exception("cannot create a commitlog file")
            return PutMessageResult(PutMessageStatus.CREATE_MAPPED_FILE_FAILED)
        self._appended()
        return PutMessageResult(
            _PUT_OK,
            AppendMessageResult(phy, n, None, ts, qoff, 1, msg_id_prefix=self._msg_id_prefix),
        )

    def put_message(self, msg: Message) -> PutMessageResult:
        """Append one message; under SYNC_FLUSH return only once it is on disk."""
        result = self.append(msg)
        if self._sync and result.append is not None:
            end = result.append.wrote_offset + result.append.wrote_bytes
            if not self.wait_flushed(end):
                return PutMessageResult(PutMessageStatus.FLUSH_DISK_TIMEOUT, result.append)
        return result

    def _appended(self, wake: bool = True) -> None:
        if wake and self.on_append is not None:
            self.on_append()
        if self.on_any_append is not None:
            self.on_any_append()

    def put_messages(
        self, msgs: Sequence[Message], *, wait: bool = True, wake: bool = True
    ) -> list[PutMessageResult]:
        """Append a batch contiguously under one lock; one flush wait for all of it
        (none with `wait=False`: the caller waits with `when_flushed`). `wake=False`: the
        dispatcher is not woken for these records (no one waits to read them at once); the
        next put that wakes it, or its idle backstop, dispatches them.

        The records are placed with one copy per commitlog file they land in. A message
        that cannot be encoded gets its own status; the others are stored.
        """
        encoded: list[tuple[bytearray, str | None]] = []
        statuses: list[PutMessageStatus | None] = []
        for msg in msgs:
            try:
                encoded.append(self._encode(msg))
                statuses.append(None)
            except EncodeError as exc:
                statuses.append(exc.status)
        placed: list[tuple[int, int, int]] = []
        failed: PutMessageStatus | None = None
        try:
            with self._lock:
                self._place_batch(encoded, placed)
                self.records_put += len(placed)
                if self.count_marks is not None:
                    self.count_marks.append((self.queue.get_max_offset(), self.records_put))
        except StoreNotRunning:
            failed = PutMessageStatus.SERVICE_NOT_AVAILABLE
        except OSError:
            log.exception("cannot create a commitlog file")
            failed = PutMessageStatus.CREATE_MAPPED_FILE_FAILED
        if placed:
            self._appended(wake)
        results: list[PutMessageResult] = []
        end = -1
        prefix = self._msg_id_prefix
        k = 0
        for status in statuses:
            if status is not None:
                results.append(PutMessageResult(status))
                continue
            if k >= len(placed):
                results.append(PutMessageResult(failed or PutMessageStatus.UNKNOWN_ERROR))
                k += 1
                continue
            phy, qoff, ts = placed[k]
            n = len(encoded[k][0])
            k += 1
            end = phy + n
            results.append(
                PutMessageResult(
                    _PUT_OK, AppendMessageResult(phy, n, None, ts, qoff, 1, msg_id_prefix=prefix)
                )
            )
        if wait and self._sync and end > 0 and not self.wait_flushed(end):
            results = [
                PutMessageResult(PutMessageStatus.FLUSH_DISK_TIMEOUT, r.append)
                if r.status is _PUT_OK
                else r
                for r in results
            ]
        return results

    def _place_records(self, batch: RecordBatch, key: str | None) -> tuple[int, int, int, int]:
        """Place a checked batch, one `place` call per file it lands in (which writes the
        records, their offsets and store time, into the mapping); (first phy, first queue
        offset, store time, end offset). A batch reaching a file's end continues in the
        next one after the blank record, like single records do."""
        table = self.topic_queue_table
        qoff = first_qoff = 0 if key is None else table.get(key, 0)
        step = 0 if key is None else 1
        first_phy = end = -1
        first_ts = 0
        size = batch.next_size()
        while size:
            mf = self._file_for(size)  # rolled over when `size` does not fit
            pos = mf.wrote_position
            ts = self._now()
            limit = mf.file_size - END_FILE_MIN_BLANK_LENGTH
            if self._sync:  # laid out in a buffer, then copied in (`_copy`)
                buf = bytearray(min(limit - pos, batch.total))
                placed, used, qoff = batch.place(
                    buf, 0, len(buf), qoff, step, mf.file_from_offset + pos, ts
                )
                mf.pwrite(pos, memoryview(buf)[:used])
                new_pos = pos + used
            else:
                placed, new_pos, qoff = batch.place(
                    mf.mapping, pos, limit, qoff, step, mf.file_from_offset, ts
                )
            if not placed:  # pragma: no cover - _file_for left room for the next record
                raise RuntimeError(f"a record of {size} bytes did not fit at {pos}")
            # only now are the records visible to readers (they stop at wrote_position)
            mf.wrote_position = mf.committed_position = new_pos
            if key is not None:
                table[key] = qoff
            self.last_store_timestamp = ts
            if first_phy < 0:
                first_phy, first_ts = mf.file_from_offset + pos, ts
            end = mf.file_from_offset + new_pos
            size = batch.next_size()
        return first_phy, first_qoff, first_ts, end

    def put_batch(
        self, batch: RecordBatch, key: str | None, *, wait: bool = True
    ) -> PutMessageResult:
        """Append an encoded batch under one lock; under SYNC_FLUSH one flush wait for it
        (none with `wait=False`: the caller waits with `when_flushed`).

        One result: `msg_num` records from `wrote_offset` (the first record's offset) to
        `wrote_offset + wrote_bytes` (a blank record in between when it spans files).
        """
        try:
            with self._lock:
                phy, qoff, ts, end = self._place_records(batch, key)
                self.records_put += batch.count
                if self.count_marks is not None:
                    self.count_marks.append((self.queue.get_max_offset(), self.records_put))
        except StoreNotRunning:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE)
        except OSError:
            log.exception("cannot create a commitlog file")
            return PutMessageResult(PutMessageStatus.CREATE_MAPPED_FILE_FAILED)
        self._appended()
        append = AppendMessageResult(
            phy,
            end - phy,
            None,
            ts,
            qoff,
            batch.count,
            msg_id_prefix=self._msg_id_prefix,
            batch=batch,
        )
        if wait and self._sync and not self.wait_flushed(end):
            return PutMessageResult(PutMessageStatus.FLUSH_DISK_TIMEOUT, append)
        return PutMessageResult(_PUT_OK, append)

    def put_message_async(self, msg: Message) -> Future[PutMessageResult]:
        """Append now; the future completes when the flush mode acknowledges the record."""
        future: Future[PutMessageResult] = LightFuture()
        result = self.append(msg)
        if not self._sync or result.append is None:
            future.set_result(result)
            return future
        append = result.append
        end = append.wrote_offset + append.wrote_bytes

        def done(ok: bool) -> None:
            future.set_result(
                result if ok else PutMessageResult(PutMessageStatus.FLUSH_DISK_TIMEOUT, append)
            )

        service = self.flush_service
        assert isinstance(service, GroupCommitService)
        service.submit(end, done)
        return future

    def when_flushed(self, end: int, callback: Callable[[bool], None]) -> bool:
        """Under SYNC_FLUSH: `callback(True)` once flushed past `end`, `callback(False)` on
        timeout or a failed fsync, called on the group-commit thread (keep it short).
        False, and no call, when the flush mode acknowledges without waiting."""
        if not self._sync:
            return False
        service = self.flush_service
        assert isinstance(service, GroupCommitService)
        service.submit(end, callback)
        return True

    @property
    def sync_flush(self) -> bool:
        """SYNC_FLUSH: a put is acknowledged only once on disk."""
        return self._sync

    def flush_alone(self, end: int) -> bool | None:
        """Under SYNC_FLUSH, for a lone producer: fsync past `end` on this thread
        (`GroupCommitService.lead`); True once flushed, False when the fsync failed, None
        (nothing done) when others wait or the disk was slow, or under ASYNC_FLUSH."""
        service = self.flush_service
        if not isinstance(service, GroupCommitService):
            return None
        return service.lead(end)

    def wait_flushed(self, end: int) -> bool:
        service = self.flush_service
        assert isinstance(service, GroupCommitService)
        return service.wait_flushed(end, self.config.sync_flush_timeout_ms / 1000)

    # --- replication (a slave's commitlog; never called on the put path)
    def append_raw(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        """Write records replicated from a master at `offset`, byte for byte; the new end.

        `data` must start at this log's end and hold whole records of one file, each
        checked before a byte is written (framing, RECORDCRC or BODYCRC, PHYSICALOFFSET
        equal to its position), optionally ending with the blank record that closes the
        file. Raises `ReplicaRejected` otherwise, and nothing is written. The records keep
        the master's queue offsets and store times; the topic-queue table follows them and
        the dispatcher builds consume queues and the index as for any append.
        """
        view = memoryview(data)
        n = len(view)
        if n == 0:
            raise ReplicaRejected(offset, "empty")
        with self._lock:
            if self._closed:
                raise StoreNotRunning(self.queue.directory, "commitlog", "closed")
            end = self.queue.get_max_offset()
            files = self.queue.mapped_files
            if not files and offset % self.file_size == 0:
                end = offset  # an empty slave starts at the master's first file
            if offset != end:
                raise ReplicaRejected(offset, f"this log ends at {end}")
            pos = offset % self.file_size
            if pos + n > self.file_size:
                raise ReplicaRejected(offset, "crosses a file boundary")
            table_updates, last_ts, count = check_replica(view, offset, pos, self.file_size)
            mf = self.queue.get_last_mapped_file(offset, create=True)
            if mf is None or mf.file_from_offset + mf.wrote_position != offset:
                raise ReplicaRejected(offset, "no file starts there")
            self._copy(mf, pos, view)
            mf.wrote_position = mf.committed_position = pos + n
            self.topic_queue_table.update(table_updates)
            if last_ts > self.last_store_timestamp:
                self.last_store_timestamp = last_ts
            self.records_put += count
            if self.count_marks is not None:
                self.count_marks.append((self.queue.get_max_offset(), self.records_put))
        self._appended()
        return offset + n

    def keep_count_marks(self, maxlen: int) -> None:
        """Start keeping `count_marks` (at most `maxlen`), from the log as it is now."""
        with self._lock:
            self.count_marks = deque([(self.queue.get_max_offset(), self.records_put)], maxlen)

    # --- reading
    # --- reading (commitlog_reader.py)
    def get_message(self, offset: int, size: int) -> bytes | None:
        """Bytes [offset, offset+size) when they are all written, else None."""
        return self.reader.get_message(offset, size)

    def look_message(self, offset: int) -> MessageExt | None:
        """The record starting at `offset`, decoded; None when there is none or it is
        damaged (`CommitLogReader.look_message`)."""
        return self.reader.look_message(offset)

    def look_messages(self, offsets: Sequence[int]) -> list[MessageExt | None]:
        return self.reader.look_messages(offsets)

    def read_records(self, offset: int, limit: int) -> bytes:
        """Whole records from `offset`, within one file (`CommitLogReader.read_records`)."""
        return self.reader.read_records(offset, limit)

    def count_records(self, start: int, end: int, limit: int) -> tuple[int, int]:
        """(messages, where the walk stopped) between two record starts of the log."""
        return self.reader.count_records(start, end, limit)

    def get_min_offset(self) -> int:
        mf = self.queue.get_first_mapped_file()
        if mf is None:
            return -1
        return mf.file_from_offset if mf.available else self.roll_next_file(mf.file_from_offset)

    def get_max_offset(self) -> int:
        return self.queue.get_max_offset()

    def get_flushed_offset(self) -> int:
        return self.queue.flushed_where

    def roll_next_file(self, offset: int) -> int:
        return offset + self.file_size - offset % self.file_size

    @property
    def fsync_count(self) -> int:
        return self.flush_service.fsync_count

    def truncate(self, offset: int) -> None:
        """Cut the running log back to `offset`, a record's start (a slave rejoining its
        group, `MessageStore.cut_back`): appends wait meanwhile; the rest of the file
        holding `offset` is zeroed and fsynced, the files after it deleted."""
        with self._lock:
            if self._closed:
                raise StoreNotRunning(self.queue.directory, "commitlog", "closed")
            self.queue.truncate_dirty_files(offset, zero_tail=True)
            if self.count_marks is not None:
                self.count_marks.clear()

    # --- used by recovery (single-threaded, before start)
    def reset_table(self, table: dict[str, int]) -> None:
        with self._lock:
            self.topic_queue_table = table

    def remove_queue_offsets(self, topic: str) -> None:
        prefix = f"{topic}-"
        with self._lock:
            self.topic_queue_table = {
                k: v
                for k, v in self.topic_queue_table.items()
                if not (k.startswith(prefix) and k[len(prefix) :].isdigit())
            }
