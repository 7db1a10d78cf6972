"""The broker's metadata files in the store's `config/` directory: their names and parsers.

Each file is written by one manager (temp file, fsync, rename, `.bak` fallback, see
`broker.store.json_config`); `config_file_parsers` gives `reliable admin store verify` the
parse function of each, to check a stopped store's files without starting a broker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.offsets import ConsumerOffsetManager
from broker.pop_journal import parse_snapshot
from broker.schedule import ScheduleMessageService
from broker.subscription import SubscriptionGroupManager
from broker.topic import TopicConfigManager

__all__ = [
    "DELAY_OFFSETS_FILE",
    "GROUPS_FILE",
    "OFFSETS_FILE",
    "POP_STATE_FILE",
    "TOPICS_FILE",
    "config_file_parsers",
]

TOPICS_FILE = "topics.json"
GROUPS_FILE = "subscriptionGroup.json"
OFFSETS_FILE = "consumerOffset.json"
DELAY_OFFSETS_FILE = "delayOffset.json"
POP_STATE_FILE = "popState.json"


def config_file_parsers() -> dict[str, Callable[[dict[str, Any]], object]]:
    """Each `config/` file's name -> its loader's parse (raises ConfigShapeError on a
    document of the wrong shape): what `reliable admin store verify` checks them with."""
    return {
        TOPICS_FILE: TopicConfigManager.parse,
        GROUPS_FILE: SubscriptionGroupManager.parse,
        OFFSETS_FILE: ConsumerOffsetManager.parse,
        DELAY_OFFSETS_FILE: ScheduleMessageService.parse,
        POP_STATE_FILE: parse_snapshot,
    }
