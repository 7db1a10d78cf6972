"""The invisible-time journal: the durable state of every (group, topic) receiving by lease.

Per (group, topic, queue) the broker keeps a window over the consume queue:

    offset:   low ............................ next ................ max
              | every offset below `low` is     | never handed out   |
              | done (acked, dead-lettered,     |                    |
              | filtered out by tag)            |                    |
              [low, next): each offset is done, leased (in flight until `until`), or
              pending (skipped by a FIFO receive because its message group was busy)

A lease is (attempt, invisible until, nonce, message group). The group's committed consumer
offset is `low`, so the offset table and the resend worker see pop groups like any other.
What receive, ack and the revive sweep decide is `broker.pop`'s (`PopPolicy`, built on this
class); this module records it.

Durability: every change is first written as a record to the system topic
`rmq_sys_REVIVE_LOG` through the store (so it is exactly as durable as the messages: fsynced
before the answer under SYNC_FLUSH), then applied in memory. Under SYNC_FLUSH the wait for
the fsync happens after the lock is released, so concurrent receives and acks share group
commits; a change that others already build on is earlier in the log than theirs, so it is
on disk whenever theirs is. A snapshot of the whole state
with the revive-log offset it covers is written to `config/popState.json` periodically and at
shutdown; start-up loads the snapshot and replays the log after it. Replication copies the
revive log to a slave with the rest of the commitlog; a promoted slave replays it the same
way before it hands anything out (`Broker.promote`), so the old master's leases hold there
until they end. A record holds a list
of operations on one (group, topic):

    ["I", qid, offset]                                   open the window at offset
    ["L", qid, offset, attempt, until, nonce, msg_group] lease (receive, change invisible)
    ["M", qid, offset, count, attempt, until, nonce, msg_group]
                                                          `count` leases at offset.. and
                                                          nonce.., one step each: the "L"
                                                          ops of one receive, packed
    ["D", qid, lo, hi]                                    offsets lo..hi-1 are done
    ["N", qid, next]                                      the window reaches `next`
    ["X"]                                                 the topic was deleted: forget it
                                                          (first op of a record; "I" ops may
                                                          follow: an operator's offset reset)
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from broker.errors import ResponseCode, SendRejected
from broker.store.config import FlushMode
from broker.store.errors import ConfigShapeError
from broker.store.json_config import JsonConfigFile, arr, integer, obj
from broker.store.message import Message
from broker.store.store import MessageStore
from protocol.names import REVIVE_TOPIC

log = logging.getLogger(__name__)

POP_GROUP = "CID_RMQ_SYS_POP"
_REPLAY_BATCH = 256

Op = list[Any]
T = TypeVar("T")


@dataclass(slots=True)
class Lease:
    attempt: int
    until_ms: int
    nonce: int
    message_group: str | None


def done_runs(done: set[int]) -> list[int | list[int]]:
    """A window's acked offsets as written: runs of consecutive offsets as `[first, end)`
    pairs, a lone offset as itself. Acks are mostly consecutive, so a window held back by
    one slow message stays a few pairs, not one number per message acked behind it."""
    out: list[int | list[int]] = []
    run_start = run_end = -1
    for o in sorted(done):
        if o == run_end:
            run_end += 1
            continue
        if run_start >= 0:
            out.append([run_start, run_end] if run_end - run_start > 1 else run_start)
        run_start, run_end = o, o + 1
    if run_start >= 0:
        out.append([run_start, run_end] if run_end - run_start > 1 else run_start)
    return out


def parse_done(value: object, where: str, low: int, high: int) -> set[int]:
    """`done` as `done_runs` writes it (a release before it wrote plain offsets: read too);
    ConfigShapeError for anything else, or a run outside the window `[low, high)`."""
    done: set[int] = set()
    for item in arr(value, where):
        if isinstance(item, list):
            if len(item) != 2:
                raise ConfigShapeError(f"{where}: expected an offset or [first, end)")
            first, end = (integer(x, f"{where}[]") for x in item)
            if not low <= first < end <= high:
                raise ConfigShapeError(
                    f"{where}: run [{first}, {end}) is outside the window [{low}, {high})"
                )
            done.update(range(first, end))
        else:
            done.add(integer(item, f"{where}[]"))
    return done


@dataclass(slots=True)
class QueueWindow:
    low: int
    next: int
    leases: dict[int, Lease] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    # no lease ends before this (epoch ms); 0: not known. A lower bound, kept by every
    # lease written and made exact by a walk over the leases, so a receive or a revive
    # sweep looks at the leases only when one can be due (not on every call, which made
    # a receive cost a walk over every message in flight)
    due_floor: int = field(default=0, compare=False, repr=False)

    def lease(
        self, first: int, count: int, attempt: int, until: int, nonce: int, group: str | None
    ) -> None:
        """Lease offsets `[first, first + count)` until `until` (nonces counting up from
        `nonce`), keeping `due_floor` a lower bound."""
        for i in range(count):
            self.leases[first + i] = Lease(attempt, until, nonce + i, group)
            self.done.discard(first + i)
        if until < self.due_floor:
            self.due_floor = until
        self.next = max(self.next, first + count)

    def compact(self) -> None:
        while self.low < self.next and self.low in self.done:
            self.done.discard(self.low)
            self.low += 1

    def to_json(self) -> dict[str, object]:
        return {
            "low": self.low,
            "next": self.next,
            "done": done_runs(self.done),
            "leases": {
                str(o): [lz.attempt, lz.until_ms, lz.nonce, lz.message_group]
                for o, lz in sorted(self.leases.items())
            },
        }


@dataclass(frozen=True, slots=True)
class InFlight:
    """A leased message, for inspection (admin, tests)."""

    queue_id: int
    queue_offset: int
    delivery_attempt: int
    invisible_until_ms: int
    message_group: str | None


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
                        raise ConfigShapeError(
                            f"{where}.leases.{o}: expected [attempt, until, nonce, group or null]"
                        )
                    attempt, until, nonce = (integer(x, f"{where}.leases.{o}[]") for x in v[:3])
                    leases[integer(o, f"{where}.leases key", minimum=0)] = Lease(
                        attempt, until, nonce, v[3]
                    )
                low = integer(w.get("low"), f"{where}.low", minimum=0)
                high = integer(w.get("next"), f"{where}.next", minimum=0)
                windows[integer(q, f"{where} key", minimum=0)] = QueueWindow(
                    low=low,
                    next=high,
                    leases=leases,
                    done=parse_done(w.get("done", []), f"{where}.done", low, high),
                )
            state[(group, topic)] = windows
    return state, integer(data.get("reviveOffset", 0), "reviveOffset", minimum=0)


# set by `PopJournal.deferring` on its thread: record the end instead of waiting
_DEFER = threading.local()


class _Changing:
    """See `PopJournal._changing`."""

    __slots__ = ("_mark", "_pop")

    def __init__(self, pop: PopJournal) -> None:
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


class PopJournal:
    """The windows and leases of every (group, topic), logged before they change;
    thread-safe (one lock, `_changing`)."""

    def __init__(
        self,
        store: MessageStore,
        snapshot: JsonConfigFile,
        clock: Callable[[], int],
        *,
        commit_offset: Callable[[str, str, int, int], None],
    ) -> None:
        self._store = store
        self._file = snapshot
        self._clock = clock
        self._commit_offset = commit_offset
        self._lock = threading.RLock()
        self._state: dict[tuple[str, str], dict[int, QueueWindow]] = {}
        self._revive_next = 0
        self._dirty = False
        self._logged_end = -1  # commitlog end of the last revive-log record

    # ------------------------------------------------------------------ persistence
    def load(self) -> int:
        """Load the snapshot and replay the revive log after it; returns records replayed."""
        state, revive_offset = self._file.load(parse_snapshot) or ({}, 0)
        with self._lock:
            self._state = state
            offset = max(revive_offset, self._store.get_min_offset_in_queue(REVIVE_TOPIC, 0))
            replayed = 0
            while True:
                result = self._store.get_messages(POP_GROUP, REVIVE_TOPIC, 0, offset, _REPLAY_BATCH)
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
        log.warning(
            "pop window %s/%s/%d reaches %d but the queue ends at %d; cut back",
            group,
            topic,
            qid,
            window.next,
            end,
        )
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
                    str(q): w.to_json() for q, w in sorted(queues.items())
                }
            data = {"reviveOffset": self._revive_next, "groups": groups}
            self._dirty = False
        self._file.save(data)
        return True

    def _log(self, group: str, topic: str, ops: list[Op]) -> None:
        """Write one record to the revive log; SendRejected when the store refuses it."""
        body = json.dumps({"g": group, "t": topic, "ops": ops}, separators=(",", ":"))
        # no flush wait under the lock: `_changing` waits once the lock is released. The
        # dispatcher is not woken for it: the log is read through its consume queue only
        # at startup (after recovery dispatched everything) and by the admin trace (which
        # waits for dispatch first); a thread wake per receive and per ack batch cost more
        # server CPU than the rest of the record's write.
        result = self._store.put_messages(
            [Message(topic=REVIVE_TOPIC, body=body.encode())], wait=False, wake=False
        )[0]
        if not result.status.stored or result.append is None:
            raise SendRejected(
                REVIVE_TOPIC, result.status.value, ResponseCode.SERVICE_NOT_AVAILABLE
            )
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
        if ops and ops[0][0] == "X":  # the topic was deleted (or the group's offsets reset
            self._state.pop((group, topic), None)  # and "I" ops follow): forget the windows
            ops = ops[1:]
            if not ops:
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
                window.lease(int(op[2]), 1, int(op[3]), int(op[4]), int(op[5]), op[6])
            elif kind == "M":
                first, count, attempt, until, nonce = (int(v) for v in op[2:7])
                window.lease(first, count, attempt, until, nonce, op[7])
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

    def _commit(self, group: str, topic: str, ops: list[Op], packed: bool = False) -> None:
        """Log then apply; the in-memory state changes only when the record is stored.
        `packed`: the caller built `ops` with `add_op` (nothing left to pack)."""
        if not ops:
            return
        if len(ops) > 2 and not packed:
            ops = pack_leases(ops)
        self._log(group, topic, ops)
        self._apply(group, topic, ops)

    def forget_topic(self, topic: str) -> None:
        """Drop every group's window on a deleted topic (durably: a recreated topic's
        offsets start again at 0 and must not be taken for ones already handed out)."""
        with self._changing():
            for group, t in [k for k in self._state if k[1] == topic]:
                self._commit(group, t, [["X"]])

    def reset_windows(self, group: str, topic: str, offsets: Mapping[int, int]) -> bool:
        """An operator moved the group's offsets on `topic`: its windows there (leases,
        done sets) are replaced, in one record, by windows opening at `offsets` (queue id
        -> offset), which commits them. False (nothing logged) when the group never
        received from `topic` by invisible time."""
        with self._changing():
            if (group, topic) not in self._state:
                return False
            self._commit(
                group, topic, [["X"]] + [["I", int(q), int(o)] for q, o in sorted(offsets.items())]
            )
            return True

    def forget_group(self, group: str) -> None:
        """Drop the group's windows on every topic (the group was deleted), durably."""
        with self._changing():
            for g, t in [k for k in self._state if k[0] == group]:
                self._commit(g, t, [["X"]])

    # ------------------------------------------------------------------ inspection
    def in_flight(self, group: str, topic: str) -> list[InFlight]:
        with self._lock:
            out = [
                InFlight(qid, off, lz.attempt, lz.until_ms, lz.message_group)
                for qid, w in self._state.get((group, topic), {}).items()
                for off, lz in w.leases.items()
            ]
        return sorted(out, key=lambda f: (f.queue_id, f.queue_offset))


