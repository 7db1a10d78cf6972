"""Topic and group name rules, checked where names are declared (RocketMQ's rules)."""

from __future__ import annotations

import re

from reliable.errors import InvalidName

_VALID = re.compile(r"^[%|a-zA-Z0-9_-]+$")
TOPIC_MAX_LEN = 127
GROUP_MAX_LEN = 255
SYSTEM_TOPICS = frozenset({"SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC",
                           "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TBW102"})


def check_topic(name: str, *, allow_system: bool = False) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidName("topic", str(name), "must be a non-empty string")
    if len(name) > TOPIC_MAX_LEN:
        raise InvalidName("topic", name, f"longer than {TOPIC_MAX_LEN} characters")
    if not _VALID.match(name):
        raise InvalidName("topic", name, "only letters, digits, '%', '|', '_' and '-' allowed")
    if not allow_system and name in SYSTEM_TOPICS:
        raise InvalidName("topic", name, "reserved for the broker")
    return name


def check_group(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidName("group", str(name), "must be a non-empty string")
    if len(name) > GROUP_MAX_LEN:
        raise InvalidName("group", name, f"longer than {GROUP_MAX_LEN} characters")
    if not _VALID.match(name):
        raise InvalidName("group", name, "only letters, digits, '%', '|', '_' and '-' allowed")
    return name


def retry_topic(group: str) -> str:
    return f"%RETRY%{group}"


def dlq_topic(group: str) -> str:
    return f"%DLQ%{group}"
