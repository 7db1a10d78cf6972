"""A slave acting for its dead master, for reads (docs/ha.md "Reading from a slave").

While its group's master is down, a slave serves invisible-time receives, acks and changes
of invisible time for its group's queues. Its commitlog must stay its master's byte for
byte, so none of that may be written there:

- `ActingPolicy` is the receive/ack policy (`broker.pop.PopPolicy`) with its journal in
  memory only: no revive-log record, no snapshot. A slave that dies while acting forgets
  its leases (those messages come again); what was acknowledged survives through the
  offsets below.
- Acknowledgements move the group's committed offsets in the slave's own offset table
  (`consumerOffset.json`, persisted like any broker's), and are also kept in an
  `ActingReport` (`config/actingOffsets.json`): per (group, topic, queue) the lowest offset
  not yet acknowledged (`low`) and the offsets acknowledged above it. The slave hands the
  report to its master when the replication link is back (`broker.ha`), and the master
  marks those offsets done in its own pop state, never moving an offset back
  (`PopPolicy.merge_done`). An entry leaves the report once the master's synced offsets
  reach its `low`.
- Dead-lettering needs a write (the copy in `%DLQ%<group>`), so an acting slave defers it:
  a message past its last attempt, or forwarded to the dead-letter queue, is done for its
  consumers at once and recorded in the report (durably, before the call is answered);
  the master, taking the report, writes the dead-letter copy from its own copy of the
  message, then marks it done. Parking a message group is refused (`ReplicaNotServing`).
- `ActingRole` is the switch: the broker asks it at each receive and ack which policy to go
  through (a master's own; the acting one while the server's gate says the master is down;
  else `ReplicaNotServing`), and it keeps the report, hands it over, and merges one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from broker.config_files import POP_STATE_FILE
from broker.errors import ReplicaNotServing
from broker.offsets import ConsumerOffsetManager
from broker.pop import PopPolicy
from broker.pop_journal import Op
from broker.store.errors import ConfigShapeError
from broker.store.json_config import JsonConfigFile, arr, integer, obj
from broker.store.message import Message, MessageExt
from broker.store.store import MessageStore

log = logging.getLogger(__name__)

ACTING_OFFSETS_FILE = "actingOffsets.json"

# (low, offsets acknowledged at or above low) per (group, topic, queue id)
Progress = dict[tuple[str, str, int], tuple[int, frozenset[int]]]
# offsets to dead-letter: offset -> (times reconsumed, parked message group or None)
Dead = dict[tuple[str, str, int], dict[int, tuple[int, str | None]]]


class ActingPolicy(PopPolicy):
    """`PopPolicy` whose journal lives in memory only (nothing reaches the commitlog), and
    whose dead-lettering is deferred to the master (`ActingReport.note_dead`)."""

    report: ActingReport  # set right after construction

    def _log(self, group: str, topic: str, ops: list[Op]) -> None:
        return None  # applied in memory by `_commit`; nothing is written

    def load(self) -> int:
        return 0

    def persist(self, force: bool = False) -> bool:
        return False

    def _dead_letter(
        self, group: str, msg: MessageExt, reconsumed: int, parked_group: str | None = None
    ) -> None:
        # the caller marks the offset done next, under the same lock: recorded first
        self.report.note_dead(
            group, msg.topic, msg.queue_id, msg.queue_offset, reconsumed, parked_group
        )

    def progress(self) -> Progress:
        """Every window's (low, done offsets): what the master must learn."""
        with self._lock:
            return {
                (group, topic, qid): (window.low, frozenset(window.done))
                for (group, topic), queues in self._state.items()
                for qid, window in queues.items()
            }


def refuse_dead_letter(msg: Message) -> None:
    raise ReplicaNotServing("an acting slave does not write dead-letter copies")


def parse_report(data: Mapping[str, Any]) -> tuple[Progress, Dead]:
    """The report's JSON shape (ConfigShapeError when it is not):
    {"groups": {group: {topic: {qid: [low, [done...], [[offset, reconsumed, parked], ...]]}}}}
    (the third element, the offsets to dead-letter, may be left out)."""
    out: Progress = {}
    dead: Dead = {}
    for group, topics in obj(data.get("groups", {}), "groups").items():
        for topic, queues in obj(topics, f"groups.{group}").items():
            for q, v in obj(queues, f"groups.{group}.{topic}").items():
                where = f"groups.{group}.{topic}.{q}"
                v = arr(v, where)
                if len(v) not in (2, 3):
                    raise ConfigShapeError(f"{where}: expected [low, [done], [dead]]")
                low = integer(v[0], f"{where}[0]", minimum=0)
                done = frozenset(integer(o, f"{where}[1][]", minimum=0) for o in arr(v[1], where))
                key = (str(group), str(topic), integer(q, f"{where} key", minimum=0))
                out[key] = (low, done)
                for d in arr(v[2], where) if len(v) == 3 else []:
                    d = arr(d, f"{where}[2][]")
                    if len(d) != 3 or not (d[2] is None or isinstance(d[2], str)):
                        raise ConfigShapeError(f"{where}[2][]: expected [offset, times, group]")
                    offset = integer(d[0], f"{where}[2][]", minimum=0)
                    times = integer(d[1], f"{where}[2][]", minimum=0)
                    dead.setdefault(key, {})[offset] = (times, d[2])
    return out, dead


