"""Consumer send-back: the retry ladder and the dead-letter queue, as messages.

A message a consumer could not process (RECONSUME_LATER) comes back with its stored
reconsume count `r` and is rewritten, never changed in place:

    r < max_reconsume_times:
        SCHEDULE_TOPIC_XXXX, queue level-1, level = delay_level or 3 + r (clamped)
        REAL_TOPIC=%RETRY%<group>  REAL_QID=<retry queue>  DELAY=<level>
        TIMER_DELIVER_MS=now + delay(level)  RECONSUME_TIME=r+1  reconsume_times=r+1
        RETRY_TOPIC=<original topic>  ORIGIN_MESSAGE_ID  ORIGIN_COMMITLOG_OFFSET
        (the schedule service moves it to %RETRY%<group> when due)
    r >= max_reconsume_times, or delay_level < 0:
        %DLQ%<group> queue 0, DLQ_ORIGIN_TOPIC, DLQ_ORIGIN_MESSAGE_ID
        (+ PARKED_MESSAGE_GROUP=<message group> when an ordered consumer parks its group)

`UNIQ_KEY`, `KEYS`, `TAGS` and user properties travel unchanged, so the client-visible
message id is the same on every attempt and in the dead-letter queue.
"""

from __future__ import annotations

from broker.store.message import Message, MessageExt, SysFlag
from protocol.names import SCHEDULE_TOPIC, dlq_topic, is_dlq_topic, is_retry_topic, retry_topic
from protocol.props import Prop

FIRST_RETRY_LEVEL = 3  # reconsume 0 -> level 3 (10 s with the default table)
# on a dead letter: the message group an ordered consumer parked with it (see broker.parking)
PARKED_MESSAGE_GROUP = "PARKED_MESSAGE_GROUP"
_TRANSACTION_BITS = int(SysFlag.TRANSACTION_ROLLBACK)  # both transaction bits
_DROPPED_ON_REWRITE = (
    Prop.DELAY,
    Prop.TIMER_DELIVER_MS,
    Prop.REAL_TOPIC,
    Prop.REAL_QID,
    Prop.TRAN_MSG,
    Prop.PRODUCER_GROUP,
    Prop.TRANSACTION_CHECK_TIMES,
)


def original_topic(msg: MessageExt) -> str:
    """The topic a (possibly retried) message was first sent to."""
    return msg.properties.get(Prop.RETRY_TOPIC) or msg.topic


def retry_level(delay_level: int, reconsume_times: int, levels: int) -> int:
    """The delay level of the next retry: the requested one, else 3 + reconsume times."""
    level = delay_level if delay_level > 0 else FIRST_RETRY_LEVEL + reconsume_times
    return max(1, min(level, levels))


def _carried_properties(msg: MessageExt) -> dict[str, str]:
    props = {k: v for k, v in msg.properties.items() if k not in _DROPPED_ON_REWRITE}
    if Prop.RETRY_TOPIC not in props:
        if is_dlq_topic(msg.topic) and Prop.DLQ_ORIGIN_TOPIC in props:
            props[Prop.RETRY_TOPIC] = props[Prop.DLQ_ORIGIN_TOPIC]
        elif not is_retry_topic(msg.topic):
            props[Prop.RETRY_TOPIC] = msg.topic
    props.setdefault(Prop.ORIGIN_MESSAGE_ID, msg.offset_msg_id)
    props.setdefault(Prop.ORIGIN_COMMITLOG_OFFSET, str(msg.commitlog_offset))
    return props


def build_retry_message(
    group: str,
    msg: MessageExt,
    *,
    level: int,
    delay_ms: int,
    now_ms: int,
    retry_queue_id: int,
    max_reconsume_times: int,
) -> Message:
    """The schedule-topic copy that becomes retry number `msg.reconsume_times + 1`."""
    props = _carried_properties(msg)
    reconsume = msg.reconsume_times + 1
    props.update(
        {
            Prop.REAL_TOPIC: retry_topic(group),
            Prop.REAL_QID: str(retry_queue_id),
            Prop.DELAY: str(level),
            Prop.TIMER_DELIVER_MS: str(now_ms + delay_ms),
            Prop.RECONSUME_TIME: str(reconsume),
            Prop.MAX_RECONSUME_TIMES: str(max_reconsume_times),
        }
    )
    return Message(
        topic=SCHEDULE_TOPIC,
        body=msg.body,
        queue_id=level - 1,
        flag=msg.flag,
        properties=props,
        sys_flag=msg.sys_flag & ~_TRANSACTION_BITS,
        born_timestamp=msg.born_timestamp,
        born_host=msg.born_host,
        reconsume_times=reconsume,
    )


def build_dlq_message(group: str, msg: MessageExt, *, parked_group: str | None = None) -> Message:
    """The dead-letter copy of `msg` for `group`; `parked_group`: the message group an
    ordered consumer parks with it (stamped as `PARKED_MESSAGE_GROUP`)."""
    props = _carried_properties(msg)
    if parked_group is not None:
        props[PARKED_MESSAGE_GROUP] = parked_group
    props[Prop.DLQ_ORIGIN_TOPIC] = original_topic(msg)
    props[Prop.DLQ_ORIGIN_MESSAGE_ID] = msg.msg_id
    props[Prop.RECONSUME_TIME] = str(msg.reconsume_times)
    return Message(
        topic=dlq_topic(group),
        body=msg.body,
        queue_id=0,
        flag=msg.flag,
        properties=props,
        sys_flag=msg.sys_flag & ~_TRANSACTION_BITS,
        born_timestamp=msg.born_timestamp,
        born_host=msg.born_host,
        reconsume_times=msg.reconsume_times,
    )


def unschedule_now(scheduled: Message, *, reconsume_times: int) -> Message:
    """A schedule-topic copy turned into its real-topic message right away (no delay)."""
    props = {
        k: v
        for k, v in scheduled.properties.items()
        if k not in (Prop.DELAY, Prop.TIMER_DELIVER_MS)
    }
    props[Prop.RECONSUME_TIME] = str(reconsume_times)
    return Message(
        topic=props[Prop.REAL_TOPIC],
        body=scheduled.body,
        queue_id=int(props[Prop.REAL_QID]),
        flag=scheduled.flag,
        properties=props,
        sys_flag=scheduled.sys_flag,
        born_timestamp=scheduled.born_timestamp,
        born_host=scheduled.born_host,
        reconsume_times=reconsume_times,
    )
