"""Expired-file cleanup and disk watermarks.

Every `clean_resource_interval_ms` (10 s) one pass:

1. measures disk use of the store's partition (`disk_usage`, injectable);
   above `disk_refuse_watermark` (90%) the store is *full*: `is_disk_full()` is True and
   puts return DISK_FULL until a later pass sees the disk below it again;
2. deletes commitlog files last modified more than `file_reserved_time_hours` (72 h) ago,
   when it is time (the hour of day is in `delete_when`, e.g. "04"), or when disk use is
   above `disk_max_used_space_ratio` (75%), or after `request_manual_delete()`;
   above `disk_clean_watermark` (85%) files go regardless of age
   (`clean_file_forcibly_enable`), oldest first;
   at most `delete_files_batch_max` files a pass, `delete_files_interval_ms` apart, never
   the current (last) file, never a file not yet entirely dispatched (its messages would
   vanish from every consume queue), never a file a reader still holds (retried next pass,
   then forcibly after `destroy_mapped_file_interval_forcibly_ms`);
3. deletes consume-queue and index files whose every entry points below the commitlog's new
   min offset, and moves each queue's min offset up to its first message still stored.

Deletion does not look at consumption progress: a consumer group far behind loses the
messages of deleted files (its next pull reports OFFSET_TOO_SMALL and it moves on), exactly
as in RocketMQ. Size the disk and `file_reserved_time_hours` for the slowest consumer.
"""

from __future__ import annotations

import enum
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from broker.store.config import StoreConfig
from broker.store.consume_queue_store import ConsumeQueueStore
from broker.store.index_service import IndexService
from broker.store.mapped_file_queue import MappedFileQueue
from broker.store.service import ServiceThread
from protocol.clock import wall_ms

log = logging.getLogger(__name__)

DiskUsage = Callable[[Path], float]
MANUAL_DELETE_PASSES = 20  # RocketMQ: a manual request keeps deleting for 20 passes


