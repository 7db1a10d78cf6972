"""Topic and group names: the one place their rules and the broker's own names are defined.

Rules follow RocketMQ's `TopicValidator`: a name is 1-127 characters of `[%|a-zA-Z0-9_-]`
(a group at most 120, so that its `%RETRY%` and `%DLQ%` topics fit the 127 limit); the
broker's own topics (`SCHEDULE_TOPIC_XXXX`, the transaction half/op topics, the revive log,
`TBW102`, anything starting `rmq_sys_`, `RMQ_SYS_` or `%SYS%`) cannot be created or written
by users, and groups starting `CID_RMQ_SYS_` are the broker's own.
`%RETRY%<group>` and `%DLQ%<group>` are per-group topics the broker creates on demand.

Every layer checks names with these functions: the `*_problem` functions say what is wrong
(or None) so that a layer can raise its own error type (the broker's `validate_*` functions,
`broker.names`, raise the broker's).
"""

from __future__ import annotations

import re

TOPIC_MAX_LENGTH = 127  # the record's TOPICLEN is one signed byte
_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
# a group's retry and DLQ topics must fit the topic limit: 127 - len("%RETRY%") = 120
GROUP_MAX_LENGTH = TOPIC_MAX_LENGTH - len(RETRY_GROUP_TOPIC_PREFIX)
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
REVIVE_TOPIC = "rmq_sys_REVIVE_LOG"
AUTO_CREATE_TEMPLATE_TOPIC = "TBW102"
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
# every prefix that marks a topic as the broker's (RocketMQ's and its proxy's)
SYSTEM_TOPIC_PREFIXES = (SYSTEM_TOPIC_PREFIX, "RMQ_SYS_", "%SYS%")
SYSTEM_TOPICS = frozenset(
    {
        SCHEDULE_TOPIC,
        TRANS_HALF_TOPIC,
        TRANS_OP_HALF_TOPIC,
        REVIVE_TOPIC,
        AUTO_CREATE_TEMPLATE_TOPIC,
        "BenchmarkTest",
        "OFFSET_MOVED_EVENT",
        "SELF_TEST_TOPIC",
        "RMQ_SYS_TRACE_TOPIC",
        "rmq_sys_wheel_timer",
        "TRANS_CHECK_MAX_TIME_TOPIC",
    }
)
# groups the broker uses for its own bookkeeping in the offset table
SYSTEM_GROUP_PREFIX = "CID_RMQ_SYS_"


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_GROUP_TOPIC_PREFIX)


def is_dlq_topic(topic: str) -> bool:
    return topic.startswith(DLQ_GROUP_TOPIC_PREFIX)


def is_system_topic(topic: str) -> bool:
    return topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIXES)


def is_system_group(group: str) -> bool:
    return group.startswith(SYSTEM_GROUP_PREFIX)


def _chars_problem(name: str) -> str | None:
    if _NAME.match(name):
        return None
    bad = sorted({c for c in name if not _NAME.match(c)})
    return f"contains {''.join(bad)!r}; allowed are letters, digits, '%', '|', '_', '-'"


# names found valid: every message sent or received names its topic, and a topic's name
# is checked on both sides of the wire; bounded, so a stream of junk names cannot grow it
_VALID_TOPICS: set[str] = set()
_VALID_NAMES_KEPT = 4096


def topic_name_problem(name: object) -> str | None:
    """What is wrong with `name` as a topic name, or None when it is a valid one."""
    if not isinstance(name, str):
        return "must be a string"
    if name in _VALID_TOPICS:
        return None
    if not name or not name.strip():
        return "must not be blank"
    if len(name) > TOPIC_MAX_LENGTH:
        return f"is {len(name)} characters; at most {TOPIC_MAX_LENGTH}"
    return _chars_checked(name, _VALID_TOPICS)


_VALID_GROUPS: set[str] = set()  # as `_VALID_TOPICS`: each receive and ack names its group


def _chars_checked(name: str, valid: set[str]) -> str | None:
    """`_chars_problem`, remembering a valid name in `valid` (bounded)."""
    problem = _chars_problem(name)
    if problem is None:
        if len(valid) >= _VALID_NAMES_KEPT:
            valid.clear()
        valid.add(name)
    return problem


def group_name_problem(name: object) -> str | None:
    """What is wrong with `name` as a group name, or None when it is a valid one."""
    if not isinstance(name, str):
        return "must be a string"
    if name in _VALID_GROUPS:
        return None
    if not name or not name.strip():
        return "must not be blank"
    if len(name) > GROUP_MAX_LENGTH:
        return (
            f"is {len(name)} characters; at most {GROUP_MAX_LENGTH} "
            f"(so that %RETRY%<group> fits the topic limit)"
        )
    return _chars_checked(name, _VALID_GROUPS)
