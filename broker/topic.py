"""Topic configuration: queue counts, permission bits, message type, persistence.

Name rules (and the broker's own topic names) live in `broker.names`.

Persisted in `config/topics.json` (atomic write, `.bak` fallback):

    {"topicConfigTable": {"<name>": {"topicName", "readQueueNums", "writeQueueNums",
                                     "perm", "messageType", "order"}},
     "dataVersion": {"counter": n}}
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, replace
from typing import Any

from broker.errors import InvalidArgument
from broker.store.errors import ConfigShapeError
from broker.store.json_config import JsonConfigFile, flag, integer, obj, text

# --- permission bits (RocketMQ PermName)
PERM_PRIORITY = 0x8
PERM_READ = 0x4
PERM_WRITE = 0x2
PERM_INHERIT = 0x1
PERM_READ_WRITE = PERM_READ | PERM_WRITE
_PERM_ALL = PERM_PRIORITY | PERM_READ | PERM_WRITE | PERM_INHERIT


def is_readable(perm: int) -> bool:
    return perm & PERM_READ == PERM_READ


def is_writeable(perm: int) -> bool:
    return perm & PERM_WRITE == PERM_WRITE


def perm_to_string(perm: int) -> str:
    return (
        ("R" if is_readable(perm) else "-")
        + ("W" if is_writeable(perm) else "-")
        + ("X" if perm & PERM_INHERIT else "-")
    )


class TopicMessageType(enum.Enum):
    """What a topic accepts (RocketMQ 5 `message.type` attribute)."""

    NORMAL = "NORMAL"
    FIFO = "FIFO"
    DELAY = "DELAY"
    TRANSACTION = "TRANSACTION"
    MIXED = "MIXED"  # anything

    @classmethod
    def parse(cls, value: str | TopicMessageType) -> TopicMessageType:
        if isinstance(value, TopicMessageType):
            return value
        try:
            return cls(str(value).upper())
        except ValueError:
            raise InvalidArgument(
                f"message type {value!r}: expected one of {', '.join(t.value for t in cls)}"
            ) from None

    def accepts(self, message_type: TopicMessageType) -> bool:
        return self is TopicMessageType.MIXED or self is message_type


MAX_QUEUE_NUMS = 1024


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """One topic: how many queues readers and writers see, who may do what, what it holds."""

    name: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = PERM_READ_WRITE
    message_type: TopicMessageType = TopicMessageType.NORMAL
    order: bool = False

    def __post_init__(self) -> None:
        for label, n in (("read", self.read_queue_nums), ("write", self.write_queue_nums)):
            if not isinstance(n, int) or not 1 <= n <= MAX_QUEUE_NUMS:
                raise InvalidArgument(
                    f"topic {self.name!r}: {label} queue count {n!r} must be 1..{MAX_QUEUE_NUMS}"
                )
        if not isinstance(self.perm, int) or self.perm & ~_PERM_ALL:
            raise InvalidArgument(
                f"topic {self.name!r}: perm {self.perm!r} is not a combination of "
                f"8 (priority), 4 (read), 2 (write), 1 (inherit)"
            )

    @property
    def readable(self) -> bool:
        return is_readable(self.perm)

    @property
    def writeable(self) -> bool:
        return is_writeable(self.perm)

    def to_json(self) -> dict[str, Any]:
        return {
            "topicName": self.name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "messageType": self.message_type.value,
            "order": self.order,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TopicConfig:
        return cls(
            name=str(data["topicName"]),
            read_queue_nums=int(data["readQueueNums"]),
            write_queue_nums=int(data["writeQueueNums"]),
            perm=int(data["perm"]),
            message_type=TopicMessageType.parse(data.get("messageType", "NORMAL")),
            order=bool(data.get("order", False)),
        )


class TopicConfigManager:
    """The topic table, persisted to topics.json on every change."""

    def __init__(self, file: JsonConfigFile) -> None:
        self._file = file
        self._lock = threading.RLock()
        self._table: dict[str, TopicConfig] = {}
        self._version = 0

    @staticmethod
    def parse(data: dict[str, Any]) -> tuple[dict[str, TopicConfig], int]:
        """(table, version) of a `topics.json` document (ConfigShapeError)."""
        table: dict[str, TopicConfig] = {}
        for name, cfg in obj(data.get("topicConfigTable", {}), "topicConfigTable").items():
            where = f"topicConfigTable.{name}"
            cfg = obj(cfg, where)
            for key in ("topicName", "readQueueNums", "writeQueueNums", "perm"):
                if key not in cfg:
                    raise ConfigShapeError(f"{where}: no {key}")
            text(cfg["topicName"], f"{where}.topicName")
            for key in ("readQueueNums", "writeQueueNums", "perm"):
                integer(cfg[key], f"{where}.{key}", minimum=0)
            text(cfg.get("messageType", "NORMAL"), f"{where}.messageType")
            flag(cfg.get("order", False), f"{where}.order")
            table[name] = TopicConfig.from_json(cfg)
        version = obj(data.get("dataVersion", {}), "dataVersion").get("counter", 0)
        return table, integer(version, "dataVersion.counter")

    def load(self) -> None:
        table, version = self._file.load(self.parse) or ({}, 0)
        with self._lock:
            self._table = table
            self._version = version

    def _persist(self) -> None:
        self._version += 1
        self._file.save(
            {
                "topicConfigTable": {n: c.to_json() for n, c in sorted(self._table.items())},
                "dataVersion": {"counter": self._version},
            }
        )

    def get(self, name: str) -> TopicConfig | None:
        return self._table.get(name)

    def all(self) -> list[TopicConfig]:
        with self._lock:
            return sorted(self._table.values(), key=lambda c: c.name)

    def put(self, config: TopicConfig) -> TopicConfig:
        """Create or update (RocketMQ's updateTopic is an upsert)."""
        with self._lock:
            if self._table.get(config.name) != config:
                self._table[config.name] = config
                self._persist()
            return config

    def get_or_create(self, config: TopicConfig) -> TopicConfig:
        """The existing config, or `config` stored as new (never overwrites)."""
        with self._lock:
            existing = self._table.get(config.name)
            if existing is not None:
                return existing
            self._table[config.name] = config
            self._persist()
            return config

    def widen_queues(self, name: str, queue_nums: int) -> TopicConfig:
        """Grow a topic's queue counts to at least `queue_nums` (retry topic settings)."""
        with self._lock:
            cfg = self._table[name]
            if cfg.read_queue_nums >= queue_nums and cfg.write_queue_nums >= queue_nums:
                return cfg
            new = replace(
                cfg,
                read_queue_nums=max(cfg.read_queue_nums, queue_nums),
                write_queue_nums=max(cfg.write_queue_nums, queue_nums),
            )
            self._table[name] = new
            self._persist()
            return new

    def delete(self, name: str) -> bool:
        with self._lock:
            if self._table.pop(name, None) is None:
                return False
            self._persist()
            return True
