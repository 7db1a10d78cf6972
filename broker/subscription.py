"""Subscription groups: retry settings, broadcast and FIFO flags, persisted.

Persisted in `config/subscriptionGroup.json`:

    {"subscriptionGroupTable": {"<group>": {"groupName", "consumeEnable",
        "consumeBroadcastEnable", "retryQueueNums", "retryMaxTimes", "consumeMessageOrderly"}},
     "dataVersion": {"counter": n}}

`retry_max_times` is the number of retries after the first delivery: a message is delivered
at most `retry_max_times + 1` times before it goes to `%DLQ%<group>`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from broker.errors import InvalidArgument
from broker.limits import DEFAULT_RETRY_MAX_TIMES
from broker.store.errors import ConfigShapeError
from broker.store.json_config import JsonConfigFile, flag, integer, obj, text

MAX_RETRY_TIMES = 1000


@dataclass(frozen=True, slots=True)
class SubscriptionGroupConfig:
    group: str
    consume_enable: bool = True
    consume_broadcast: bool = True  # broadcasting consumption allowed for this group
    retry_queue_nums: int = 1
    retry_max_times: int = DEFAULT_RETRY_MAX_TIMES
    fifo: bool = False  # consume orderly (FIFO)

    def __post_init__(self) -> None:
        if not isinstance(self.retry_queue_nums, int) or not 1 <= self.retry_queue_nums <= 64:
            raise InvalidArgument(
                f"group {self.group!r}: retry_queue_nums {self.retry_queue_nums!r} must be 1..64"
            )
        if not isinstance(self.retry_max_times, int) or not (
            0 <= self.retry_max_times <= MAX_RETRY_TIMES
        ):
            raise InvalidArgument(
                f"group {self.group!r}: retry_max_times {self.retry_max_times!r} must be "
                f"0..{MAX_RETRY_TIMES}"
            )

    @property
    def max_delivery_attempts(self) -> int:
        """First delivery plus every retry (RocketMQ 5: retryMaxTimes + 1)."""
        return self.retry_max_times + 1

    def to_json(self) -> dict[str, Any]:
        return {
            "groupName": self.group,
            "consumeEnable": self.consume_enable,
            "consumeBroadcastEnable": self.consume_broadcast,
            "retryQueueNums": self.retry_queue_nums,
            "retryMaxTimes": self.retry_max_times,
            "consumeMessageOrderly": self.fifo,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SubscriptionGroupConfig:
        return cls(
            group=str(data["groupName"]),
            consume_enable=bool(data.get("consumeEnable", True)),
            consume_broadcast=bool(data.get("consumeBroadcastEnable", True)),
            retry_queue_nums=int(data.get("retryQueueNums", 1)),
            retry_max_times=int(data.get("retryMaxTimes", DEFAULT_RETRY_MAX_TIMES)),
            fifo=bool(data.get("consumeMessageOrderly", False)),
        )


class SubscriptionGroupManager:
    """The group table, persisted to subscriptionGroup.json on every change."""

    def __init__(self, file: JsonConfigFile) -> None:
        self._file = file
        self._lock = threading.RLock()
        self._table: dict[str, SubscriptionGroupConfig] = {}
        self._version = 0

    @staticmethod
    def parse(data: dict[str, Any]) -> tuple[dict[str, SubscriptionGroupConfig], int]:
        """(table, version) of a `subscriptionGroup.json` document (ConfigShapeError)."""
        table: dict[str, SubscriptionGroupConfig] = {}
        groups = obj(data.get("subscriptionGroupTable", {}), "subscriptionGroupTable")
        for group, cfg in groups.items():
            where = f"subscriptionGroupTable.{group}"
            cfg = obj(cfg, where)
            if "groupName" not in cfg:
                raise ConfigShapeError(f"{where}: no groupName")
            text(cfg["groupName"], f"{where}.groupName")
            for key in ("retryQueueNums", "retryMaxTimes"):
                if key in cfg:
                    integer(cfg[key], f"{where}.{key}", minimum=-1)
            for key in ("consumeEnable", "consumeBroadcastEnable", "consumeMessageOrderly"):
                if key in cfg:
                    flag(cfg[key], f"{where}.{key}")
            table[group] = SubscriptionGroupConfig.from_json(cfg)
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
                "subscriptionGroupTable": {g: c.to_json() for g, c in sorted(self._table.items())},
                "dataVersion": {"counter": self._version},
            }
        )

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        return self._table.get(group)

    def all(self) -> list[SubscriptionGroupConfig]:
        with self._lock:
            return sorted(self._table.values(), key=lambda c: c.group)

    def put(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        with self._lock:
            if self._table.get(config.group) != config:
                self._table[config.group] = config
                self._persist()
            return config

    def get_or_create(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        with self._lock:
            existing = self._table.get(config.group)
            if existing is not None:
                return existing
            self._table[config.group] = config
            self._persist()
            return config

    def delete(self, group: str) -> bool:
        with self._lock:
            if self._table.pop(group, None) is None:
                return False
            self._persist()
            return True
