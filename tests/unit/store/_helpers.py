"""Small builders shared by the store-core tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.store.config import WATERMARKS_OFF, FlushMode, StoreConfig
from broker.store.message import Message
from protocol.props import Prop


def small_config(tmp: Path, **overrides: Any) -> StoreConfig:
    """A store with tiny files so roll-over happens every few messages."""
    values: dict[str, Any] = dict(
        store_dir=tmp,
        mapped_file_size_commitlog=8 * 1024,
        mapped_file_size_consume_queue=20 * 64,
        max_hash_slot_num=64,
        max_index_num=256,
        flush_mode=FlushMode.ASYNC_FLUSH,
        warm_mapped_file=False,
        sync_flush_timeout_ms=5_000,
        flush_interval_commitlog_ms=10,
        flush_interval_consume_queue_ms=50,
        flush_config_interval_ms=50,
        **WATERMARKS_OFF,  # the host's disk is shared; tests that need a level inject one
    )
    values.update(overrides)
    return StoreConfig(**values)


def message(
    i: int, topic: str = "TopicA", queue_id: int = 0, size: int = 50, **props: str
) -> Message:
    body = (f"body-{i}-".encode() * (size // 8 + 1))[:size]
    properties = {
        Prop.KEYS: f"key-{i} shared",
        Prop.UNIQ_KEY: f"UNIQ{i:08d}",
        Prop.TAGS: f"tag{i % 3}",
        **props,
    }
    return Message(
        topic=topic,
        body=body,
        queue_id=queue_id,
        properties=properties,
        born_timestamp=1_700_000_000_000 + i,
        born_host=("10.0.0.1", 4000 + i),
    )


def wait_until(cond: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Poll `cond` until true or the deadline passes (for real background threads)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.002)
    return cond()


class ManualClock:
    """Injected milliseconds clock."""

    def __init__(self, start: int = 1_800_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def crash_copy(src: Path, dst: Path) -> Path:
    """The store directory as a killed process leaves it: every file as the page cache has
    it (mapped writes included), the abort file still present, no final flush/checkpoint."""
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("lock", "*.tmp"))
    return dst


def commitlog_files(store_dir: Path) -> list[Path]:
    return sorted((store_dir / "commitlog").iterdir())


def write_at(store_dir: Path, offset: int, data: bytes, file_size: int) -> None:
    """Overwrite commitlog bytes at a global offset, through the file (not the store)."""
    path = store_dir / "commitlog" / f"{offset - offset % file_size:020d}"
    with open(path, "r+b") as f:
        f.seek(offset % file_size)
        f.write(data)
