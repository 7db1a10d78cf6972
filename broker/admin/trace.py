"""`TraceMessage {key, topic?, limit?, scan?}`: everything the broker knows about one
business message, in time order.

The message is named by a key, a client message id (UNIQ_KEY) or an offset message id.
Records found (through the index, exactly: see `broker.admin.messages`), then every
record carrying the same UNIQ_KEY in any topic, each given a role:

    original        the producer's record, in its topic
    delayed         a producer's delayed message waiting in SCHEDULE_TOPIC_XXXX
    half            a transactional half message (RMQ_SYS_TRANS_HALF_TOPIC)
    retry-scheduled a send-back copy waiting for its delay level (REAL_TOPIC=%RETRY%<g>)
    retry           that copy moved to %RETRY%<g> when due
    reconsume       an operator's copy in %RETRY%<g> (OPERATOR_ACTION=reconsume)
    replayed        a dead letter replayed by an operator (OPERATOR_ACTION=dlq-replay):
                    in %RETRY%<g> for group g, or in the original topic (`--to-topic`)
    dead-letter     the copy in %DLQ%<g>

Per consumer group and readable record (the original for every group that has offsets on
its topic, retry and reconsume copies for their group): the group's committed offset on
the record's queue (past the record: consumed), whether it is in flight now, and, from the
invisible-time log (`rmq_sys_REVIVE_LOG`, read from each record's store time on, at most
`scan` entries from each), every delivery (attempt, invisible until), hand-back or renewal,
and when the group was done with it. Done right after a dead-letter copy of that group was
stored means dead-lettered; otherwise acknowledged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from broker.admin import params as p
from broker.admin.dlq import DLQ_REPLAY_OFFSET, REPLAY_ACTION
from broker.admin.messages import (
    OPERATOR,
    OPERATOR_ACTION,
    MessageFinder,
    check_id,
    searchable_topics,
)
from broker.broker import Broker
from broker.pop_journal import unpack_leases
from broker.store import query
from broker.store.message import MessageExt
from protocol.admin import Params
from protocol.names import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    REVIVE_TOPIC,
    SCHEDULE_TOPIC,
    SYSTEM_GROUP_PREFIX,
    TRANS_HALF_TOPIC,
    is_dlq_topic,
    is_retry_topic,
)
from protocol.props import Prop

DEFAULT_RECORDS = 200
DEFAULT_SCAN = 100_000  # invisible-time log entries read per trace
_ADMIN_GROUP = SYSTEM_GROUP_PREFIX + "ADMIN"
_READ_BATCH = 64
_SLACK_MS = 1_000  # the log's first relevant entry may be stored just before the record


def role_of(msg: MessageExt) -> tuple[str, str | None]:
    """(role, consumer group the record is for, if any)."""
    if msg.topic == SCHEDULE_TOPIC:
        real = msg.properties.get(Prop.REAL_TOPIC, "")
        if is_retry_topic(real):
            return "retry-scheduled", real[len(RETRY_GROUP_TOPIC_PREFIX) :]
        return "delayed", None
    if msg.topic == TRANS_HALF_TOPIC:
        return "half", None
    action = msg.properties.get(OPERATOR_ACTION)
    if is_retry_topic(msg.topic):
        group = msg.topic[len(RETRY_GROUP_TOPIC_PREFIX) :]
        if action == REPLAY_ACTION:
            return "replayed", group
        return ("reconsume" if action else "retry"), group
    if is_dlq_topic(msg.topic):
        return "dead-letter", msg.topic[len(DLQ_GROUP_TOPIC_PREFIX) :]
    if action == REPLAY_ACTION:  # replayed to the original topic: every group reads it
        return "replayed", None
    return "original", None


@dataclass
class _Readable:
    """One record a group reads, and what the group did with it."""

    msg: MessageExt
    group: str
    committed: int = -1
    in_flight: bool = False
    # each from one invisible-time log entry, whose commitlog offset is the last field
    deliveries: list[tuple[int, int, int, int]] = field(default_factory=list)  # time, attempt,
    # until; a lease changed without a new delivery: time, attempt, new until, old until
    changes: list[tuple[int, int, int, int, int]] = field(default_factory=list)
    lease: tuple[int, int] | None = None  # the latest lease: attempt, until
    done: tuple[int, int] | None = None  # time, log offset
    done_how: str | None = None


def _event(
    time_ms: int,
    log_offset: int,
    kind: str,
    detail: str,
    msg: MessageExt | None = None,
    group: str | None = None,
    **extra: object,
) -> dict[str, object]:
    """One timeline entry; `log_offset` is the commitlog offset of the record that says so
    (a stored copy, or an invisible-time log entry): the order of events within one ms."""
    out: dict[str, object] = {
        "time_ms": time_ms,
        "time": p.iso_ms(time_ms),
        "source": "broker",
        "kind": kind,
        "group": group,
        "detail": detail,
        "log_offset": log_offset,
    }
    if msg is not None:
        out.update(
            topic=msg.topic,
            queue_id=msg.queue_id,
            queue_offset=msg.queue_offset,
            offset_msg_id=msg.offset_msg_id,
        )
    out.update(extra)
    return out


def _stored_event(msg: MessageExt, role: str, group: str | None) -> dict[str, object]:
    where = f"{msg.topic} queue {msg.queue_id} offset {msg.queue_offset}"
    if role == "original":
        text = f"stored in {where}"
    elif role == "delayed":
        due = msg.properties.get(Prop.TIMER_DELIVER_MS)
        text = f"stored delayed in {where}" + (f", due {p.iso_ms(int(due))}" if due else "")
    elif role == "half":
        text = f"stored as a transactional half message in {where}"
    elif role == "retry-scheduled":
        due = msg.properties.get(Prop.TIMER_DELIVER_MS)
        text = f"handed back by {group}: retry {msg.reconsume_times} scheduled in {where}" + (
            f", due {p.iso_ms(int(due))}" if due else ""
        )
    elif role == "retry":
        text = f"retry {msg.reconsume_times} for {group} in {where}"
    elif role == "reconsume":
        text = (
            f"operator {msg.properties.get(OPERATOR, '?')} re-sent it to {group}: copy in {where}"
        )
    elif role == "replayed":
        text = (
            f"operator {msg.properties.get(OPERATOR, '?')} replayed the dead letter "
            f"(DLQ offset {msg.properties.get(DLQ_REPLAY_OFFSET, '?')}) "
            + (f"to {group}: " if group else "to its topic: ")
            + f"copy in {where}"
        )
    else:
        text = f"{group} gave up on it: dead-letter copy in {where}"
    return _event(msg.store_timestamp, msg.commitlog_offset, role, text, msg, group)


def trace_message(broker: Broker, params: Params) -> dict[str, object]:
    key = check_id(p.text(params, "key", required=True) or "")
    topic = p.topic(params)
    limit = p.integer(params, "limit", DEFAULT_RECORDS, minimum=1) or DEFAULT_RECORDS
    limit = min(limit, p.MAX_LIMIT)
    scan = p.integer(params, "scan", DEFAULT_SCAN, minimum=0)
    assert scan is not None
    ordered, more = _records(broker, key, _topics_to_search(broker, topic), limit)
    roles = {m.commitlog_offset: role_of(m) for m in ordered}
    events = [_stored_event(m, *roles[m.commitlog_offset]) for m in ordered]
    readables = _readables(broker, ordered, roles)
    scanned, complete = _read_pop_log(broker, readables, scan)
    dead_letters = [m for m in ordered if roles[m.commitlog_offset][0] == "dead-letter"]
    for r in readables:
        events.extend(_delivery_events(r))
        done = _done_event(r, dead_letters)
        if done is not None:
            events.append(done)
    events.sort(key=lambda e: (e["time_ms"], e["log_offset"]))
    return {
        "key": key,
        "topic": topic,
        "message_ids": sorted({m.unique_key or m.offset_msg_id for m in ordered}),
        "records": [
            dict(
                p.message_json(m),
                role=roles[m.commitlog_offset][0],
                group=roles[m.commitlog_offset][1],
            )
            for m in ordered
        ],
        "groups": _group_summaries(readables, ordered, roles),
        "events": events,
        "more": more,
        "pop_log": {"scanned": scanned, "complete": complete},
    }


def _topics_to_search(broker: Broker, topic: str | None) -> list[str]:
    """Every searchable topic; with a topic, it and the topics its copies go to (retry,
    dead-letter, schedule, transactional half)."""
    everywhere = searchable_topics(broker.store)
    if topic is None:
        return everywhere
    return [
        t
        for t in everywhere
        if t == topic
        or is_retry_topic(t)
        or is_dlq_topic(t)
        or t in (SCHEDULE_TOPIC, TRANS_HALF_TOPIC)
    ]


def _records(
    broker: Broker, key: str, topics: list[str], limit: int
) -> tuple[list[MessageExt], bool]:
    """The records the key names and every copy of them (followed by UNIQ_KEY into every
    topic), oldest first, the newest `limit` of them; and whether more matched."""
    find = MessageFinder(broker)
    found, more = find.by_id(key, topics, limit, match=query.KeyMatch.ANY)
    records = {m.commitlog_offset: m for m in found}
    # every copy of each message found carries its UNIQ_KEY: follow it into every topic
    for uk in sorted({m.unique_key for m in found if m.unique_key and m.unique_key != key}):
        copies, cut = find.by_id(uk, topics, limit)
        more = more or cut
        for m in copies:
            records.setdefault(m.commitlog_offset, m)
    ordered = sorted(records.values(), key=lambda m: (m.store_timestamp, m.commitlog_offset))
    if len(ordered) > limit:
        ordered, more = ordered[-limit:], True
    return ordered, more


def _readables(
    broker: Broker, ordered: list[MessageExt], roles: dict[int, tuple[str, str | None]]
) -> list[_Readable]:
    """Which group reads which record (the original: every group with offsets on its
    topic; a retry, reconsume or replayed copy: its group), with the group's committed
    offset there and whether it is in flight now."""
    groups = sorted(c.group for c in broker.groups())
    readables: list[_Readable] = []
    for m in ordered:
        role, group = roles[m.commitlog_offset]
        if role == "original" or (role == "replayed" and group is None):
            readers = [g for g in groups if broker.offsets_of(g, m.topic)]
        elif role in ("retry", "reconsume", "replayed") and group is not None:
            readers = [group]
        else:
            readers = []
        for g in readers:
            committed = broker.query_offset(g, m.topic, m.queue_id)
            leased = any(
                f.queue_id == m.queue_id and f.queue_offset == m.queue_offset
                for f in broker.in_flight(g, m.topic)
            )
            readables.append(_Readable(m, g, committed, leased))
    return readables


def _delivery_events(r: _Readable) -> list[dict[str, object]]:
    """A group's deliveries of a record, its hand-backs and its renewals (from the
    invisible-time log)."""
    events: list[dict[str, object]] = []
    for at, attempt, until, seq in r.deliveries:
        events.append(
            _event(
                at,
                seq,
                "delivered",
                f"delivered to {r.group} (attempt {attempt}, invisible until {p.iso_ms(until)})",
                r.msg,
                r.group,
                attempt=attempt,
            )
        )
    for at, attempt, until, before, seq in r.changes:
        if until < before:
            events.append(
                _event(
                    at,
                    seq,
                    "handed-back",
                    f"{r.group} handed it back "
                    f"(attempt {attempt} failed): redelivery from "
                    f"{p.iso_ms(until)}",
                    r.msg,
                    r.group,
                    attempt=attempt,
                )
            )
        else:
            events.append(
                _event(
                    at,
                    seq,
                    "extended",
                    f"{r.group} extended its invisible time to {p.iso_ms(until)}",
                    r.msg,
                    r.group,
                    attempt=attempt,
                )
            )
    return events


def _done_event(r: _Readable, dead_letters: list[MessageExt]) -> dict[str, object] | None:
    """When the group was done with the record, and how (`r.done_how`): acknowledged,
    dead-lettered (a dead-letter copy of the group stored between its last delivery and
    done), or skipped (never delivered); None while it is not done."""
    if r.done is None:
        return None
    done_ms, done_seq = r.done
    last = max((d[3] for d in r.deliveries), default=None)  # by log order
    r.done_how = "skipped" if last is None else "acknowledged"
    # a dead-letter copy of this group written between its last delivery and done
    if last is not None and any(
        d.topic == DLQ_GROUP_TOPIC_PREFIX + r.group and last < d.commitlog_offset < done_seq
        for d in dead_letters
    ):
        r.done_how = "dead-lettered"
    text = {
        "acknowledged": f"acknowledged by {r.group}",
        "dead-lettered": f"{r.group} gave up on it (dead-lettered)",
        "skipped": f"skipped by {r.group} (filtered by tag, or before the group's start)",
    }[r.done_how]
    return _event(done_ms, done_seq, r.done_how, text, r.msg, r.group)


def _read_pop_log(broker: Broker, readables: list[_Readable], scan: int) -> tuple[int, bool]:
    """Deliveries and completions of `readables` from the invisible-time log; returns
    (entries read, whether nothing in between was left unread).

    The log is read from each readable record's store time on (an operator's copy may come
    days after the original), at most `scan` entries from each start, never twice."""
    if not readables or scan <= 0:
        return 0, not readables
    store = broker.store
    # revive-log records do not wake the dispatcher (`PopJournal._log`): index the latest
    store.wait_dispatched(timeout_s=5.0)
    by_place: dict[tuple[str, str, int, int], _Readable] = {
        (r.group, r.msg.topic, r.msg.queue_id, r.msg.queue_offset): r for r in readables
    }
    wanted = {(g, t) for g, t, _q, _o in by_place}
    low = store.get_min_offset_in_queue(REVIVE_TOPIC, 0)
    end = store.get_max_offset_in_queue(REVIVE_TOPIC, 0)
    starts = sorted(
        {
            max(
                low,
                store.get_offset_in_queue_by_time(
                    REVIVE_TOPIC, 0, r.msg.store_timestamp - _SLACK_MS
                ),
            )
            for r in readables
        }
    )
    scanned, read_to, complete = 0, low, True
    for i, start in enumerate(starts):
        offset = max(start, read_to)
        stop = min(end, offset + scan)
        while offset < stop:
            got = store.get_messages(
                _ADMIN_GROUP, REVIVE_TOPIC, 0, offset, min(_READ_BATCH, stop - offset)
            )
            if not got.messages:
                if got.next_begin_offset <= offset:
                    break
                offset = got.next_begin_offset
                continue
            for entry in got.messages:
                offset = entry.queue_offset + 1
                scanned += 1
                _read_entry(entry, wanted, by_place)
        read_to = offset
        following = starts[i + 1] if i + 1 < len(starts) else end
        complete = complete and read_to >= following
    return scanned, complete


def _read_entry(
    entry: MessageExt,
    wanted: set[tuple[str, str]],
    by_place: dict[tuple[str, str, int, int], _Readable],
) -> None:
    try:
        record = json.loads(entry.body)
        group, topic, ops = record["g"], record["t"], record["ops"]
    except (ValueError, KeyError, TypeError):
        return
    if (group, topic) in wanted:
        try:
            ops = unpack_leases(ops)
        except (ValueError, TypeError):
            return
        for op in ops:
            _apply(op, group, topic, entry.store_timestamp, entry.commitlog_offset, by_place)


def _apply(
    op: list[Any],
    group: str,
    topic: str,
    at: int,
    seq: int,
    by_place: dict[tuple[str, str, int, int], _Readable],
) -> None:
    if not op or op[0] not in ("L", "D"):
        return
    qid = int(op[1])
    if op[0] == "L":
        r = by_place.get((group, topic, qid, int(op[2])))
        if r is None:
            return
        attempt, until = int(op[3]), int(op[4])
        if r.lease is not None and r.lease[0] == attempt and r.done is None:
            r.changes.append((at, attempt, until, r.lease[1], seq))  # nack or renewal
        else:
            r.deliveries.append((at, attempt, until, seq))
            r.done = None  # delivered again after being done: not done any more
        r.lease = (attempt, until)
        return
    lo, hi = int(op[2]), int(op[3])
    for (g, t, q, o), r in by_place.items():
        if g == group and t == topic and q == qid and lo <= o < hi and r.done is None:
            r.done = (at, seq)


CONSUMED_BY_OFFSET = "consumed (offset past it)"


def _state(last: _Readable | None, dead: list[MessageExt]) -> str:
    """What the group did with the last record it reads (an operator's or a retry copy
    after the original): acknowledged, dead-lettered, in flight, ..."""
    if last is None:
        return "dead-lettered" if dead else "not read by this group"
    # a dead-letter copy stored after the record: given up (a pull consumer's send-back)
    dead_after = any(m.store_timestamp >= last.msg.store_timestamp for m in dead)
    past = last.committed > last.msg.queue_offset
    if last.in_flight:
        return "in flight"
    if last.done_how == "acknowledged":
        return "acknowledged"
    if last.done_how == "dead-lettered" or (dead_after and last.done_how is None):
        return "dead-lettered"
    if last.done_how == "skipped":
        return "skipped"
    if last.deliveries:
        # an invisible-time group's offset passes a record only once it is done with it;
        # its completion may lie past the part of the log that was read
        return "acknowledged" if past else "delivered, not acknowledged (will be redelivered)"
    # no delivery trace: a pull consumer, or a group that started after the record
    return CONSUMED_BY_OFFSET if past else "not delivered yet"


def _group_summaries(
    readables: list[_Readable], ordered: list[MessageExt], roles: dict[int, tuple[str, str | None]]
) -> list[dict[str, object]]:
    names = sorted(
        {r.group for r in readables} | {g for role, g in roles.values() if g is not None}
    )
    out = []
    for g in names:
        mine = sorted(
            (r for r in readables if r.group == g),
            key=lambda r: (r.msg.store_timestamp, r.msg.commitlog_offset),
        )
        copies = [m for m in ordered if roles[m.commitlog_offset][1] == g]
        dead = [m for m in copies if roles[m.commitlog_offset][0] == "dead-letter"]
        sendbacks = [m for m in copies if roles[m.commitlog_offset][0] == "retry-scheduled"]
        reconsumed = [m for m in copies if roles[m.commitlog_offset][0] == "reconsume"]
        replayed = [m for m in copies if roles[m.commitlog_offset][0] == "replayed"]
        deliveries = sorted(d for r in mine for d in r.deliveries)
        redeliveries = [d for r in mine for d in r.deliveries if d[1] > 1]
        retry_times = sorted([d[0] for d in redeliveries] + [m.store_timestamp for m in sendbacks])
        state = _state(mine[-1] if mine else None, dead)
        out.append(
            {
                "group": g,
                "state": state,
                # no delivery trace (pull): the offset passed it (or the group started later)
                "delivered": bool(deliveries)
                or any(r.committed > r.msg.queue_offset for r in mine),
                "deliveries": len(deliveries),
                "acknowledged": state == "acknowledged",
                "retries": len(retry_times),
                "retry_times": [p.iso_ms(t) for t in retry_times],
                "dead_lettered": bool(dead),
                "dead_lettered_at": [p.iso_ms(m.store_timestamp) for m in dead],
                "reconsumed": len(reconsumed),
                "replayed": len(replayed),
                "records": [
                    {
                        "topic": r.msg.topic,
                        "queue_id": r.msg.queue_id,
                        "queue_offset": r.msg.queue_offset,
                        "offset_msg_id": r.msg.offset_msg_id,
                        "committed_offset": r.committed,
                        "committed_past": r.committed > r.msg.queue_offset,
                        "in_flight": r.in_flight,
                        "deliveries": len(r.deliveries),
                        "done": r.done_how,
                    }
                    for r in mine
                ],
            }
        )
    return out
