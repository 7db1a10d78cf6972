"""Topic configuration: queue counts, permission bits, message type, persistence.

Name rules (and the broker's own topic names) live in `protocol.names`.

Persisted in `config/topics.json` (atomic write, `.bak` fallback):

    {"topicConfigTable": {"<name>": {"topicName", "readQueueNums", "writeQueueNums",
                                     "perm", "messageType", "order"}},
     "dataVersion": {"counter": n}}
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any

from broker.config_table import VersionedConfigTable
from broker.errors import InvalidArgument
from broker.store.errors import ConfigShapeError
from broker.store.json_config import flag, integer, text
from protocol.limits import DEFAULT_QUEUE_NUMS

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
    read_queue_nums: int = DEFAULT_QUEUE_NUMS
    write_queue_nums: int = DEFAULT_QUEUE_NUMS
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


class TopicConfigManager(VersionedConfigTable[TopicConfig]):
    """The topic table, persisted to topics.json on every change."""

    TABLE_KEY = "topicConfigTable"

    @classmethod
    def _entry(cls, where: str, cfg: dict[str, Any]) -> TopicConfig:
        for key in ("topicName", "readQueueNums", "writeQueueNums", "perm"):
            if key not in cfg:
                raise ConfigShapeError(f"{where}: no {key}")
        text(cfg["topicName"], f"{where}.topicName")
        for key in ("readQueueNums", "writeQueueNums", "perm"):
            integer(cfg[key], f"{where}.{key}", minimum=0)
        text(cfg.get("messageType", "NORMAL"), f"{where}.messageType")
        flag(cfg.get("order", False), f"{where}.order")
        return TopicConfig.from_json(cfg)

    @staticmethod
    def _name(config: TopicConfig) -> str:
        return config.name

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
