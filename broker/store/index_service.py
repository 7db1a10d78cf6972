"""The store's hash index: every index file, written by the dispatcher, read by queries.

The dispatcher appends each record's key hashes (`index_key`) to the newest file
(`index_file.IndexFile`) and rolls to a new one when it is full; queries read the files
newest first. The index is derived data: a deleted index directory is rebuilt from the
commitlog at start.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from broker.store.codec import DispatchRequest
from broker.store.config import StoreConfig
from broker.store.durable_write import fsync_directory
from broker.store.errors import ForeignFile, StoreCorrupted
from broker.store.index_file import (
    IndexFile,
    index_file_name,
    is_index_temp,
    parse_index_file_name,
)
from broker.store.index_key import build_key, index_key_hashes
from protocol.clock import wall_ms

log = logging.getLogger(__name__)

DEFAULT_MAX_SCAN = 100_000  # entries one query may visit, whatever it finds


def _newest_entry_offset(files: Sequence[IndexFile]) -> int:
    for f in reversed(files):
        if f.entry_count > 0:
            return f.end_phy_offset
    return -1


class IndexService:
    """All index files: the dispatcher appends to the newest, queries read newest first."""

    def __init__(self, config: StoreConfig, *, clock: Callable[[], int] = wall_ms) -> None:
        self.config = config
        self.directory = config.index_dir
        self.hash_slot_num = config.max_hash_slot_num
        self.index_num = config.max_index_num
        self.max_query_results = config.max_query_results
        self._clock = clock
        self.files: list[IndexFile] = []  # replaced, never mutated: readers take a snapshot
        self._lock = threading.Lock()
        self._max_phy = -1  # get_max_phy_offset(), cached for the dispatch path
        # the load deleted the newest file (a header torn by a kill): re-index from
        # `indexed_to()` whatever recovery scanned (`_set_aside_torn`)
        self.newest_rebuilt = False

    # --- lifecycle
    def load(self, last_exit_ok: bool) -> None:
        """Open every index file; ForeignFile / StoreCorrupted for anything not ours.

        After an abnormal exit the recovery calls `truncate_dirty(commitlog end)` so no
        entry points past the commitlog, and the dispatcher re-indexes from there.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        files: list[IndexFile] = []
        self.newest_rebuilt = False
        try:
            paths = []
            for path in sorted(self.directory.iterdir(), key=lambda p: p.name):
                if is_index_temp(path.name) and path.is_file():
                    path.unlink()  # a file whose creation a crash interrupted: never used
                    continue
                if not path.is_file():
                    raise ForeignFile(path, "a directory among index files")
                parse_index_file_name(path)
                paths.append(path)
            for i, path in enumerate(paths):
                try:
                    files.append(IndexFile(path, self.hash_slot_num, self.index_num))
                except StoreCorrupted as exc:
                    if last_exit_ok or i != len(paths) - 1:
                        raise
                    self._set_aside_torn(path, exc)
        except BaseException:
            for f in files:
                f.close()
            raise
        self._max_phy = _newest_entry_offset(files)
        if not last_exit_ok and files:
            log.info(
                "abnormal exit: %d index files loaded; entries past the commitlog end "
                "are truncated by recovery",
                len(files),
            )
        self.files = files

    def _set_aside_torn(self, path: Path, exc: StoreCorrupted) -> None:
        """The newest file, after an abnormal exit, with a header that contradicts itself.

        A header is 40 bytes stored field by field through the mapping; a SIGKILL between
        two of those stores (the kernel delivers it at any instruction) leaves some fields
        new and the rest old: a first record's begin offset beside the old end offset of
        0, or an end offset the last counted entry does not carry. Only the file being
        written at the kill can hold such a header, and it is derived data: it is deleted
        and its records indexed again from the commitlog, from the end of the file before
        it (`newest_rebuilt`: the start re-dispatches from `indexed_to()`, however far back).
        """
        log.warning(
            "%s: %s; abnormal exit: the newest index file is rebuilt from the commitlog",
            path,
            exc.reason,
        )
        path.unlink()
        fsync_directory(path.parent)
        self.newest_rebuilt = True

    def flush(self) -> None:
        for f in self.files:
            f.flush()

    def shutdown(self) -> None:
        with self._lock:
            files, self.files = self.files, []
            self._max_phy = -1
        for f in files:
            f.flush()
            f.close()

    def destroy(self) -> None:
        with self._lock:
            files, self.files = self.files, []
            self._max_phy = -1
        for f in files:
            f.destroy()

    # --- writing
    def dispatch(self, request: DispatchRequest) -> None:
        """Index `request` under each of its keys (records indexed before are skipped).

        The newest indexed record itself is not skipped: a crash may have cut its keys
        short, and a duplicate entry costs nothing (queries return distinct offsets).
        """
        if not request.keys and not request.uniq_key:
            return
        if request.commitlog_offset < self._max_phy:
            return  # re-dispatched after recovery: already indexed
        hashes = index_key_hashes(request)
        if not hashes:
            return
        with self._lock:
            if request.commitlog_offset < self._max_phy:
                return
            f = self._writable_file()
            while hashes:
                done = f.put_hashes(hashes, request.commitlog_offset, request.store_timestamp)
                hashes = hashes[done:]
                if hashes:
                    f = self._roll(f)
            self._max_phy = request.commitlog_offset

    def dispatch_batch(self, requests: Sequence[DispatchRequest]) -> None:
        """`dispatch` for records in commitlog order: the file's header and slots are
        written once for all the records that fit in it; the rest go one by one."""
        todo: list[tuple[list[int], int, int]] = []
        floor = self._max_phy
        for request in requests:
            if (request.keys or request.uniq_key) and request.commitlog_offset >= floor:
                hashes = index_key_hashes(request)
                if hashes:
                    todo.append((hashes, request.commitlog_offset, request.store_timestamp))
        if not todo:
            return
        with self._lock:
            todo = [t for t in todo if t[1] >= self._max_phy]
            if not todo:
                return
            took = self._writable_file().put_records(todo)
            if took:
                self._max_phy = todo[took - 1][1]
        for request in requests:  # what did not fit: rolls files as needed
            if request.commitlog_offset > self._max_phy:
                self.dispatch(request)

    def _writable_file(self) -> IndexFile:
        files = self.files
        if files and not files[-1].is_full():
            return files[-1]
        if files:
            return self._roll(files[-1])
        return self._create(0, 0)

    def _roll(self, full: IndexFile) -> IndexFile:
        nxt = self._create(full.end_phy_offset, full.end_timestamp)
        # a full default-sized file holds ~400 MB of entries: flush it off the dispatch path
        threading.Thread(
            target=full.flush, name=f"flush-index-{full.path.name}", daemon=True
        ).start()
        return nxt

    def _create(self, end_phy: int, end_ts: int) -> IndexFile:
        self.directory.mkdir(parents=True, exist_ok=True)
        ms = self._clock()
        if self.files:  # names must sort in creation order
            ms = max(ms, parse_index_file_name(self.files[-1].path) + 1)
        path = self.directory / index_file_name(ms)
        while path.exists():
            ms += 1
            path = self.directory / index_file_name(ms)
        f = IndexFile(path, self.hash_slot_num, self.index_num, create_after=(end_phy, end_ts))
        self.files = [*self.files, f]
        return f

    # --- reading
    def iter_offsets(
        self, topic: str, key: str, begin_ms: int, end_ms: int, max_scan: int = DEFAULT_MAX_SCAN
    ) -> Iterator[int]:
        """Distinct commitlog offsets whose entry hash matches `topic#key`, newest first.

        Visits at most `max_scan` entries in total, so one query never reads unbounded data.
        """
        full_key = build_key(topic, key)
        budget = [max_scan]
        seen: set[int] = set()
        for f in reversed(self.files):
            if budget[0] <= 0:
                return
            if not f.is_time_matched(begin_ms, end_ms) or not f.hold():
                continue
            try:
                for phy in f.iter_offsets(full_key, begin_ms, end_ms, budget):
                    if phy not in seen:
                        seen.add(phy)
                        yield phy
            finally:
                f.release()

    def get_max_phy_offset(self) -> int:
        """Commitlog offset of the newest indexed record; -1 when nothing is indexed."""
        return _newest_entry_offset(self.files)

    def indexed_to(self) -> int:
        """Where re-dispatching must start for the index to be complete: the newest
        indexed record (a crash may have cut its entries short), or the start offset of
        an empty newest file (`mark_indexed_to`); -1 when there is no index file at all
        (the index directory was deleted: rebuild from the commitlog's first record)."""
        newest = _newest_entry_offset(self.files)
        if newest >= 0:
            return newest
        files = self.files
        return files[-1].begin_phy_offset if files else -1

    def mark_indexed_to(self, offset: int, store_timestamp: int) -> None:
        """Record that every record below `offset` is indexed, when no file says so yet
        (records without keys write no entry): an empty file starting at `offset`."""
        with self._lock:
            if not self.files:
                self._create(offset, store_timestamp)

    # --- recovery and cleanup
    def truncate_dirty(self, phy_offset: int) -> None:
        """Forget every entry pointing at or after `phy_offset` (the commitlog's new end)."""
        with self._lock:
            files = list(self.files)
            while files:
                last = files[-1]
                if last.entry_count > 0 and last.begin_phy_offset < phy_offset:
                    last.truncate(phy_offset)
                    break
                if last.entry_count == 0 and last.begin_phy_offset <= phy_offset:
                    break  # an empty file after the last real entry: keep it
                files.pop()
                last.destroy()
            self.files = files
            self._max_phy = _newest_entry_offset(files)

    def delete_expired_file(self, commitlog_min_offset: int) -> int:
        """Delete files (never the newest) whose every entry is below the commitlog's min."""
        with self._lock:
            files = self.files
            gone = [f for f in files[:-1] if f.end_phy_offset < commitlog_min_offset]
            if not gone:
                return 0
            self.files = [f for f in files if f not in gone]
            self._max_phy = _newest_entry_offset(self.files)
        for f in gone:
            f.destroy()
        return len(gone)
