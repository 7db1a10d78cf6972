"""Topic and group names, checked where they are declared.

The rules are the broker's own (`protocol.names`: RocketMQ's), so a name the client accepts is
one the broker accepts: a group of more than 120 characters, whose `%RETRY%` topic would not
fit, is refused when the handler or consumer is declared, not when it first runs. This
module only turns the broker's verdict into the client's `InvalidName`.
"""

from __future__ import annotations

from protocol.names import (
    DLQ_GROUP_TOPIC_PREFIX,
    GROUP_MAX_LENGTH,
    RETRY_GROUP_TOPIC_PREFIX,
    TOPIC_MAX_LENGTH,
    dlq_topic,
    group_name_problem,
    is_dlq_topic,
    is_retry_topic,
    is_system_topic,
    retry_topic,
    topic_name_problem,
)
from reliable.errors import InvalidName

__all__ = [
    "DLQ_GROUP_TOPIC_PREFIX",
    "GROUP_MAX_LENGTH",
    "RETRY_GROUP_TOPIC_PREFIX",
    "TOPIC_MAX_LENGTH",
    "check_group",
    "check_topic",
    "dlq_topic",
    "is_dlq_topic",
    "is_retry_topic",
    "retry_topic",
]

_CHARACTERS = "only letters, digits, '%', '|', '_' and '-' allowed"


def _reason(name: object, problem: str, max_length: int) -> str:
    """The broker's problem, said as the client always said a bad character."""
    if isinstance(name, str) and name.strip() and len(name) <= max_length:
        return _CHARACTERS  # a non-blank name of legal length: its characters are wrong
    return problem


_ACCEPTED: set[str] = set()  # names accepted without allow_system (the check is pure)


def check_topic(name: str, *, allow_system: bool = False) -> str:
    """`name` itself, or InvalidName; a broker topic is refused unless `allow_system`.
    A producer checks every message's topic: names once accepted are remembered."""
    if isinstance(name, str) and name in _ACCEPTED:
        return name
    problem = topic_name_problem(name)
    if problem is not None:
        raise InvalidName("topic", str(name), _reason(name, problem, TOPIC_MAX_LENGTH))
    if not allow_system:
        if is_system_topic(name):
            raise InvalidName("topic", name, "reserved for the broker")
        if len(_ACCEPTED) >= 4096:  # a bound, however many topics come and go
            _ACCEPTED.clear()
        _ACCEPTED.add(name)
    return name


def check_group(name: str) -> str:
    """`name` itself, or InvalidName (at most `GROUP_MAX_LENGTH` characters)."""
    problem = group_name_problem(name)
    if problem is not None:
        raise InvalidName("group", str(name), _reason(name, problem, GROUP_MAX_LENGTH))
    return name
