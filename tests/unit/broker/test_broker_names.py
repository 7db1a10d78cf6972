"""Topic and group names, permission bits, message types: clear typed errors."""

from __future__ import annotations

import pytest

from broker.errors import (
    InvalidArgument,
    InvalidGroupName,
    InvalidTopicName,
    SystemTopicReserved,
)
from broker.names import validate_group_name, validate_topic_name, validate_user_topic
from broker.topic import (
    PERM_READ,
    PERM_READ_WRITE,
    PERM_WRITE,
    TopicConfig,
    TopicMessageType,
    is_readable,
    is_writeable,
    perm_to_string,
)
from protocol.names import dlq_topic, retry_topic


@pytest.mark.parametrize("name", ["orders", "a", "Order_Created-v2", "a|b", "%RETRY%g", "x" * 127])
def test_valid_topic_names(name: str) -> None:
    assert validate_topic_name(name) == name


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "blank"),
        ("   ", "blank"),
        ("x" * 128, "at most 127"),
        ("a b", "' '"),
        ("a.b", "'.'"),
        ("naïve", "'ï'"),
        ("a/b", "'/'"),
        ("a~b", "'~'"),
    ],
)
def test_invalid_topic_names_say_why(name: str, fragment: str) -> None:
    with pytest.raises(InvalidTopicName) as info:
        validate_topic_name(name)
    assert fragment in str(info.value)
    assert info.value.name == name


def test_non_string_topic_is_rejected() -> None:
    with pytest.raises(InvalidTopicName):
        validate_topic_name(42)


@pytest.mark.parametrize(
    "name",
    [
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TBW102",
        "rmq_sys_anything",
    ],
)
def test_system_topics_are_reserved(name: str) -> None:
    validate_topic_name(name)  # a valid name...
    with pytest.raises(SystemTopicReserved):
        validate_user_topic(name)  # ...that users may not use


def test_group_names() -> None:
    assert validate_group_name("billing-consumers") == "billing-consumers"
    for bad in ("", "a b", "g" * 121, "é"):
        with pytest.raises(InvalidGroupName):
            validate_group_name(bad)


def test_derived_topics_of_the_longest_group_fit_the_topic_limit() -> None:
    group = validate_group_name("g" * 120)
    validate_topic_name(retry_topic(group))
    validate_topic_name(dlq_topic(group))


def test_permission_bits() -> None:
    assert is_readable(PERM_READ) and not is_writeable(PERM_READ)
    assert is_writeable(PERM_WRITE) and not is_readable(PERM_WRITE)
    assert is_readable(PERM_READ_WRITE) and is_writeable(PERM_READ_WRITE)
    assert perm_to_string(6) == "RW-"
    assert perm_to_string(4) == "R--"


@pytest.mark.parametrize(
    "kwargs", [{"perm": 16}, {"perm": -1}, {"read_queue_nums": 0}, {"write_queue_nums": 1025}]
)
def test_topic_config_rejects_bad_values(kwargs: dict[str, int]) -> None:
    with pytest.raises(InvalidArgument):
        TopicConfig("t", **kwargs)  # type: ignore[arg-type]


def test_message_types() -> None:
    assert TopicMessageType.parse("fifo") is TopicMessageType.FIFO
    assert TopicMessageType.MIXED.accepts(TopicMessageType.TRANSACTION)
    assert not TopicMessageType.NORMAL.accepts(TopicMessageType.DELAY)
    with pytest.raises(InvalidArgument):
        TopicMessageType.parse("SOMETIMES")


def test_topic_config_json_round_trip() -> None:
    cfg = TopicConfig("t", 8, 4, PERM_READ, TopicMessageType.FIFO, order=True)
    assert TopicConfig.from_json(cfg.to_json()) == cfg