def report_document(progress: Progress, dead: Dead) -> dict[str, object]:
    groups: dict[str, dict[str, dict[str, Any]]] = {}
    for key in sorted(set(progress) | set(dead)):
        group, topic, qid = key
        low, done = progress.get(key, (0, frozenset()))
        entry: list[Any] = [low, sorted(done)]
        if dead.get(key):
            entry.append([[o, t, g] for o, (t, g) in sorted(dead[key].items())])
        groups.setdefault(group, {}).setdefault(topic, {})[str(qid)] = entry
    return {"groups": groups}


class ActingReport:
    """What a slave acknowledged while acting, until its master has it; thread-safe."""

    def __init__(self, file: JsonConfigFile) -> None:
        self._file = file
        self._lock = threading.Lock()
        self._progress: Progress = {}
        self._dead: Dead = {}
        self._dirty = False

    def load(self) -> None:
        progress, dead = self._file.load(parse_report) or ({}, {})
        with self._lock:
            self._progress, self._dead = progress, dead
            self._dirty = False

    def persist(self, force: bool = False) -> bool:
        with self._lock:
            if not (self._dirty or force):
                return False
            doc = report_document(self._progress, self._dead)
            self._dirty = False
        self._file.save(doc)
        return True

    def note_dead(
        self, group: str, topic: str, qid: int, offset: int, reconsumed: int, parked: str | None
    ) -> None:
        """A message the master must dead-letter; on disk before this returns."""
        with self._lock:
            self._dead.setdefault((group, topic, qid), {})[offset] = (reconsumed, parked)
            self._dirty = True
        self.persist()

    def note_low(self, group: str, topic: str, qid: int, low: int) -> None:
        key = (group, topic, qid)
        with self._lock:
            old_low, done = self._progress.get(key, (-1, frozenset()))
            if low > old_low:
                self._progress[key] = (low, frozenset(o for o in done if o >= low))
                self._dirty = True

    def add(self, progress: Progress) -> None:
        """Fold in an acting policy's windows (the highest low, the union of done sets)."""
        with self._lock:
            for key, (low, done) in progress.items():
                old_low, old_done = self._progress.get(key, (-1, frozenset()))
                top = max(low, old_low)
                merged = frozenset(o for o in done | old_done if o >= top)
                if (top, merged) != (old_low, old_done):
                    self._progress[key] = (top, merged)
                    self._dirty = True

    def lows(self) -> dict[tuple[str, str, int], int]:
        with self._lock:
            return {key: low for key, (low, _) in self._progress.items()}

    def document(self) -> dict[str, object] | None:
        """The report for the master; None when there is nothing to tell."""
        with self._lock:
            if not (self._progress or self._dead):
                return None
            return report_document(self._progress, self._dead)

    def settle(self, master_offset: Mapping[tuple[str, str, int], int]) -> None:
        """Forget the entries the master's committed offsets have reached (its offset at or
        beyond everything the entry acknowledged or dead-lettered: the master marks a
        dead-lettered offset done only once its copy is written)."""
        with self._lock:
            for key in set(self._progress) | set(self._dead):
                low, done = self._progress.get(key, (0, frozenset()))
                top = max(
                    low, max(done, default=-1) + 1, max(self._dead.get(key, ()), default=-1) + 1
                )
                if master_offset.get(key, -1) >= top:
                    self._progress.pop(key, None)
                    self._dead.pop(key, None)
                    self._dirty = True

    def clear(self) -> None:
        with self._lock:
            if self._progress or self._dead:
                self._progress, self._dead = {}, {}
                self._dirty = True


