"""Subscription groups: retry settings, broadcast and FIFO flags, persisted.

Persisted in `config/subscriptionGroup.json`:

    {"subscriptionGroupTable": {"<group>": {"groupName", "consumeEnable",
        "consumeBroadcastEnable", "retryQueueNums", "retryMaxTimes", "consumeMessageOrderly"}},
     "dataVersion": {"counter": n}}

`retry_max_times` is the number of retries after the first delivery: a message is delivered
at most `retry_max_times + 1` times before it goes to `%DLQ%<group>`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.config_table import VersionedConfigTable
from broker.errors import InvalidArgument
from broker.store.errors import ConfigShapeError
from broker.store.json_config import flag, integer, text
from protocol.limits import DEFAULT_RETRY_MAX_TIMES

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


class SubscriptionGroupManager(VersionedConfigTable[SubscriptionGroupConfig]):
    """The group table, persisted to subscriptionGroup.json on every change."""

    TABLE_KEY = "subscriptionGroupTable"

    @classmethod
    def _entry(cls, where: str, cfg: dict[str, Any]) -> SubscriptionGroupConfig:
        if "groupName" not in cfg:
            raise ConfigShapeError(f"{where}: no groupName")
        text(cfg["groupName"], f"{where}.groupName")
        for key in ("retryQueueNums", "retryMaxTimes"):
            if key in cfg:
                integer(cfg[key], f"{where}.{key}", minimum=-1)
        for key in ("consumeEnable", "consumeBroadcastEnable", "consumeMessageOrderly"):
            if key in cfg:
                flag(cfg[key], f"{where}.{key}")
        return SubscriptionGroupConfig.from_json(cfg)

    @staticmethod
    def _name(config: SubscriptionGroupConfig) -> str:
        return config.group
