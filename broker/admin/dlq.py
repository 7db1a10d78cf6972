"""Dead letters of a group: list them, replay them, and the replay audit.

`%DLQ%<group>` (one queue) holds every message the group gave up on, each a copy carrying
`DLQ_ORIGIN_TOPIC` and `DLQ_ORIGIN_MESSAGE_ID` (see `broker.sendback`). An operator who has
fixed the cause replays them:

- to the group's retry topic `%RETRY%<group>` (the default): only that group receives the
  message again (`Broker.reconsume_directly`);
- or, `to_topic`, to the original topic as a new record: every group subscribed to it
  receives it again.

Either copy keeps the client message id (`UNIQ_KEY`), keys, tags and user properties, and
starts the retry ladder again (reconsume times 0, as RocketMQ's DLQ resend does); it says
`OPERATOR_ACTION=dlq-replay`, `OPERATOR=<who>` and `DLQ_REPLAY_OFFSET=<its DLQ queue offset>`.

Audit and idempotence: each replay call appends one JSON line to `config/dlqReplay.jsonl`
in the store (opened with O_APPEND, fsynced before the call answers):

    {"at_ms": ..., "at": "...Z", "run": "<id>", "operator": "...", "group": "...",
     "mode": "retry" | "topic", "replayed": [{"dlq_offset", "msg_id", "topic",
     "queue_id", "queue_offset", "offset_msg_id"}, ...]}

The file is also the ledger: a DLQ record (group, queue offset, message id) named in it is
never replayed again, whoever asks. The line is written after the copies are stored, so a
crash between the two can let a re-run replay those copies once more (the client message
id is kept, so an idempotent consumer still processes it once); a replay is never lost.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from broker.admin import params as p
from broker.admin.messages import OPERATOR, OPERATOR_ACTION
from broker.broker import Broker
from broker.errors import GroupNotFound, InvalidArgument
from broker.names import validate_group_name
from broker.store.message import Message, MessageExt
from protocol.admin import Params
from protocol.clock import wall_ms
from protocol.names import dlq_topic
from protocol.props import Prop

AUDIT_FILE = "dlqReplay.jsonl"
REPLAY_ACTION = "dlq-replay"
DLQ_REPLAY_OFFSET = "DLQ_REPLAY_OFFSET"  # on a replayed copy: its DLQ record's queue offset
MAX_REPLAY_BATCH = 1000  # DLQ records one replay call may name
_DROPPED = (
    Prop.DLQ_ORIGIN_TOPIC,
    Prop.DLQ_ORIGIN_MESSAGE_ID,
    Prop.RECONSUME_TIME,
    Prop.MAX_RECONSUME_TIMES,
    Prop.RETRY_TOPIC,
    Prop.ORIGIN_MESSAGE_ID,
    Prop.ORIGIN_COMMITLOG_OFFSET,
    Prop.REAL_TOPIC,
    Prop.REAL_QID,
    Prop.DELAY,
    Prop.TIMER_DELIVER_MS,
    "PARKED_MESSAGE_GROUP",
)
# one lock per audit file: replays of one store never interleave their check and record
_LOCKS: dict[Path, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _lock_for(path: Path) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(path.resolve(), threading.Lock())


class ReplayLedger:
    """The append-only audit file of one store, and the replayed set it implies."""

    def __init__(self, config_dir: Path) -> None:
        self.path = config_dir / AUDIT_FILE
        self.lock = _lock_for(self.path)

    def entries(self) -> Iterator[dict[str, Any]]:
        """Every complete line, oldest first (a torn last line, from a crash while it was
        written, is skipped)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        for line in raw.split(b"\n"):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except (UnicodeDecodeError, json.JSONDecodeError):
                continue
            if isinstance(entry, dict):
                yield entry

    def replayed(self, group: str) -> dict[tuple[int, str], dict[str, object]]:
        """(DLQ queue offset, message id) -> the audit entry that replayed it."""
        out: dict[tuple[int, str], dict[str, object]] = {}
        for entry in self.entries():
            if entry.get("group") != group:
                continue
            for item in entry.get("replayed", []):
                out.setdefault((int(item["dlq_offset"]), str(item["msg_id"])), entry)
        return out

    def append(self, entry: dict[str, object]) -> None:
        """Append one line durably (O_APPEND, fsync; the directory too when created),
        after ending a torn last line if a crash left one."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        line = (json.dumps(entry, sort_keys=True, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # end a line torn by a crash, so this one parses
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)


def _group(broker: Broker, params: Params) -> str:
    group = p.text(params, "group", required=True)
    assert group is not None
    validate_group_name(group)
    if broker.get_group(group) is None:
        raise GroupNotFound(group)
    return group


def _dead_letter_json(msg: MessageExt, replayed: dict[str, object] | None) -> dict[str, object]:
    props = msg.properties
    return {
        "dlq_offset": msg.queue_offset,
        "msg_id": msg.msg_id,
        "offset_msg_id": msg.offset_msg_id,
        "commitlog_offset": msg.commitlog_offset,
        "origin_topic": props.get(Prop.DLQ_ORIGIN_TOPIC),
        "origin_msg_id": props.get(Prop.DLQ_ORIGIN_MESSAGE_ID),
        "tags": msg.tags,
        "keys": msg.keys,
        "reconsume_times": msg.reconsume_times,
        "store_time_ms": msg.store_timestamp,
        "store_time": p.iso_ms(msg.store_timestamp),
        "body_size": len(msg.body),
        "replayed": None
        if replayed is None
        else {
            "at": replayed.get("at"),
            "run": replayed.get("run"),
            "operator": replayed.get("operator"),
            "mode": replayed.get("mode"),
        },
    }


class DeadLetterOps:
    """`ListDeadLetters`, `ReplayDeadLetters`, `DeadLetterAudit` on one broker."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.ledger = ReplayLedger(broker.store.config.config_dir)

    def _records(self, group: str, start: int) -> Iterator[MessageExt]:
        topic = dlq_topic(group)
        store = self.broker.store
        low = max(start, store.get_min_offset_in_queue(topic, 0))
        for offset in range(low, store.get_max_offset_in_queue(topic, 0)):
            msg = store.get_message_by_queue_offset(topic, 0, offset)
            if msg is not None:
                yield msg

    def list(self, params: Params) -> dict[str, object]:
        """`{group, since_ms?, until_ms?, limit=32, after?, pending_only=false}`: the group's
        dead letters, oldest first, from DLQ queue offset `after` + 1; `next_after` pages on
        when `more`."""
        group = _group(self.broker, params)
        since = p.integer(params, "since_ms")
        until = p.integer(params, "until_ms")
        after = p.integer(params, "after", -1, minimum=-1)
        assert after is not None
        pending_only = p.flag(params, "pending_only")
        limit = p.limit(params)
        topic = dlq_topic(group)
        store = self.broker.store
        low, high = store.get_min_offset_in_queue(topic, 0), store.get_max_offset_in_queue(topic, 0)
        replayed = self.ledger.replayed(group)
        out: list[dict[str, object]] = []
        more = False
        for msg in self._records(group, after + 1):
            if since is not None and msg.store_timestamp < since:
                continue
            if until is not None and msg.store_timestamp > until:
                continue
            done = replayed.get((msg.queue_offset, msg.msg_id))
            if pending_only and done is not None:
                continue
            if len(out) >= limit:
                more = True
                break
            out.append(_dead_letter_json(msg, done))
        held_replayed = sum(1 for (offset, _) in replayed if low <= offset < high)
        return {
            "group": group,
            "dlq_topic": topic,
            "messages": out,
            "more": more,
            "next_after": out[-1]["dlq_offset"] if out else after,
            "depth": high - low,
            "replayed": held_replayed,
            "pending": high - low - held_replayed,
        }

    def replay(self, params: Params) -> dict[str, object]:
        """`{group, offsets: [DLQ queue offsets], to_topic=false, operator, run, dry_run}`:
        replay those dead letters not replayed before; returns what was replayed and what
        was skipped (and why)."""
        group = _group(self.broker, params)
        offsets = params.get("offsets")
        if not isinstance(offsets, list) or not all(
            isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets
        ):
            raise InvalidArgument("offsets must be a list of DLQ queue offsets")
        if len(offsets) > MAX_REPLAY_BATCH:
            raise InvalidArgument(f"at most {MAX_REPLAY_BATCH} offsets per call")
        to_topic = p.flag(params, "to_topic")
        dry_run = p.flag(params, "dry_run")
        operator = p.text(params, "operator") or "unknown"
        run = p.text(params, "run") or "-"
        topic = dlq_topic(group)
        store = self.broker.store
        replayed: list[dict[str, object]] = []
        skipped: list[dict[str, object]] = []
        with self.ledger.lock:
            done = self.ledger.replayed(group)
            for offset in dict.fromkeys(offsets):
                msg = store.get_message_by_queue_offset(topic, 0, offset)
                if msg is None:
                    skipped.append(
                        {
                            "dlq_offset": offset,
                            "msg_id": None,
                            "reason": "no such dead letter (never stored, or expired)",
                        }
                    )
                    continue
                earlier = done.get((offset, msg.msg_id))
                if earlier is not None:
                    skipped.append(
                        {
                            "dlq_offset": offset,
                            "msg_id": msg.msg_id,
                            "reason": f"already replayed at {earlier.get('at')} by "
                            f"{earlier.get('operator')} (run "
                            f"{earlier.get('run')})",
                        }
                    )
                    continue
                if dry_run:
                    replayed.append(
                        {
                            "dlq_offset": offset,
                            "msg_id": msg.msg_id,
                            "topic": self._target(group, msg, to_topic),
                        }
                    )
                    continue
                replayed.append(self._replay_one(group, msg, to_topic, operator))
            now = wall_ms()
            entry = {
                "at_ms": now,
                "at": p.iso_ms(now),
                "run": run,
                "operator": operator,
                "group": group,
                "mode": "topic" if to_topic else "retry",
                "replayed": replayed,
            }
            if replayed and not dry_run:
                self.ledger.append(entry)
        return {
            "group": group,
            "dry_run": dry_run,
            "mode": entry["mode"],
            "run": run,
            "operator": operator,
            "replayed": replayed,
            "skipped": skipped,
        }

    def _target(self, group: str, msg: MessageExt, to_topic: bool) -> str:
        if not to_topic:
            return self.broker.retry_topic(group)
        origin = msg.properties.get(Prop.DLQ_ORIGIN_TOPIC)
        if not origin:
            raise InvalidArgument(f"dead letter {msg.msg_id} does not say its original topic")
        return origin

    def _replay_one(
        self, group: str, msg: MessageExt, to_topic: bool, operator: str
    ) -> dict[str, object]:
        marks = {
            OPERATOR_ACTION: REPLAY_ACTION,
            OPERATOR: operator,
            DLQ_REPLAY_OFFSET: str(msg.queue_offset),
        }
        if not to_topic:
            sent = self.broker.reconsume_directly(
                group, msg.commitlog_offset, properties=marks, reconsume_times=0
            )
        else:
            origin = self._target(group, msg, to_topic)
            route = self.broker.route(origin)
            props = {k: v for k, v in msg.properties.items() if k not in _DROPPED}
            props.update(marks)
            queue = msg.queue_offset % max(route.write_queue_nums, 1)
            sent = self.broker.send_message(
                Message(
                    topic=origin,
                    body=msg.body,
                    queue_id=queue,
                    flag=msg.flag,
                    properties=props,
                    born_timestamp=msg.born_timestamp,
                    born_host=msg.born_host,
                )
            )
        return {
            "dlq_offset": msg.queue_offset,
            "msg_id": msg.msg_id,
            "topic": sent.topic,
            "queue_id": sent.queue_id,
            "queue_offset": sent.queue_offset,
            "offset_msg_id": sent.offset_msg_id,
        }

    def audit(self, params: Params) -> dict[str, object]:
        """`{group?, limit=32}`: the newest replay audit entries, newest first."""
        group = p.text(params, "group")
        limit = p.limit(params)
        entries = [e for e in self.ledger.entries() if group is None or e.get("group") == group]
        entries.reverse()
        return {
            "entries": entries[:limit],
            "more": len(entries) > limit,
            "file": str(self.ledger.path),
        }