class ActingRole:
    """Which lease policy a receive or ack goes through, and what a slave acknowledged while
    it acted: `leases` starts acting when the gate opens and stops when it closes;
    `acting_report` ends acting for good (the link to the master is back) and hands over
    what the master may not have; a master folds such a report in (`merge_acting_offsets`)."""

    def __init__(
        self,
        store: MessageStore,
        clock: Callable[[], int],
        *,
        pop: PopPolicy,
        offsets: ConsumerOffsetManager,
        report: ActingReport,
        replica: Callable[[], bool],
        has_topic: Callable[[str], bool],
    ) -> None:
        # the server's decision that the master is down, asked at each receive and ack
        self.gate: Callable[[], bool] = lambda: False
        self._store = store
        self._clock = clock
        self._pop = pop  # a master's own policy
        self._offsets = offsets
        self._report = report
        self._replica = replica  # live: a promotion turns it off
        self._has_topic = has_topic
        self._policy: ActingPolicy | None = None  # while acting
        self._lock = threading.Lock()

    @property
    def acting(self) -> bool:
        """A slave serving receives for its dead master right now."""
        return self._policy is not None

    def leases(self) -> PopPolicy:
        """The policy receives and acks go through: a master's own; a slave's acting
        policy while the server says its master is down (`gate`); else refused."""
        if not self._replica():
            return self._pop
        with self._lock:
            if self.gate():
                if self._policy is None:
                    self._policy = ActingPolicy(
                        self._store,
                        self._store.config_file(POP_STATE_FILE),  # never written
                        self._clock,
                        commit_offset=self._commit,
                        query_offset=self._offsets.query,
                        put_dlq=refuse_dead_letter,
                    )
                    self._policy.report = self._report
                    log.warning("acting for the master: serving receives and acks")
                return self._policy
            self._stop()
        raise ReplicaNotServing(
            "this broker is a slave and its master is up: receive from the master of its "
            "broker group"
        )

    def stop(self) -> None:
        """Stop acting (a promotion: the slave serves as the master from now on)."""
        with self._lock:
            self._stop()

    def acting_report(self) -> dict[str, object] | None:
        """A slave's link to its master is back: stop acting, and return what was
        acknowledged while it acted and the master may not have (None: nothing)."""
        self.stop()
        return self._report.document()

    def merge_acting_offsets(self, report: Mapping[str, Any], *, own: bool = False) -> int:
        """A master takes what its slave acknowledged while acting for it: those offsets
        are done here too (never moving an offset back). Returns the offsets newly done.
        `own`: a promoted slave taking its own report (every dead-letter in it is written:
        its offsets already count them done). ConfigShapeError for a malformed report."""
        if self._replica():
            return 0
        progress, dead = parse_report(report)
        by_topic: dict[tuple[str, str], dict[int, tuple[int, frozenset[int]]]] = {}
        for (group, topic, qid), entry in progress.items():
            by_topic.setdefault((group, topic), {})[qid] = entry
        marked = 0
        for (group, topic), queues in sorted(by_topic.items()):
            if not self._has_topic(topic):
                continue  # deleted meanwhile
            to_dlq = {q: dead.get((group, topic, q), {}) for q in queues}
            marked += self._pop.merge_done(group, topic, queues, to_dlq, all_dead=own)
        return marked

    def merge_own_report(self) -> None:
        """A promoted slave takes its own report: what it acknowledged while it acted is
        done here, and the report is empty from now on."""
        report = self._report.document()
        if report is not None:
            self.merge_acting_offsets(report, own=True)
            self._report.clear()
            self._report.persist()

    def with_acting_offsets(self, table: dict[str, Any]) -> dict[str, object]:
        """The master's offset table, with this slave's offsets acknowledged while acting
        where they are higher (the master may not have them yet): a config sync never moves
        them back. The entries the master's offsets have reached are forgotten."""
        lows = self._report.lows()
        if not lows:
            return table
        key = ConsumerOffsetManager.key
        master: dict[tuple[str, str, int], int] = {}
        for group, topic, qid in lows:
            queues = table.get(key(topic, group))
            if isinstance(queues, dict) and isinstance(queues.get(str(qid)), int):
                master[(group, topic, qid)] = int(queues[str(qid)])
        self._report.settle(master)
        merged = {k: dict(v) if isinstance(v, dict) else v for k, v in table.items()}
        for (group, topic, qid), low in self._report.lows().items():
            if master.get((group, topic, qid), -1) < low:
                merged.setdefault(key(topic, group), {})[str(qid)] = low
        return merged

    def _stop(self) -> None:
        policy, self._policy = self._policy, None
        if policy is not None:
            self._report.add(policy.progress())
            self._report.persist()
            log.warning(
                "stopped acting for the master; %d queues acknowledged meanwhile, to report",
                len(self._report.lows()),
            )

    def _commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        if offset > self._offsets.query(group, topic, queue_id):
            self._offsets.commit(group, topic, queue_id, offset)
        self._report.note_low(group, topic, queue_id, offset)
