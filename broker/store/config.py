"""Store configuration: every size, interval and watermark in one frozen value.

Defaults follow RocketMQ's broker defaults; tests shrink the file sizes.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from broker.store.errors import ForeignFile
from protocol.limits import DEFAULT_MAX_BODY_SIZE

log = logging.getLogger(__name__)


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


# --- message size: one limit on the body (`protocol.limits.DEFAULT_MAX_BODY_SIZE`); the record
# around it gets room for the rest
# a record holds the body plus its topic (TOPICLEN is one byte) and properties (PROPERTIESLEN
# is an i16): a body at the limit with any legal topic and properties must still fit
RECORD_ENVELOPE = 255 + 32767
# the fixed part of a record (codec.FIXED_SIZE) and the blank record closing a file
_RECORD_FIXED = 91
_FILE_END_BLANK = 8


def max_message_size_for(max_body_size: int) -> int:
    """The store's `max_message_size` (body + topic + properties) for a body limit."""
    return max_body_size + RECORD_ENVELOPE


def smallest_commitlog_file_for(max_message_size: int) -> int:
    """The smallest commitlog file that holds the largest record `max_message_size` allows."""
    return max_message_size + _RECORD_FIXED + _FILE_END_BLANK


@dataclass(frozen=True)
class StoreConfig:
    """Everything the store needs to know; one value shared by all its parts."""

    store_dir: Path = field(default_factory=default_store_dir)

    # --- commitlog
    mapped_file_size_commitlog: int = 1024 * 1024 * 1024  # 1 GiB
    # body + properties + topic: room for a body of DEFAULT_MAX_BODY_SIZE with any legal
    # topic and properties (the body limit itself is the broker's and the server's)
    max_message_size: int = DEFAULT_MAX_BODY_SIZE + RECORD_ENVELOPE
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
    # pre-allocate the next mapped file and pre-touch pages in the background
    warm_mapped_file: bool = True
    # how far ahead of the write position pages are pre-touched (the allocator warms this
    # much of each next file; the writer's warm-ahead advances it as writes go on): a
    # fresh or idle store dirties this much page cache, not whole files
    warm_ahead_bytes: int = 64 * 1024 * 1024

    # --- consume queue: 20-byte units
    mapped_file_size_consume_queue: int = 300_000 * 20
    flush_interval_consume_queue_ms: int = 1_000

    # --- index
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 20_000_000
    max_query_results: int = 64

    # --- dispatch: every put wakes an idle dispatcher; busy, it waits this long after
    # each round so the records put meanwhile are dispatched by one round
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


# --- geometry: the sizes that shape a store's files, fixed when the store is created
GEOMETRY_FILE = "geometry.json"
GEOMETRY_FIELDS = (
    "mapped_file_size_commitlog",
    "mapped_file_size_consume_queue",
    "max_hash_slot_num",
    "max_index_num",
)

# development stores (the embedded transport's default): 64 MiB commitlog files and a small
# index, ~100 MB on disk at first instead of ~1.5 GB. Production stores (`reliable broker
# start`, or the embedded transport given PRODUCTION_GEOMETRY) keep RocketMQ's sizes.
DEVELOPMENT_GEOMETRY: dict[str, int] = {
    "mapped_file_size_commitlog": 64 * 1024 * 1024,
    "mapped_file_size_consume_queue": 300_000 * 20,
    "max_hash_slot_num": 500_000,
    "max_index_num": 2_000_000,
}
PRODUCTION_GEOMETRY: dict[str, int] = {name: getattr(StoreConfig, name) for name in GEOMETRY_FIELDS}

_INDEX_HEADER, _HASH_SLOT, _INDEX_ENTRY = 40, 4, 20


def geometry_of(config: StoreConfig) -> dict[str, int]:
    return {name: int(getattr(config, name)) for name in GEOMETRY_FIELDS}


def read_geometry(store_dir: Path) -> dict[str, int] | None:
    """The geometry a store was created with: its geometry file, else inferred from its
    files (stores created before the file existed); None for a new or empty store."""
    path = Path(store_dir) / GEOMETRY_FILE
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return _infer_geometry(Path(store_dir))
    except (OSError, ValueError) as exc:
        raise ForeignFile(path, f"unreadable store geometry: {exc}") from exc
    if not isinstance(raw, dict) or not all(
        isinstance(raw.get(n), int) and raw[n] > 0 for n in GEOMETRY_FIELDS
    ):
        raise ForeignFile(path, f"expected positive integers {', '.join(GEOMETRY_FIELDS)}")
    return {n: raw[n] for n in GEOMETRY_FIELDS}


