"""Store configuration: every size, interval and watermark in one frozen value.

Defaults follow RocketMQ's broker defaults; tests shrink the file sizes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict


class FlushMode(enum.Enum):
    """When a put is acknowledged relative to the disk."""

    ASYNC_FLUSH = "async"  # ack after the page cache; background flush
    SYNC_FLUSH = "sync"  # ack after fsync (group commit)


# Disk watermarks switched off (a ratio never exceeds 1.0): for throwaway stores, such as a test
# kit's, that live on a shared disk whose fill level is not theirs to answer for. Never for a
# store that keeps data: above the watermarks cleanup and DISK_FULL are what protect the disk.
class Watermarks(TypedDict):
    """The three disk watermarks, as StoreConfig keywords."""

    disk_max_used_space_ratio: float
    disk_clean_watermark: float
    disk_refuse_watermark: float


WATERMARKS_OFF: Watermarks = {
    "disk_max_used_space_ratio": 1.0,
    "disk_clean_watermark": 1.0,
    "disk_refuse_watermark": 1.0,
}


def default_store_dir() -> Path:
    return Path.home() / ".reliable" / "store"


@dataclass(frozen=True)
class StoreConfig:
    """Everything the store needs to know; one value shared by all its parts."""

    store_dir: Path = field(default_factory=default_store_dir)

    # --- commitlog
    mapped_file_size_commitlog: int = 1024 * 1024 * 1024  # 1 GiB
    max_message_size: int = 4 * 1024 * 1024  # body + properties + topic
    flush_mode: FlushMode = FlushMode.ASYNC_FLUSH
    # async flush: every 500 ms, at least 4 pages, thoroughly every 10 s
    flush_interval_commitlog_ms: int = 500
    flush_least_pages_commitlog: int = 4
    flush_thorough_interval_commitlog_ms: int = 10_000
    # sync flush: a put waits at most this long for its fsync
    sync_flush_timeout_ms: int = 5_000
    # sync flush: how long a round may wait for as many producers as the previous round
    # acknowledged (0: never wait); see flush.py
    group_commit_max_wait_ms: float = 1.0
    # pre-allocate and pre-touch the next mapped file in the background
    warm_mapped_file: bool = True

    # --- consume queue: 20-byte units
    mapped_file_size_consume_queue: int = 300_000 * 20
    flush_interval_consume_queue_ms: int = 1_000

    # --- index
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 20_000_000
    max_query_results: int = 64

    # --- dispatch
    dispatch_interval_ms: int = 1

    # --- cleanup
    file_reserved_time_hours: float = 72.0
    delete_when: str = "04"  # hours of the day, ';'-separated, e.g. "04;16"
    clean_resource_interval_ms: int = 10_000
    disk_max_used_space_ratio: float = 0.75  # cleanup may start above this ratio
    disk_clean_watermark: float = 0.85  # clean immediately above this
    disk_refuse_watermark: float = 0.90  # refuse writes above this
    clean_file_forcibly_enable: bool = True
    delete_files_batch_max: int = 10
    delete_files_interval_ms: int = 100
    destroy_mapped_file_interval_forcibly_ms: int = 120_000

    # --- checkpoint / metadata
    flush_config_interval_ms: int = 5_000
    store_host: tuple[str, int] = ("127.0.0.1", 10911)

    # --- derived locations
    @property
    def commitlog_dir(self) -> Path:
        return self.store_dir / "commitlog"

    @property
    def consume_queue_dir(self) -> Path:
        return self.store_dir / "consumequeue"

    @property
    def index_dir(self) -> Path:
        return self.store_dir / "index"

    @property
    def config_dir(self) -> Path:
        return self.store_dir / "config"

    @property
    def checkpoint_path(self) -> Path:
        return self.store_dir / "checkpoint"

    @property
    def abort_path(self) -> Path:
        return self.store_dir / "abort"


# the watermarks a store ships with (tests that inject a disk level start from these)
SHIPPED_WATERMARKS: Watermarks = {
    "disk_max_used_space_ratio": StoreConfig.disk_max_used_space_ratio,
    "disk_clean_watermark": StoreConfig.disk_clean_watermark,
    "disk_refuse_watermark": StoreConfig.disk_refuse_watermark,
}
