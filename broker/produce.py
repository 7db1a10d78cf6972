"""The produce path's pure rules: property checks, message types, where a delayed message
waits. No I/O: `broker.produce_engine.ProduceEngine` applies them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from broker.errors import MessageIllegal
from broker.schedule import TIMER_QUEUE_ID
from broker.store.message import Message
from broker.topic import TopicMessageType
from protocol.names import SCHEDULE_TOPIC
from protocol.props import Prop

_DELAY_PROPS = (Prop.DELAY, Prop.TIMER_DELIVER_MS)


def check_properties(props: Mapping[str, str]) -> None:
    for k, v in props.items():
        if not isinstance(k, str) or not isinstance(v, str) or not k:
            raise MessageIllegal(f"property {k!r}={v!r}: names and values must be strings")
        if any(c in k or c in v for c in "\x01\x02"):
            raise MessageIllegal(f"property {k!r} contains a reserved separator character")


def message_type_of(msg: Message) -> TopicMessageType:
    """What kind of message this is, as a topic's `message.type` judges it."""
    p = msg.properties
    if p.get(Prop.TRAN_MSG) == "true":
        return TopicMessageType.TRANSACTION
    if Prop.DELAY in p or Prop.TIMER_DELIVER_MS in p:
        return TopicMessageType.DELAY
    if p.get(Prop.SHARDING_KEY):
        return TopicMessageType.FIFO
    return TopicMessageType.NORMAL


def schedule_target(
    msg: Message, levels_ms: tuple[int, ...], now_ms: int, max_delay_ms: int
) -> tuple[int, int] | None:
    """(schedule queue id, delivery ms) for a delayed message; None to deliver now.

    DELAY=L waits in queue L-1 for the level's delay (L <= 0: no delay); TIMER_DELIVER_MS
    waits in the timer queue until then (a past time: no delay; beyond `max_delay_ms`: refused).
    """
    p = msg.properties
    if Prop.DELAY in p and Prop.TIMER_DELIVER_MS in p:
        raise MessageIllegal("set either a delay level or a delivery time, not both")
    if Prop.DELAY in p:
        try:
            level = int(p[Prop.DELAY])
        except ValueError:
            raise MessageIllegal(f"delay level {p[Prop.DELAY]!r} is not a number") from None
        if level <= 0:
            return None  # RocketMQ: level 0 means no delay
        if level > len(levels_ms):
            raise MessageIllegal(
                f"delay level {level} is beyond the {len(levels_ms)} configured levels"
            )
        return level - 1, now_ms + levels_ms[level - 1]
    if Prop.TIMER_DELIVER_MS in p:
        try:
            at = int(p[Prop.TIMER_DELIVER_MS])
        except ValueError:
            raise MessageIllegal(
                f"delivery time {p[Prop.TIMER_DELIVER_MS]!r} is not epoch ms"
            ) from None
        if at > now_ms + max_delay_ms:
            raise MessageIllegal(f"delivery time is more than {max_delay_ms} ms in the future")
        if at <= now_ms:
            return None
        return TIMER_QUEUE_ID, at
    return None


def without_delay(msg: Message) -> Message:
    """The message minus delay properties that turned out to mean "now"."""
    if not any(k in msg.properties for k in _DELAY_PROPS):
        return msg
    return replace(
        msg, properties={k: v for k, v in msg.properties.items() if k not in _DELAY_PROPS}
    )


def scheduled_copy(msg: Message, queue_id: int, deliver_ms: int) -> Message:
    """The SCHEDULE_TOPIC_XXXX copy that waits until `deliver_ms` (also its CQ tag code)."""
    props = dict(msg.properties)
    props.update(
        {
            Prop.REAL_TOPIC: msg.topic,
            Prop.REAL_QID: str(msg.queue_id),
            Prop.TIMER_DELIVER_MS: str(deliver_ms),
        }
    )
    return Message(
        topic=SCHEDULE_TOPIC,
        body=msg.body,
        queue_id=queue_id,
        flag=msg.flag,
        properties=props,
        sys_flag=msg.sys_flag,
        born_timestamp=msg.born_timestamp,
        born_host=msg.born_host,
        reconsume_times=msg.reconsume_times,
    )