def disk_usage_ratio(path: Path) -> float:
    """Used fraction (0..1) of the partition holding `path` (or its nearest existing parent),
    as `df` reports it: used / (used + available to us). Blocks reserved for root, or a
    thin-provisioned size larger than what can ever be written, count neither way."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    st = os.statvfs(probe)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    usable = used + st.f_bavail * st.f_frsize
    if usable <= 0:
        return 0.0
    return used / usable


def parse_delete_when(spec: str) -> frozenset[int]:
    """Hours of the day from "04" or "04;16"; ValueError for anything else."""
    hours: set[int] = set()
    for part in spec.split(";"):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or not 0 <= int(part) <= 23:
            raise ValueError(f"delete_when {spec!r}: {part!r} is not an hour 00..23")
        hours.add(int(part))
    if not hours:
        raise ValueError(f"delete_when {spec!r} names no hour")
    return frozenset(hours)


class CleanReason(enum.Enum):
    """Why a pass deleted commitlog files."""

    NONE = "none"  # not due: nothing was deleted by age
    TIME_UP = "time_up"  # the hour of day is in delete_when
    DISK_SPACE = "disk_space"  # above disk_max_used_space_ratio
    DISK_WATERMARK = "disk_watermark"  # above disk_clean_watermark: regardless of age
    MANUAL = "manual"  # request_manual_delete()


@dataclass(frozen=True, slots=True)
class CleanupReport:
    """What one pass saw and did."""

    disk_ratio: float
    disk_full: bool
    reason: CleanReason
    commitlog_deleted: int
    consume_queue_deleted: int
    index_deleted: int


class CommitLogFiles(Protocol):
    """The part of the commitlog cleanup needs."""

    queue: MappedFileQueue

    def get_min_offset(self) -> int: ...


class CleanupService(ServiceThread):
    """Deletes expired commitlog, consume-queue and index files; tracks disk fullness."""

    name = "clean-expired-files"

    def __init__(
        self,
        config: StoreConfig,
        commitlog: CommitLogFiles,
        consume_queues: ConsumeQueueStore,
        index: IndexService,
        *,
        disk_usage: DiskUsage = disk_usage_ratio,
        clock: Callable[[], int] = wall_ms,
        sleep: Callable[[float], None] = time.sleep,
        dispatched_offset: Callable[[], int] | None = None,
    ) -> None:
        """`dispatched_offset` (the reput service's `reput_from_offset`) bounds what may be
        deleted; by default the furthest record any consume queue points to."""
        super().__init__()
        if not (
            0
            < config.disk_max_used_space_ratio
            <= config.disk_clean_watermark
            <= config.disk_refuse_watermark
            <= 1
        ):
            raise ValueError("disk watermarks must satisfy 0 < max_used <= clean <= refuse <= 1")
        self.config = config
        self.commitlog = commitlog
        self.consume_queues = consume_queues
        self.index = index
        self.delete_hours = parse_delete_when(config.delete_when)
        self._disk_usage = disk_usage
        self._clock = clock
        self._sleep = sleep
        self._dispatched_offset = dispatched_offset
        self._disk_full: bool | None = None
        self._manual_passes = 0
        self._last_min_offset = -1
        self.last_report: CleanupReport | None = None

    # --- disk
    def measure_disk(self) -> float:
        """Highest use of the partitions holding the commitlog and the consume queues."""
        paths = {self.config.commitlog_dir, self.config.consume_queue_dir}
        return max(self._disk_usage(p) for p in paths)

    def check_disk(self) -> float:
        """Measure now and update `is_disk_full()`; returns the used ratio."""
        ratio = self.measure_disk()
        full = ratio > self.config.disk_refuse_watermark
        if full != self._disk_full:
            if full:
                log.error(
                    "disk %.1f%% used, above %.0f%%: refusing writes",
                    ratio * 100,
                    self.config.disk_refuse_watermark * 100,
                )
            elif self._disk_full:
                log.warning("disk %.1f%% used: accepting writes again", ratio * 100)
        self._disk_full = full
        return ratio

    def is_disk_full(self) -> bool:
        """True while disk use is above the refuse watermark (puts return DISK_FULL)."""
        if self._disk_full is None:
            self.check_disk()
        return bool(self._disk_full)

    def request_manual_delete(self) -> None:
        """Delete expired files on the next passes even outside `delete_when`."""
        self._manual_passes = MANUAL_DELETE_PASSES

    # --- one pass
    def _reason(self, ratio: float, now_ms: int) -> CleanReason:
        cfg = self.config
        if ratio > cfg.disk_clean_watermark:
            return CleanReason.DISK_WATERMARK
        if time.localtime(now_ms / 1000).tm_hour in self.delete_hours:
            return CleanReason.TIME_UP
        if ratio > cfg.disk_max_used_space_ratio:
            return CleanReason.DISK_SPACE
        if self._manual_passes > 0:
            return CleanReason.MANUAL
        return CleanReason.NONE

    def run_once(self) -> CleanupReport:
        """One cleanup pass (the thread runs this every `clean_resource_interval_ms`)."""
        cfg = self.config
        now = self._clock()
        ratio = self.check_disk()
        reason = self._reason(ratio, now)
        deleted = 0
        if reason is not CleanReason.NONE:
            if self._manual_passes > 0:
                self._manual_passes -= 1
            force = reason is CleanReason.DISK_WATERMARK and cfg.clean_file_forcibly_enable
            batch = min(cfg.delete_files_batch_max, self._dispatched_files())
            if batch > 0:
                deleted = self.commitlog.queue.delete_expired_file_by_time(
                    int(cfg.file_reserved_time_hours * 3_600_000),
                    cfg.delete_files_interval_ms,
                    cfg.destroy_mapped_file_interval_forcibly_ms,
                    force,
                    batch,
                    now,
                    sleep=self._sleep,
                )
            if deleted:
                log.info(
                    "deleted %d commitlog files (%s, disk %.1f%%)",
                    deleted,
                    reason.value,
                    ratio * 100,
                )
            elif force:
                log.warning("disk %.1f%% used and no commitlog file could be deleted", ratio * 100)
        cq_deleted, index_deleted = self.clean_logic_files()
        report = CleanupReport(
            ratio, bool(self._disk_full), reason, deleted, cq_deleted, index_deleted
        )
        self.last_report = report
        return report

    def _dispatched_files(self) -> int:
        """How many of the oldest commitlog files are entirely dispatched.

        Deleting a file whose records never reached a consume queue would lose them for
        every consumer without a trace, so even a full disk only frees dispatched files.
        """
        if self._dispatched_offset is not None:
            done = self._dispatched_offset()
        else:
            done = self.consume_queues.get_max_physic_offset()
        count = 0
        for mf in self.commitlog.queue.mapped_files:
            if mf.file_from_offset + mf.file_size > done:
                break
            count += 1
        return count

    def clean_logic_files(self) -> tuple[int, int]:
        """Drop consume-queue and index files that only point below the commitlog's min."""
        min_offset = self.commitlog.get_min_offset()
        if min_offset <= self._last_min_offset or min_offset < 0:
            return 0, 0
        cq_deleted = self.consume_queues.delete_expired_files(min_offset)
        index_deleted = self.index.delete_expired_file(min_offset)
        self._last_min_offset = min_offset
        if cq_deleted or index_deleted:
            log.info(
                "deleted %d consume queue and %d index files below commitlog offset %d",
                cq_deleted,
                index_deleted,
                min_offset,
            )
        return cq_deleted, index_deleted

    # --- thread
    def run(self) -> None:
        interval_s = self.config.clean_resource_interval_ms / 1000
        while not self.stopped:
            self.wait_for_running(interval_s)
            if self.stopped:
                break
            try:
                self.run_once()
            except Exception:
                log.exception("cleanup pass failed")