def pack_leases(ops: list[Op]) -> list[Op]:
    """The same operations, with each run of "L" ops on consecutive offsets and nonces that
    share a queue, attempt, deadline and message group written as one "M" op: a receive of
    32 messages logs one lease op instead of 32 (a smaller record, a fraction of the JSON)."""
    out: list[Op] = []
    for op in ops:
        add_op(out, op)
    return out


def add_op(ops: list[Op], op: Op) -> None:
    """Append `op` to `ops`, an "L" op joining the run (`pack_leases`) it continues: a
    receive packs its leases as it takes them, not in a second pass."""
    if op[0] == "L" and ops:
        last = ops[-1]
        if (
            last[0] == "L"
            and last[1] == op[1]
            and last[2] + 1 == op[2]
            and last[3:5] == op[3:5]
            and last[5] + 1 == op[5]
            and last[6] == op[6]
        ):
            ops[-1] = ["M", op[1], last[2], 2, *last[3:]]
            return
        if (
            last[0] == "M"
            and last[1] == op[1]
            and last[2] + last[3] == op[2]
            and last[4:6] == op[3:5]
            and last[6] + last[3] == op[5]
            and last[7] == op[6]
        ):
            last[3] += 1
            return
    ops.append(op)


def unpack_leases(ops: Sequence[Op]) -> list[Op]:
    """`pack_leases` undone: every "M" op as the "L" ops it stands for (for readers of the
    revive log that look at leases one by one, like the message trace)."""
    out: list[Op] = []
    for op in ops:
        if op and op[0] == "M":
            qid, first, count, attempt, until, nonce, group = op[1:8]
            out.extend(
                ["L", qid, first + i, attempt, until, nonce + i, group] for i in range(int(count))
            )
        else:
            out.append(op)
    return out
