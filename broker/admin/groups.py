"""A consumer group's progress, moving its offsets, deleting it; deleting a topic.

    GroupProgress     {group}: per topic and queue, and in total: committed offset, max
                      offset, lag, in flight (invisible-time leases outstanding), last
                      consume time; the group's retry-topic depth and DLQ depth
    ResetGroupOffset  {group, topic, to: earliest|latest|offset|time, offset?, time_ms?,
                      execute=false, force=false}: the before/after table per queue
    DeleteGroup       {group, force=false}: its config, offsets and invisible-time state
    DeleteTopic       {topic}: its config and every group's offsets on it

Lag is the queue's max offset minus the committed offset (from the queue's min offset when
the group has none there). The retry-topic depth is what the group has not consumed of
`%RETRY%<group>`; the DLQ depth is what `%DLQ%<group>` still holds (`pending`: of those,
not replayed yet). The last consume time is when the group last acknowledged or committed
in the queue (`ConsumerOffsetManager.touch`).

Moving offsets or deleting a group under live consumers is refused (`GroupHasConsumers`)
unless forced: a running consumer keeps its own position and would write it back. A reset
replaces the group's invisible-time windows on the topic, so leases handed out before it
no longer count and the next receive starts at the new offsets.

Deleting a topic removes its config, its consume queues and every group's offsets and
invisible-time windows on it; its messages stay in the commitlog until the commitlog
files expire (`file_reserved_hours`), like RocketMQ's deleteTopic.
"""

from __future__ import annotations

from typing import Any

from broker.admin import params as p
from broker.admin.dlq import ReplayLedger
from broker.broker import Broker
from broker.errors import BrokerError, GroupNotFound, InvalidArgument, ResponseCode, TopicNotFound
from broker.names import validate_group_name, validate_user_topic
from protocol.admin import Params
from protocol.names import dlq_topic, is_dlq_topic, is_retry_topic, retry_topic

RESET_TARGETS = ("earliest", "latest", "offset", "time")


class GroupHasConsumers(BrokerError):
    """The group has live consumers: the change is refused unless forced."""

    code = ResponseCode.NO_PERMISSION

    def __init__(self, group: str, consumers: list[str]) -> None:
        self.group = group
        self.consumers = consumers
        super().__init__(
            f"group {group!r} has {len(consumers)} live consumer(s) "
            f"({', '.join(consumers[:5])}); stop them first, or force it"
        )


def _group(broker: Broker, params: Params) -> str:
    group = p.text(params, "group", required=True)
    assert group is not None
    validate_group_name(group)
    if broker.get_group(group) is None:
        raise GroupNotFound(group)
    return group


def _ms(value: int | None) -> dict[str, object]:
    return {
        "last_consume_time_ms": value,
        "last_consume_time": p.iso_ms(value) if value is not None else None,
    }