def _first_file_size(directory: Path) -> int | None:
    try:
        for path in sorted(directory.iterdir()):
            if path.is_file() and path.name.isdigit():
                return path.stat().st_size
    except FileNotFoundError:
        pass
    return None


def _infer_geometry(store_dir: Path) -> dict[str, int] | None:
    found: dict[str, int] = {}
    commitlog = _first_file_size(store_dir / "commitlog")
    if commitlog:
        found["mapped_file_size_commitlog"] = commitlog
    try:
        queue_dirs = sorted(
            q
            for t in (store_dir / "consumequeue").iterdir()
            if t.is_dir()
            for q in t.iterdir()
            if q.is_dir()
        )
    except FileNotFoundError:
        queue_dirs = []
    for queue_dir in queue_dirs:
        size = _first_file_size(queue_dir)
        if size:
            found["mapped_file_size_consume_queue"] = size
            break
    index = _first_file_size(store_dir / "index")
    # every geometry this project ever wrote keeps entries = 4 x slots (RocketMQ's ratio)
    per_slot = _HASH_SLOT + 4 * _INDEX_ENTRY
    if index and index > _INDEX_HEADER and (index - _INDEX_HEADER) % per_slot == 0:
        slots = (index - _INDEX_HEADER) // per_slot
        found.update(max_hash_slot_num=slots, max_index_num=4 * slots)
    return found or None


def with_store_geometry(config: StoreConfig) -> StoreConfig:
    """`config` with the geometry of the store it names, when that store exists.

    A store's file sizes are fixed at creation; whoever opens it later (`reliable broker
    start`, `admin --store`, the embedded transport) takes them from the store, whatever
    its own defaults. A size the store holds overrides the configured one (logged)."""
    stored = read_geometry(config.store_dir)
    if not stored:
        return config
    changed: dict[str, object] = {n: v for n, v in stored.items() if getattr(config, n) != v}
    if not changed:
        return config
    log.info(
        "store %s: using its own geometry %s",
        config.store_dir,
        ", ".join(f"{n}={v}" for n, v in changed.items()),
    )
    return dataclasses.replace(config, **changed)  # type: ignore[arg-type]


def write_geometry(config: StoreConfig) -> bool:
    """Record the store's geometry when it has none yet; True when written."""
    path = config.store_dir / GEOMETRY_FILE
    if path.exists():
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(geometry_of(config), indent=1) + "\n")
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return True


def initial_footprint(config: StoreConfig) -> int:
    """Bytes a new store's first files take (commitlog, one index file; sparse at first)."""
    index = (
        _INDEX_HEADER + config.max_hash_slot_num * _HASH_SLOT + config.max_index_num * _INDEX_ENTRY
    )
    return config.mapped_file_size_commitlog + index


def is_new_store(store_dir: Path) -> bool:
    return read_geometry(store_dir) is None


def describe(config: StoreConfig) -> str:
    mib = 1024 * 1024
    return (
        f"{config.store_dir} (commitlog files of {config.mapped_file_size_commitlog // mib}"
        f" MiB; its first files take up to {initial_footprint(config) // mib} MiB)"
    )


GEOMETRIES = {"development": DEVELOPMENT_GEOMETRY, "production": PRODUCTION_GEOMETRY}


def embedded_store_config(
    store_dir: Path | str | None, geometry: str = "development", **options: object
) -> StoreConfig:
    """The StoreConfig of an in-process store from keywords (the embedded transport's).

    A new store takes the named `geometry` ("development": small files; "production":
    RocketMQ's 1 GiB commitlog files) unless sizes are given; an existing store keeps its
    own. Creating a store says where and how big: at WARNING when no directory was given
    (the default lands in the home directory), at INFO otherwise."""
    if geometry not in GEOMETRIES:
        raise ValueError(f"geometry must be one of {', '.join(GEOMETRIES)}, not {geometry!r}")
    implicit = store_dir is None
    directory = default_store_dir() if store_dir is None else Path(store_dir)
    sizes = {k: v for k, v in GEOMETRIES[geometry].items() if k not in options}
    config = StoreConfig(store_dir=directory, **sizes, **options)  # type: ignore[arg-type]
    if is_new_store(directory):
        log.log(
            logging.WARNING if implicit else logging.INFO,
            'new %s store at %s; give store_dir= (and geometry="production" for '
            "1 GiB commitlog files) to choose",
            geometry,
            describe(config),
        )
    return config
