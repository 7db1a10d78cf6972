"""Invisible-time consumption (RocketMQ 5 "pop"): receive, ack, change invisible duration.

Per (group, topic, queue) the broker keeps a window over the consume queue:

    offset:   low ............................ next ................ max
              | every offset below `low` is     | never handed out   |
              | done (acked, dead-lettered,     |                    |
              | filtered out by tag)            |                    |
              [low, next): each offset is done, leased (in flight until `until`), or
              pending (skipped by a FIFO receive because its message group was busy)

A lease is (attempt, invisible until, nonce, message group). Receive hands out pending and
expired offsets first (attempt + 1), then new ones (attempt 1). An expired lease at the
group's maximum attempts is dead-lettered instead. The group's committed consumer offset
is `low`, so the offset table and the resend worker see pop groups like any other.

Durability: every change is first written as a record to the system topic
`rmq_sys_REVIVE_LOG` through the store (so it is exactly as durable as the messages: fsynced
before the answer under SYNC_FLUSH), then applied in memory. Under SYNC_FLUSH the wait for
the fsync happens after the lock is released, so concurrent receives and acks share group
commits; a change that others already build on is earlier in the log than theirs, so it is
on disk whenever theirs is. A snapshot of the whole state
with the revive-log offset it covers is written to `config/popState.json` periodically and at
shutdown; start-up loads the snapshot and replays the log after it. A record holds a list
of operations on one (group, topic):

    ["I", qid, offset]                                   open the window at offset
    ["L", qid, offset, attempt, until, nonce, msg_group] lease (receive, change invisible)
    ["D", qid, lo, hi]                                    offsets lo..hi-1 are done
    ["N", qid, next]                                      the window reaches `next`
    ["X"]                                                 the topic was deleted: forget it
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import secrets
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from broker.errors import (
    InvalidReceiptHandle,
    ReceiptHandleError,
    ReceiptHandleExpired,
    ResponseCode,
    SendRejected,
)
from broker.names import REVIVE_TOPIC
from broker.receipt import ReceiptHandle
from broker.sendback import build_dlq_message
from broker.store.config import FlushMode
from broker.store.json_config import ConfigShapeError, JsonConfigFile, arr, integer, obj
from broker.store.message import GetMessageStatus, Message, MessageExt, Prop
from broker.store.store import MessageStore

log = logging.getLogger(__name__)

POP_GROUP = "CID_RMQ_SYS_POP"
_REPLAY_BATCH = 256
_READ_BATCH = 32

Op = list[Any]
T = TypeVar("T")


@dataclass(slots=True)
class Lease:
    attempt: int
    until_ms: int
    nonce: int
    message_group: str | None


@dataclass(slots=True)
class QueueWindow:
    low: int
    next: int
    leases: dict[int, Lease] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)

    def compact(self) -> None:
        while self.low < self.next and self.low in self.done:
            self.done.discard(self.low)
            self.low += 1

    def to_json(self) -> dict[str, Any]:
        return {"low": self.low, "next": self.next, "done": sorted(self.done),
                "leases": {str(o): [lz.attempt, lz.until_ms, lz.nonce, lz.message_group]
                           for o, lz in sorted(self.leases.items())}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QueueWindow:
        return cls(low=int(data["low"]), next=int(data["next"]),
                   leases={int(o): Lease(int(v[0]), int(v[1]), int(v[2]), v[3])
                           for o, v in data.get("leases", {}).items()},
                   done={int(o) for o in data.get("done", [])})


@dataclass(frozen=True, slots=True)
class ReceivedEntry:
    """One received message: what to process and the handle to ack it with."""

    message: MessageExt
    receipt_handle: str
    delivery_attempt: int  # 1 on the first delivery
    invisible_until_ms: int


@dataclass(frozen=True, slots=True)
class InFlight:
    """A leased message, for inspection (admin, tests)."""

    queue_id: int
    queue_offset: int
    delivery_attempt: int
    invisible_until_ms: int
    message_group: str | None


def message_group_of(msg: MessageExt) -> str | None:
    return msg.properties.get(Prop.SHARDING_KEY) or None


Windows = dict[tuple[str, str], dict[int, QueueWindow]]


def parse_snapshot(data: dict[str, Any]) -> tuple[Windows, int]:
    """(windows, revive offset) of a pop state document (ConfigShapeError for a bad shape)."""
    state: Windows = {}
    for group, topics in obj(data.get("groups", {}), "groups").items():
        for topic, queues in obj(topics, f"groups.{group}").items():
            windows: dict[int, QueueWindow] = {}
            for q, w in obj(queues, f"groups.{group}.{topic}").items():
                where = f"groups.{group}.{topic}.{q}"
                w = obj(w, where)
                leases = {}
                for o, v in obj(w.get("leases", {}), f"{where}.leases").items():
                    v = arr(v, f"{where}.leases.{o}")
                    if len(v) != 4 or not (v[3] is None or isinstance(v[3], str)):
                        raise ConfigShapeError(f"{where}.leases.{o}: expected "
                                               "[attempt, until, nonce, group or null]")
                    attempt, until, nonce = (integer(x, f"{where}.leases.{o}[]") for x in v[:3])
                    leases[integer(o, f"{where}.leases key", minimum=0)] = Lease(
                        attempt, until, nonce, v[3])
                windows[integer(q, f"{where} key", minimum=0)] = QueueWindow(
                    low=integer(w.get("low"), f"{where}.low", minimum=0),
                    next=integer(w.get("next"), f"{where}.next", minimum=0), leases=leases,
                    done={integer(o, f"{where}.done[]") for o in
                          arr(w.get("done", []), f"{where}.done")})
            state[(group, topic)] = windows
    return state, integer(data.get("reviveOffset", 0), "reviveOffset", minimum=0)


# set by `PopService.deferring` on its thread: record the end instead of waiting
_DEFER = threading.local()


def _done_ranges(done: Collection[tuple[int, int]]) -> list[Op]:
    """`D` operations for a set of (queue id, offset): one per run of consecutive offsets
    (a batch of acks of messages received together is mostly one run: one operation to
    log and apply instead of one per message)."""
    ops: list[Op] = []
    for qid, offset in sorted(done):
        last = ops[-1] if ops else None
        if last is not None and last[1] == qid and last[3] == offset:
            last[3] = offset + 1
        else:
            ops.append(["D", qid, offset, offset + 1])
    return ops


class _Changing:
    """See `PopService._changing`."""

    __slots__ = ("_mark", "_pop")

    def __init__(self, pop: PopService) -> None:
        self._pop = pop
        self._mark = -1

    def __enter__(self) -> None:
        self._pop._lock.acquire()
        self._mark = self._pop._logged_end

    def __exit__(self, *exc: object) -> None:
        pop = self._pop
        end = pop._logged_end
        pop._lock.release()
        if end != self._mark:
            if getattr(_DEFER, "on", False):
                _DEFER.end = max(_DEFER.end, end)
            else:
                pop._durable(end)


class PopService:
    """The invisible-time state of every (group, topic); thread-safe."""

    def __init__(self, store: MessageStore, snapshot: JsonConfigFile, clock: Callable[[], int],
                 *, commit_offset: Callable[[str, str, int, int], None],
                 query_offset: Callable[[str, str, int], int],
                 put_dlq: Callable[[Message], None]) -> None:
        self._store = store
        self._file = snapshot
        self._clock = clock
        self._commit_offset = commit_offset
        self._query_offset = query_offset
        self._put_dlq = put_dlq
        self._lock = threading.RLock()
        self._state: dict[tuple[str, str], dict[int, QueueWindow]] = {}
        self._revive_next = 0
        self._rotation: dict[tuple[str, str], int] = {}
        self._dirty = False
        self._logged_end = -1  # commitlog end of the last revive-log record
        # lease nonces: one random draw (a syscall) per start, then counting up, so every
        # lease this process hands out differs from every other, and from those of earlier
        # runs but by a 2^-61 chance
        self._nonces = itertools.count(secrets.randbits(61))

    # ------------------------------------------------------------------ persistence
    def load(self) -> int:
        """Load the snapshot and replay the revive log after it; returns records replayed."""
        state, revive_offset = self._file.load(parse_snapshot) or ({}, 0)
        with self._lock:
            self._state = state
            offset = max(revive_offset,
                         self._store.get_min_offset_in_queue(REVIVE_TOPIC, 0))
            replayed = 0
            while True:
                result = self._store.get_messages(POP_GROUP, REVIVE_TOPIC, 0, offset,
                                                  _REPLAY_BATCH)
                for msg in result.messages:
                    record = json.loads(msg.body)
                    self._apply(record["g"], record["t"], record["ops"])
                    offset = msg.queue_offset + 1
                    replayed += 1
                if not result.messages:
                    break
            # a snapshot ahead of a shortened log (tail lost): new records go at the log's end
            self._revive_next = min(offset, self._store.get_max_offset_in_queue(REVIVE_TOPIC, 0))
            for (group, topic), queues in self._state.items():
                for qid, window in queues.items():
                    self._clamp(group, topic, qid, window)
                    self._commit_offset(group, topic, qid, window.low)
            self._dirty = True
        self.persist()
        return replayed

    def _clamp(self, group: str, topic: str, qid: int, window: QueueWindow) -> None:
        """A window past the queue's end (the store lost its tail in a power cut under
        async flush) is cut back, so messages written at those offsets again are delivered
        instead of being taken for ones already handed out."""
        end = self._store.get_max_offset_in_queue(topic, qid)
        if window.next <= end:
            return
        log.warning("pop window %s/%s/%d reaches %d but the queue ends at %d; cut back",
                    group, topic, qid, window.next, end)
        window.next = end
        window.low = min(window.low, end)
        window.leases = {o: lz for o, lz in window.leases.items() if o < end}
        window.done = {o for o in window.done if o < end}

    def persist(self, force: bool = False) -> bool:
        with self._lock:
            if not (self._dirty or force):
                return False
            groups: dict[str, dict[str, dict[str, Any]]] = {}
            for (group, topic), queues in sorted(self._state.items()):
                groups.setdefault(group, {})[topic] = {
                    str(q): w.to_json() for q, w in sorted(queues.items())}
            data = {"reviveOffset": self._revive_next, "groups": groups}
            self._dirty = False
        self._file.save(data)
        return True

    def _log(self, group: str, topic: str, ops: list[Op]) -> None:
        """Write one record to the revive log; SendRejected when the store refuses it."""
        body = json.dumps({"g": group, "t": topic, "ops": ops}, separators=(",", ":"))
        # no flush wait under the lock: `_changing` waits once the lock is released
        result = self._store.put_messages([Message(topic=REVIVE_TOPIC, body=body.encode())],
                                          wait=False)[0]
        if not result.status.stored or result.append is None:
            raise SendRejected(REVIVE_TOPIC, result.status.value,
                               ResponseCode.SERVICE_NOT_AVAILABLE)
        self._revive_next = result.append.queue_offset + 1
        self._logged_end = result.append.wrote_offset + result.append.wrote_bytes
        self._dirty = True

    def _changing(self) -> _Changing:
        """`with self._changing():` the lock, and after releasing it, under SYNC_FLUSH, the
        wait for the fsync of what was logged meanwhile: the caller answers only once its
        records are on disk, while others change state (and share the fsync) meanwhile."""
        return _Changing(self)

    def deferring(self, call: Callable[[], T]) -> tuple[T, int]:
        """Run `call` (on this thread) without the SYNC_FLUSH wait of the changes it makes:
        (its result, the commitlog end their records reach, -1 when it logged none). The
        caller must wait for that end (`MessageStore.when_flushed`) before it answers."""
        _DEFER.on, _DEFER.end = True, -1
        try:
            result = call()
        finally:
            _DEFER.on = False
        return result, _DEFER.end

    def _durable(self, end: int) -> None:
        if self._store.config.flush_mode is not FlushMode.SYNC_FLUSH:
            return  # nothing to wait for (and no Event to build per call)
        done = threading.Event()
        if self._store.when_flushed(end, lambda ok: done.set()):
            done.wait()

    def _apply(self, group: str, topic: str, ops: Sequence[Op]) -> None:
        if ops and ops[0][0] == "X":  # the topic was deleted: forget the group's windows
            self._state.pop((group, topic), None)
            return
        queues = self._state.setdefault((group, topic), {})
        touched: set[int] = set()
        for op in ops:
            kind, qid = op[0], int(op[1])
            touched.add(qid)
            if kind == "I":
                queues[qid] = QueueWindow(low=int(op[2]), next=int(op[2]))
                continue
            window = queues.get(qid)
            if window is None:  # defensive: a window always opens with "I"
                window = queues[qid] = QueueWindow(low=0, next=0)
            if kind == "L":
                offset = int(op[2])
                window.leases[offset] = Lease(int(op[3]), int(op[4]), int(op[5]), op[6])
                window.done.discard(offset)
                window.next = max(window.next, offset + 1)
            elif kind == "D":
                lo, hi = int(op[2]), int(op[3])
                for offset in range(max(lo, window.low), hi):
                    window.leases.pop(offset, None)
                    window.done.add(offset)
                window.next = max(window.next, hi)
            elif kind == "N":
                window.next = max(window.next, int(op[2]))
            window.compact()
        for qid in touched:
            self._commit_offset(group, topic, qid, queues[qid].low)

    def _commit(self, group: str, topic: str, ops: list[Op]) -> None:
        """Log then apply; the in-memory state changes only when the record is stored."""
        if not ops:
            return
        self._log(group, topic, ops)
        self._apply(group, topic, ops)

    # ------------------------------------------------------------------ receive
    def _initial_offset(self, group: str, topic: str, qid: int) -> int:
        committed = self._query_offset(group, topic, qid)
        if committed >= 0:
            return committed
        # RocketMQ's pop starts a new group at the queue's start while nothing has been
        # cleaned from it, else at its end
        min_offset = self._store.get_min_offset_in_queue(topic, qid)
        if min_offset == 0:
            return 0
        return self._store.get_max_offset_in_queue(topic, qid)

    def receive(self, group: str, topic: str, queue_ids: Sequence[int], max_msgs: int,
                invisible_ms: int, tags: Collection[str] | None, *, fifo: bool,
                max_attempts: int) -> list[ReceivedEntry]:
        with self._changing():
            key = (group, topic)
            start = self._rotation.get(key, 0)
            self._rotation[key] = start + 1
            order = [queue_ids[(start + i) % len(queue_ids)] for i in range(len(queue_ids))]
            entries: list[ReceivedEntry] = []
            for qid in order:
                if len(entries) >= max_msgs:
                    break
                entries.extend(self._receive_queue(group, topic, qid, max_msgs - len(entries),
                                                   invisible_ms, tags, fifo, max_attempts))
            return entries

    def _receive_queue(self, group: str, topic: str, qid: int, want: int, invisible_ms: int,
                       tags: Collection[str] | None, fifo: bool,
                       max_attempts: int) -> list[ReceivedEntry]:
        queues = self._state.setdefault((group, topic), {})
        ops: list[Op] = []
        window = queues.get(qid)
        if window is None:
            start = self._initial_offset(group, topic, qid)
            ops.append(["I", qid, start])
            window = QueueWindow(low=start, next=start)
        now = self._clock()
        until = now + invisible_ms
        picked: list[tuple[MessageExt, int, int]] = []  # message, attempt, nonce
        busy: set[str] = set()
        if fifo:
            busy = {lz.message_group for lz in window.leases.values()
                    if lz.until_ms > now and lz.message_group}

        nonces = self._nonces

        def take(msg: MessageExt, attempt: int) -> None:
            nonce = next(nonces)
            group_key = message_group_of(msg)
            ops.append(["L", qid, msg.queue_offset, attempt, until, nonce, group_key])
            picked.append((msg, attempt, nonce))
            if fifo and group_key:
                busy.add(group_key)

        # 1. pending and expired offsets inside the window, oldest first
        for offset in range(window.low, window.next):
            if len(picked) >= want:
                break
            if offset in window.done:
                continue
            lease = window.leases.get(offset)
            if lease is not None and lease.until_ms > now:
                continue
            msg = self._store.get_message_by_queue_offset(topic, qid, offset)
            if msg is None:  # cleaned from the store: nothing left to deliver
                ops.append(["D", qid, offset, offset + 1])
                continue
            group_key = message_group_of(msg)
            if fifo and group_key in busy:
                continue
            attempt = lease.attempt + 1 if lease is not None else 1
            if attempt > max_attempts:
                self._dead_letter(group, msg, attempt - 1)
                ops.append(["D", qid, offset, offset + 1])
                continue
            take(msg, attempt)
        # 2. new offsets
        offset = window.next
        while len(picked) < want:
            result = self._store.get_messages(group, topic, qid, offset, _READ_BATCH, tags)
            if result.status is GetMessageStatus.OFFSET_TOO_SMALL:
                ops.append(["D", qid, offset, result.min_offset])
                offset = result.min_offset
                continue
            stop = False
            for msg in result.messages:
                if msg.queue_offset > offset:  # units between were filtered out by tag
                    ops.append(["D", qid, offset, msg.queue_offset])
                if len(picked) >= want:
                    offset = msg.queue_offset
                    stop = True
                    break
                if fifo and message_group_of(msg) in busy:
                    ops.append(["N", qid, msg.queue_offset + 1])  # pending
                else:
                    take(msg, 1)
                offset = msg.queue_offset + 1
            if stop:
                break
            if result.next_begin_offset > offset:
                ops.append(["D", qid, offset, result.next_begin_offset])
                offset = result.next_begin_offset
            if not result.messages and result.next_begin_offset <= offset:
                break
        if not ops:
            return []
        self._commit(group, topic, ops)
        out: list[ReceivedEntry] = []
        for msg, attempt, nonce in picked:
            handle = ReceiptHandle(topic, qid, msg.queue_offset, nonce, until, attempt)
            shown = msg if msg.reconsume_times == attempt - 1 else replace(
                msg, reconsume_times=attempt - 1)
            out.append(ReceivedEntry(shown, handle.encode(), attempt, until))
        return out

    def _dead_letter(self, group: str, msg: MessageExt, reconsumed: int,
                     parked_group: str | None = None) -> None:
        self._put_dlq(build_dlq_message(group, replace(msg, reconsume_times=reconsumed),
                                        parked_group=parked_group))

    # ------------------------------------------------------------------ ack & co
    def _lease_of(self, group: str, topic: str, handle: str,
                  allow_done: bool) -> tuple[ReceiptHandle, QueueWindow, Lease | None]:
        parsed = ReceiptHandle.decode(handle)
        if parsed.topic != topic:
            raise InvalidReceiptHandle(handle, f"issued for topic {parsed.topic!r}, not {topic!r}")
        window = self._state.get((group, topic), {}).get(parsed.queue_id)
        if window is None or parsed.queue_offset >= window.next:
            raise InvalidReceiptHandle(handle, f"no message was received by group {group!r}")
        lease = window.leases.get(parsed.queue_offset)
        if lease is None:
            if allow_done and (parsed.queue_offset < window.low
                               or parsed.queue_offset in window.done):
                return parsed, window, None  # already acknowledged: acks are idempotent
            raise InvalidReceiptHandle(handle, "the message is not in flight")
        if lease.nonce != parsed.nonce:
            raise InvalidReceiptHandle(handle, "superseded by a newer receipt handle")
        if lease.until_ms <= self._clock():
            raise ReceiptHandleExpired(handle, "the invisible time has ended")
        return parsed, window, lease

    def ack(self, group: str, topic: str, handle: str) -> None:
        with self._changing():
            parsed, _, lease = self._lease_of(group, topic, handle, allow_done=True)
            if lease is None:
                return
            self._commit(group, topic, [["D", parsed.queue_id, parsed.queue_offset,
                                         parsed.queue_offset + 1]])

    def ack_many(self, group: str, topic: str,
                 handles: Sequence[str]) -> list[ReceiptHandleError | None]:
        """Ack several handles with one revive-log record; per handle None or its error."""
        with self._changing():
            out: list[ReceiptHandleError | None] = []
            done: set[tuple[int, int]] = set()  # (queue id, offset) of each live lease
            for handle in handles:
                try:
                    parsed, _, lease = self._lease_of(group, topic, handle, allow_done=True)
                except ReceiptHandleError as exc:
                    out.append(exc)
                    continue
                out.append(None)
                if lease is not None:
                    done.add((parsed.queue_id, parsed.queue_offset))
            self._commit(group, topic, _done_ranges(done))
            return out

    def change_invisible_duration(self, group: str, topic: str, handle: str,
                                  invisible_ms: int) -> str:
        with self._changing():
            parsed, _, lease = self._lease_of(group, topic, handle, allow_done=False)
            assert lease is not None
            nonce = next(self._nonces)
            until = self._clock() + invisible_ms
            self._commit(group, topic, [["L", parsed.queue_id, parsed.queue_offset,
                                         lease.attempt, until, nonce, lease.message_group]])
            return ReceiptHandle(topic, parsed.queue_id, parsed.queue_offset, nonce, until,
                                 lease.attempt).encode()

    def forward_to_dlq(self, group: str, topic: str, handle: str,
                       parked: Callable[[str], bool] | None = None) -> None:
        """Dead-letter a leased message now. `parked(message_group)` is asked first for a
        message of a message group: True stamps the copy as parked (see broker.parking)."""
        with self._changing():
            parsed, _, lease = self._lease_of(group, topic, handle, allow_done=False)
            assert lease is not None
            msg = self._store.get_message_by_queue_offset(topic, parsed.queue_id,
                                                          parsed.queue_offset)
            if msg is not None:
                message_group = message_group_of(msg)
                stamp = (message_group if parked is not None and message_group is not None
                         and parked(message_group) else None)
                self._dead_letter(group, msg, lease.attempt - 1, stamp)
            self._commit(group, topic, [["D", parsed.queue_id, parsed.queue_offset,
                                         parsed.queue_offset + 1]])

    # ------------------------------------------------------------------ revive sweep
    def revive(self, max_attempts_of: Callable[[str], int]) -> tuple[int, list[str]]:
        """Dead-letter expired leases at their last attempt; returns (count, topics with
        expired leases, whose parked receivers should wake)."""
        dead = 0
        wake: set[str] = set()
        with self._changing():
            now = self._clock()
            for (group, topic), queues in list(self._state.items()):
                limit = max_attempts_of(group)
                ops: list[Op] = []
                for qid, window in queues.items():
                    for offset, lease in sorted(window.leases.items()):
                        if lease.until_ms > now:
                            continue
                        wake.add(topic)
                        if lease.attempt < limit:
                            continue
                        msg = self._store.get_message_by_queue_offset(topic, qid, offset)
                        if msg is not None:
                            self._dead_letter(group, msg, lease.attempt - 1)
                        ops.append(["D", qid, offset, offset + 1])
                        dead += 1
                self._commit(group, topic, ops)
        return dead, sorted(wake)

    def forget_topic(self, topic: str) -> None:
        """Drop every group's window on a deleted topic (durably: a recreated topic's
        offsets start again at 0 and must not be taken for ones already handed out)."""
        with self._changing():
            for group, t in [k for k in self._state if k[1] == topic]:
                self._commit(group, t, [["X"]])

    # ------------------------------------------------------------------ inspection
    def in_flight(self, group: str, topic: str) -> list[InFlight]:
        with self._lock:
            out = [InFlight(qid, off, lz.attempt, lz.until_ms, lz.message_group)
                   for qid, w in self._state.get((group, topic), {}).items()
                   for off, lz in w.leases.items()]
        return sorted(out, key=lambda f: (f.queue_id, f.queue_offset))

    def windows(self, group: str, topic: str) -> dict[int, QueueWindow]:
        with self._lock:
            return copy.deepcopy(self._state.get((group, topic), {}))