def _latest(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def group_progress(broker: Broker, params: Params) -> dict[str, object]:
    group = _group(broker, params)
    store = broker.store
    topics: dict[str, list[dict[str, Any]]] = {}  # rows read back below
    for qp in broker.consumer_progress(group):
        if is_retry_topic(qp.topic) or is_dlq_topic(qp.topic):
            continue
        low = store.get_min_offset_in_queue(qp.topic, qp.queue_id)
        committed = qp.consumer_offset if qp.consumer_offset >= 0 else None
        lag = max(0, qp.broker_offset - (committed if committed is not None else low))
        when = broker.consume_times(group, qp.topic).get(qp.queue_id)
        topics.setdefault(qp.topic, []).append(
            {
                "queue_id": qp.queue_id,
                "committed_offset": committed,
                "min_offset": low,
                "max_offset": qp.broker_offset,
                "lag": lag,
                "in_flight": qp.in_flight,
                **_ms(when),
            }
        )
    out_topics: list[dict[str, Any]] = []
    for topic, queues in sorted(topics.items()):
        out_topics.append(
            {
                "topic": topic,
                "queues": queues,
                "lag": sum(q["lag"] for q in queues),
                "in_flight": sum(q["in_flight"] for q in queues),
                **_ms(_latest([q["last_consume_time_ms"] for q in queues])),
            }
        )
    retry = retry_topic(group)
    rcfg = broker.get_topic(retry)
    retry_depth = retry_in_flight = 0
    retry_times: list[int | None] = []
    if rcfg is not None:
        times = broker.consume_times(group, retry)
        for q in range(rcfg.read_queue_nums):
            low, high = (
                store.get_min_offset_in_queue(retry, q),
                store.get_max_offset_in_queue(retry, q),
            )
            committed = broker.query_offset(group, retry, q)
            retry_depth += max(0, high - (committed if committed >= 0 else low))
            retry_times.append(times.get(q))
        retry_in_flight = len(broker.in_flight(group, retry))
    dlq = dlq_topic(group)
    dlq_low, dlq_high = store.get_min_offset_in_queue(dlq, 0), store.get_max_offset_in_queue(dlq, 0)
    replayed = sum(
        1
        for (offset, _) in ReplayLedger(store.config.config_dir).replayed(group)
        if dlq_low <= offset < dlq_high
    )
    return {
        "group": group,
        "consumers": broker.consumer_ids(group),
        "topics": out_topics,
        "retry_topic": retry,
        "retry_depth": retry_depth,
        "retry_in_flight": retry_in_flight,
        "dlq_topic": dlq,
        "dlq_depth": dlq_high - dlq_low,
        "dlq_replayed": replayed,
        "dlq_pending": dlq_high - dlq_low - replayed,
        "total": {
            "lag": sum(t["lag"] for t in out_topics),
            "in_flight": sum(t["in_flight"] for t in out_topics) + retry_in_flight,
            **_ms(_latest([t["last_consume_time_ms"] for t in out_topics] + retry_times)),
        },
    }


def _refuse_live(broker: Broker, group: str, force: bool) -> list[str]:
    live = broker.consumer_ids(group)
    if live and not force:
        raise GroupHasConsumers(group, live)
    return live


def reset_group_offset(broker: Broker, params: Params) -> dict[str, object]:
    group = _group(broker, params)
    topic = p.topic(params, required=True)
    assert topic is not None
    cfg = broker.get_topic(topic)
    if cfg is None:
        raise TopicNotFound(topic)
    to = p.text(params, "to", required=True)
    if to not in RESET_TARGETS:
        raise InvalidArgument(f"to must be one of {', '.join(RESET_TARGETS)}")
    offset = p.integer(params, "offset")
    time_ms = p.integer(params, "time_ms")
    if to == "offset" and offset is None:
        raise InvalidArgument("to=offset needs offset")
    if to == "time" and time_ms is None:
        raise InvalidArgument("to=time needs time_ms")
    execute = p.flag(params, "execute")
    live = (
        _refuse_live(broker, group, p.flag(params, "force"))
        if execute
        else broker.consumer_ids(group)
    )
    store = broker.store
    queues: list[dict[str, object]] = []
    after: dict[int, int] = {}
    clamped: dict[int, str] = {}  # to=offset outside a queue: moved to its end or start
    for q in range(cfg.read_queue_nums):
        low, high = store.get_min_offset_in_queue(topic, q), store.get_max_offset_in_queue(topic, q)
        if to == "earliest":
            new = low
        elif to == "latest":
            new = high
        elif to == "offset":
            assert offset is not None
            new = min(max(offset, low), high)
            if offset != new:
                clamped[q] = "end" if offset > high else "start"
        else:
            assert time_ms is not None
            new = max(store.get_offset_in_queue_by_time(topic, q, time_ms), low)
        before = broker.query_offset(group, topic, q)
        after[q] = new
        queues.append(
            {
                "queue_id": q,
                "min_offset": low,
                "max_offset": high,
                "before": before if before >= 0 else None,
                "after": new,
                "lag_before": max(0, high - (before if before >= 0 else low)),
                "lag_after": high - new,
                "clamped": clamped.get(q),
            }
        )
    if execute:
        broker.reset_offsets(group, topic, after)
    return {
        "group": group,
        "topic": topic,
        "to": to,
        "executed": execute,
        "consumers": live,
        "queues": queues,
    }


def delete_group(broker: Broker, params: Params) -> dict[str, object]:
    group = _group(broker, params)
    live = _refuse_live(broker, group, p.flag(params, "force"))
    topics = broker.consumer_progress(group)
    broker.delete_group(group)
    broker.persist_offsets()
    return {
        "group": group,
        "deleted": True,
        "forced_with_consumers": live,
        "offsets_removed_on": sorted({qp.topic for qp in topics}),
    }


def delete_topic(broker: Broker, params: Params) -> dict[str, object]:
    topic = p.topic(params, required=True)
    assert topic is not None
    validate_user_topic(topic)  # system topics are refused
    cfg = broker.get_topic(topic)
    if cfg is None:
        raise TopicNotFound(topic)
    queues = [
        {
            "queue_id": q,
            "min_offset": broker.min_offset(topic, q),
            "max_offset": broker.max_offset(topic, q),
        }
        for q in range(max(cfg.read_queue_nums, cfg.write_queue_nums))
    ]
    deleted = broker.delete_topic(topic)
    broker.persist_offsets()
    return {
        "topic": topic,
        "deleted": deleted,
        "queues": queues,
        "note": "messages stay in the commitlog until its files expire",
    }
