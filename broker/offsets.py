"""Consumer offsets per (topic, group, queue), persisted periodically and at shutdown.

An offset is the next queue offset the group has *not* finished: everything below it is
consumed. Clients commit the smallest offset still in flight, so a crash re-delivers
(duplicates are possible) but never skips (no loss).

Persisted in `config/consumerOffset.json` (RocketMQ's layout):

    {"offsetTable": {"<topic>@<group>": {"<queueId>": <offset>, ...}, ...},
     "consumeTimeTable": {"<topic>@<group>": {"<queueId>": <epoch ms>, ...}, ...}}

`consumeTimeTable` (ours) is when the group last acknowledged, dead-lettered or committed
in each queue
(`touch`), what `reliable admin group show` prints as the last consume time.

Written by the broker's maintenance service every `flush_offset_interval_ms` (5 s) when
something changed, and at shutdown. A broker killed between two writes restarts from the
previous write: at most 5 s of progress is re-delivered.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from typing import Any

from broker.errors import InvalidArgument
from broker.store.json_config import JsonConfigFile, integer, obj

TOPIC_GROUP_SEPARATOR = "@"


class ConsumeFromWhere(enum.Enum):
    """Where a group with no committed offset starts in a queue."""

    LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"  # only messages that arrive from now on
    FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"  # everything the store still holds
    TIMESTAMP = "CONSUME_FROM_TIMESTAMP"  # messages stored at/after a time (default 30 min ago)


DEFAULT_CONSUME_TIMESTAMP_AGO_MS = 30 * 60_000


class ConsumerOffsetManager:
    """The offset table; a dirty flag tells the persister whether to write."""

    def __init__(self, file: JsonConfigFile) -> None:
        self._file = file
        self._lock = threading.Lock()
        self._table: dict[str, dict[int, int]] = {}
        self._times: dict[str, dict[int, int]] = {}
        self._dirty = False

    @staticmethod
    def key(topic: str, group: str) -> str:
        return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"

    @staticmethod
    def parse(data: dict[str, Any]) -> dict[str, dict[int, int]]:
        """The offset table of a `consumerOffset.json` document (ConfigShapeError)."""
        table: dict[str, dict[int, int]] = {}
        for key, queues in obj(data.get("offsetTable", {}), "offsetTable").items():
            where = f"offsetTable.{key}"
            table[key] = {
                integer(q, f"{where} key", minimum=0): integer(o, f"{where}.{q}", minimum=0)
                for q, o in obj(queues, where).items()
            }
        return table

    @staticmethod
    def parse_times(data: dict[str, Any]) -> dict[str, dict[int, int]]:
        """The consume-time table of a `consumerOffset.json` document (ConfigShapeError)."""
        times: dict[str, dict[int, int]] = {}
        for key, queues in obj(data.get("consumeTimeTable", {}), "consumeTimeTable").items():
            where = f"consumeTimeTable.{key}"
            times[key] = {
                integer(q, f"{where} key", minimum=0): integer(t, f"{where}.{q}", minimum=0)
                for q, t in obj(queues, where).items()
            }
        return times

    def load(self) -> None:
        both = self._file.load(lambda d: (self.parse(d), self.parse_times(d)))
        table, times = both or ({}, {})
        with self._lock:
            self._table = table
            self._times = times
            self._dirty = False

    def persist(self, force: bool = False) -> bool:
        """Write the table when it changed (or when forced); True when written."""
        with self._lock:
            if not (self._dirty or force):
                return False
            snapshot = {
                k: {str(q): o for q, o in sorted(v.items())} for k, v in sorted(self._table.items())
            }
            times = {
                k: {str(q): t for q, t in sorted(v.items())} for k, v in sorted(self._times.items())
            }
            self._dirty = False
        try:
            doc: dict[str, Any] = {"offsetTable": snapshot}
            if times:
                doc["consumeTimeTable"] = times
            self._file.save(doc)
        except BaseException:
            with self._lock:
                self._dirty = True
            raise
        return True

    def snapshot(self) -> dict[str, dict[str, int]]:
        """The whole table in `consumerOffset.json`'s shape (a slave's config sync)."""
        with self._lock:
            return {
                k: {str(q): o for q, o in sorted(v.items())} for k, v in sorted(self._table.items())
            }

    def replace(self, table: dict[str, Any]) -> None:
        """Take a master's table as it is (`snapshot()`'s shape; ConfigShapeError when it
        is not): a slave keeps its master's committed offsets."""
        parsed = self.parse({"offsetTable": table})
        with self._lock:
            if parsed != self._table:
                self._table = parsed
                self._dirty = True

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        if not isinstance(offset, int) or offset < 0:
            raise InvalidArgument(f"offset {offset!r} must be a non-negative integer")
        if not isinstance(queue_id, int) or queue_id < 0:
            raise InvalidArgument(f"queue id {queue_id!r} must be a non-negative integer")
        with self._lock:
            queues = self._table.setdefault(self.key(topic, group), {})
            if queues.get(queue_id) != offset:
                queues[queue_id] = offset
                self._dirty = True

    def commit_if_absent(
        self, group: str, topic: str, queue_id: int, compute: Callable[[], int]
    ) -> int:
        """The committed offset, or `compute()` committed atomically when there is none (two
        consumers starting a new group at once agree on where it starts)."""
        with self._lock:
            queues = self._table.setdefault(self.key(topic, group), {})
            existing = queues.get(queue_id)
            if existing is not None:
                return existing
            offset = compute()
            if not isinstance(offset, int) or offset < 0:
                raise InvalidArgument(f"computed start offset {offset!r} is not an offset")
            queues[queue_id] = offset
            self._dirty = True
            return offset

    def touch(self, group: str, topic: str, queue_id: int, now_ms: int) -> None:
        """The group acknowledged or committed in the queue at `now_ms`."""
        with self._lock:
            queues = self._times.setdefault(self.key(topic, group), {})
            if queues.get(queue_id, -1) < now_ms:
                queues[queue_id] = now_ms
                self._dirty = True

    def consume_times(self, group: str, topic: str) -> dict[int, int]:
        """Per queue, when the group last acknowledged or committed in it (epoch ms)."""
        with self._lock:
            return dict(self._times.get(self.key(topic, group), {}))

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, -1 when the group has none for that queue."""
        with self._lock:
            return self._table.get(self.key(topic, group), {}).get(queue_id, -1)

    def table_of(self, group: str, topic: str) -> dict[int, int]:
        with self._lock:
            return dict(self._table.get(self.key(topic, group), {}))

    def topics_of_group(self, group: str) -> list[str]:
        suffix = TOPIC_GROUP_SEPARATOR + group
        with self._lock:
            return sorted(k[: -len(suffix)] for k in self._table if k.endswith(suffix))

    def remove_topic(self, topic: str) -> None:
        prefix = topic + TOPIC_GROUP_SEPARATOR
        with self._lock:
            for key in [k for k in self._table if k.startswith(prefix)]:
                del self._table[key]
                self._dirty = True
            for key in [k for k in self._times if k.startswith(prefix)]:
                del self._times[key]
                self._dirty = True

    def remove_group(self, group: str) -> None:
        suffix = TOPIC_GROUP_SEPARATOR + group
        with self._lock:
            for key in [k for k in self._table if k.endswith(suffix)]:
                del self._table[key]
                self._dirty = True
            for key in [k for k in self._times if k.endswith(suffix)]:
                del self._times[key]
                self._dirty = True
