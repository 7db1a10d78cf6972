"""The broker's name checks: the rules of `protocol.names`, raising the broker's errors.

The rules themselves, and the broker's own topic names, are `protocol.names`, which a
client may import without loading the broker.
"""

from __future__ import annotations

from broker.errors import InvalidGroupName, InvalidTopicName, SystemTopicReserved
from protocol.names import group_name_problem, is_system_topic, topic_name_problem


def validate_topic_name(name: object) -> str:
    """The name itself, or InvalidTopicName saying exactly what is wrong."""
    problem = topic_name_problem(name)
    if problem is not None:
        raise InvalidTopicName(name if isinstance(name, str) else repr(name), problem)
    assert isinstance(name, str)
    return name


def validate_user_topic(name: object) -> str:
    """A topic a user may create or send to: valid and not a system topic."""
    topic = validate_topic_name(name)
    if is_system_topic(topic):
        raise SystemTopicReserved(topic)
    return topic


def validate_group_name(name: object) -> str:
    """The name itself, or InvalidGroupName saying exactly what is wrong."""
    problem = group_name_problem(name)
    if problem is not None:
        raise InvalidGroupName(name if isinstance(name, str) else repr(name), problem)
    assert isinstance(name, str)
    return name
