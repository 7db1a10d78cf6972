"""Request checks, mirroring the Apache proxy's (`GrpcValidator`, `SendMessageActivity`).

Each check raises the `ServerError` subclass whose code the proxy documents for that case,
so a client sees the same status from us as from a RocketMQ 5 cluster.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from broker.server.codes import Code
from broker.server.config import ServerConfig
from broker.server.errors import (
    BadRequest,
    IllegalConsumerGroup,
    IllegalFilterExpression,
    IllegalInvisibleTime,
    IllegalMessage,
    IllegalTopic,
    MessageBodyEmpty,
    MessageBodyTooLarge,
)
from protocol.names import (
    group_name_problem,
    is_system_group,
    is_system_topic,
    topic_name_problem,
)

# property names the broker itself interprets; users may not set them (RocketMQ MessageConst)
RESERVED_PROPERTIES = frozenset(
    {
        "KEYS",
        "TAGS",
        "WAIT",
        "DELAY",
        "RETRY_TOPIC",
        "REAL_TOPIC",
        "REAL_QID",
        "TRAN_MSG",
        "PGROUP",
        "MIN_OFFSET",
        "MAX_OFFSET",
        "BUYER_ID",
        "ORIGIN_MESSAGE_ID",
        "TRANSFER_FLAG",
        "CORRECTION_FLAG",
        "MQ2_FLAG",
        "RECONSUME_TIME",
        "MSG_REGION",
        "TRACE_ON",
        "UNIQ_CLIENT_MESSAGE_ID_KEYIDX",
        "MAX_RECONSUME_TIMES",
        "CONSUME_START_TIME",
        "TRAN_PREPARED_QUEUE_OFFSET",
        "TRANSACTION_CHECK_TIMES",
        "CHECK_IMMUNITY_TIME_IN_SECONDS",
        "INSTANCE_ID",
        "CORRELATION_ID",
        "REPLY_TO_CLIENT",
        "TTL",
        "ARRIVE_TIME",
        "PUSH_REPLY_TIME",
        "CLUSTER",
        "MSG_TYPE",
        "__SHARDINGKEY",
        "TIMER_DELIVER_MS",
        "TIMER_DELAY_SEC",
        "TIMER_DELAY_MS",
        "TIMER_OUT_MS",
        "TIMER_ENQUEUE_MS",
        "TIMER_DEQUEUE_MS",
        "TIMER_ROLL_TIMES",
        "TIMER_DEL_UNIQKEY",
        "__STARTDELIVERTIME",
        "DLQ_ORIGIN_TOPIC",
        "DLQ_ORIGIN_MESSAGE_ID",
        "ORIGIN_COMMITLOG_OFFSET",
        "__transactionId__",
        "POP_CK",
        "POP_CK_OFFSET",
        "1ST_POP_TIME",
        "INNER_MULTI_DISPATCH",
        "INNER_MULTI_QUEUE_OFFSET",
        "TRACE_CONTEXT",
        "__RECALL_HANDLE",
    }
)

# topic message types (as the admin stores them) and what they accept
TOPIC_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")
_ACCEPTS_ALL = frozenset({"MIXED", "UNSPECIFIED", ""})


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_has_control_search = _CONTROL.search


def _has_control(text: str) -> bool:
    return _has_control_search(text) is not None


def check_topic(name: str) -> str:
    """A topic a client may address (`protocol.names` rules, not a system topic)."""
    problem = topic_name_problem(name)  # remembers the names it found valid
    if problem is not None:
        raise IllegalTopic(f"topic name {name!r} {problem}")
    if is_system_topic(name):
        raise IllegalTopic(f"cannot access system topic {name!r}")
    return name


def check_group(name: str) -> str:
    """A group a client may use (`protocol.names` rules, not a system group)."""
    problem = group_name_problem(name)
    if problem is not None:
        raise IllegalConsumerGroup(f"group name {name!r} {problem}")
    if is_system_group(name):
        raise IllegalConsumerGroup(f"cannot use system consumer group {name!r}")
    return name


def check_message_id(message_id: str) -> str:
    if message_id.isalnum() and message_id.isascii() and len(message_id) <= 128:
        return message_id  # every client's ids (hex, or letters and digits) take this path
    if not message_id or not message_id.strip():
        raise IllegalMessage("message id is empty", Code.ILLEGAL_MESSAGE_ID)
    if len(message_id) > 128 or _has_control(message_id):
        raise IllegalMessage("message id is malformed", Code.ILLEGAL_MESSAGE_ID)
    return message_id


def check_body(body: bytes, config: ServerConfig) -> None:
    if not body:
        raise MessageBodyEmpty("message body is empty")
    if len(body) > config.max_body_size:
        raise MessageBodyTooLarge(
            f"message body of {len(body)} bytes exceeds {config.max_body_size} bytes"
        )


def check_tag(tag: str) -> None:
    if not tag:
        return
    if not tag.strip():
        raise IllegalMessage("tag cannot be whitespace only", Code.ILLEGAL_MESSAGE_TAG)
    if "|" in tag:
        raise IllegalMessage("tag cannot contain '|'", Code.ILLEGAL_MESSAGE_TAG)
    if _has_control(tag):
        raise IllegalMessage("tag cannot contain control characters", Code.ILLEGAL_MESSAGE_TAG)


def check_keys(keys: Iterable[str]) -> None:
    for key in keys:
        if not key or not key.strip():
            raise IllegalMessage("message key cannot be blank", Code.ILLEGAL_MESSAGE_KEY)
        if _has_control(key):
            raise IllegalMessage(
                "message key cannot contain control characters", Code.ILLEGAL_MESSAGE_KEY
            )


def check_message_group(group: str, config: ServerConfig) -> None:
    if not group:
        raise IllegalMessage("message group is empty", Code.ILLEGAL_MESSAGE_GROUP)
    if len(group.encode()) >= config.max_message_group_size:
        raise IllegalMessage(
            f"message group is {config.max_message_group_size} bytes or longer",
            Code.ILLEGAL_MESSAGE_GROUP,
        )
    if _has_control(group):
        raise IllegalMessage(
            "message group cannot contain control characters", Code.ILLEGAL_MESSAGE_GROUP
        )


def check_properties(
    user: Mapping[str, str],
    tag: str,
    keys: Iterable[str],
    config: ServerConfig,
    allowed: frozenset[str] = frozenset(),
) -> None:
    """Count, size and names of a message's properties; `allowed`: reserved names this
    message may carry (a per-group resend's `RETRY_TOPIC`, checked by the caller)."""
    if len(user) > config.max_properties:
        raise IllegalMessage(
            f"more than {config.max_properties} properties", Code.MESSAGE_PROPERTIES_TOO_LARGE
        )
    size = len(tag.encode()) + sum(len(k.encode()) for k in keys)
    for name, value in user.items():
        if not name or not name.strip():
            raise IllegalMessage("property name cannot be blank", Code.ILLEGAL_MESSAGE_PROPERTY_KEY)
        if name in RESERVED_PROPERTIES and name not in allowed:
            raise IllegalMessage(
                f"property name {name!r} is reserved by the broker",
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
            )
        if _has_control(name) or "\x01" in value or "\x02" in value:
            raise IllegalMessage(
                f"property {name!r} contains control characters", Code.ILLEGAL_MESSAGE_PROPERTY_KEY
            )
        size += len(name.encode()) + len(value.encode())
    if size > config.max_properties_size:
        raise IllegalMessage(
            f"properties, tag and keys take {size} bytes, over {config.max_properties_size}",
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
        )


def check_delivery_time(deliver_at_ms: int, now_ms: int, config: ServerConfig) -> None:
    if deliver_at_ms - now_ms > config.max_delay_ms:
        raise IllegalMessage(
            f"delivery time is more than {config.max_delay_ms // 1000} s ahead "
            "(the timestamp is in epoch seconds)",
            Code.ILLEGAL_DELIVERY_TIME,
        )


def check_type_accepted(topic: str, topic_type: str, message_type: str) -> None:
    if topic_type.upper() in _ACCEPTS_ALL or topic_type.upper() == message_type:
        return
    raise IllegalMessage(
        f"topic {topic} accepts {topic_type} messages, not {message_type}",
        Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
    )


def accepted_types(topic_type: str) -> tuple[str, ...]:
    """The message types a route advertises for a topic of this type."""
    upper = topic_type.upper()
    if upper in _ACCEPTS_ALL:
        return ("NORMAL", "FIFO", "DELAY", "TRANSACTION")
    return (upper,)


def check_invisible_ms(value_ms: int, low_ms: int, high_ms: int) -> int:
    if value_ms < low_ms:
        raise IllegalInvisibleTime(f"invisible time {value_ms} ms is below {low_ms} ms")
    if value_ms > high_ms:
        raise IllegalInvisibleTime(f"invisible time {value_ms} ms is above {high_ms} ms")
    return value_ms


def parse_filter(filter_type: int, expression: str) -> frozenset[str] | None:
    """Tags to match (`None`: all). `filter_type` is the protocol's FilterType number."""
    if filter_type == 2:  # SQL
        raise IllegalFilterExpression("SQL92 filters are not supported; filter by tags")
    if filter_type not in (0, 1):
        raise BadRequest(f"unknown filter type {filter_type}")
    if _has_control(expression):
        raise IllegalFilterExpression("filter expression contains control characters")
    parts = [p.strip() for p in expression.split("||")]
    tags = frozenset(p for p in parts if p)
    if not tags or "*" in tags:
        return None
    return tags
