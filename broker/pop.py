"""Invisible-time consumption (RocketMQ 5 "pop"): the receive and ack policy.

Receive hands out pending and expired offsets first (attempt + 1), then new ones (attempt
1); a FIFO receive skips a message whose message group has one in flight. An expired lease
at the group's maximum attempts is dead-lettered instead (on receive, or by the revive
sweep). Ack, change-invisible-duration and forward-to-DLQ check the receipt handle against
the lease it names. Every decision is recorded through `broker.pop_journal.PopJournal`
(the windows, the revive log, the snapshot), which `PopPolicy` is built on.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import NamedTuple

from broker.errors import InvalidReceiptHandle, ReceiptHandleError, ReceiptHandleExpired
from broker.pop_journal import Lease, Op, PopJournal, QueueWindow, add_op
from broker.receipt import ReceiptHandle, handle_prefix, issue_handle
from broker.sendback import build_dlq_message
from broker.store.json_config import JsonConfigFile
from broker.store.message import GetMessageStatus, Message, MessageExt
from broker.store.store import MessageStore
from protocol.props import Prop

_READ_BATCH = 32
_NO_LEASE = 1 << 62  # a `due_floor` beyond any lease's end: none in flight


class ReceivedEntry(NamedTuple):
    """One received message: what to process and the handle to ack it with (a named
    tuple: a receive builds one per message, at a third of a frozen dataclass's cost)."""

    message: MessageExt
    receipt_handle: str
    delivery_attempt: int  # 1 on the first delivery
    invisible_until_ms: int


def message_group_of(msg: MessageExt) -> str | None:
    return msg.properties.get(Prop.SHARDING_KEY) or None


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


class PopPolicy(PopJournal):
    """Receive, ack, change invisible duration, dead-letter; thread-safe."""

    def __init__(
        self,
        store: MessageStore,
        snapshot: JsonConfigFile,
        clock: Callable[[], int],
        *,
        commit_offset: Callable[[str, str, int, int], None],
        query_offset: Callable[[str, str, int], int],
        put_dlq: Callable[[Message], None],
    ) -> None:
        super().__init__(store, snapshot, clock, commit_offset=commit_offset)
        self._query_offset = query_offset
        self._put_dlq = put_dlq
        self._rotation: dict[tuple[str, str], int] = {}
        # lease nonces: one random draw (a syscall) per start, then counting up, so every
        # lease this process hands out differs from every other, and from those of earlier
        # runs but by a 2^-61 chance
        self._nonces = itertools.count(secrets.randbits(61))

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

    def receive(
        self,
        group: str,
        topic: str,
        queue_ids: Sequence[int],
        max_msgs: int,
        invisible_ms: int,
        tags: Collection[str] | None,
        *,
        fifo: bool,
        max_attempts: int,
    ) -> list[ReceivedEntry]:
        with self._changing():
            key = (group, topic)
            start = self._rotation.get(key, 0)
            self._rotation[key] = start + 1
            order = [queue_ids[(start + i) % len(queue_ids)] for i in range(len(queue_ids))]
            entries: list[ReceivedEntry] = []
            for qid in order:
                if len(entries) >= max_msgs:
                    break
                entries.extend(
                    self._receive_queue(
                        group,
                        topic,
                        qid,
                        max_msgs - len(entries),
                        invisible_ms,
                        tags,
                        fifo,
                        max_attempts,
                    )
                )
            return entries

    def _receive_queue(
        self,
        group: str,
        topic: str,
        qid: int,
        want: int,
        invisible_ms: int,
        tags: Collection[str] | None,
        fifo: bool,
        max_attempts: int,
    ) -> list[ReceivedEntry]:
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
            busy = {
                lz.message_group
                for lz in window.leases.values()
                if lz.until_ms > now and lz.message_group
            }

        nonces = self._nonces

        def take(msg: MessageExt, attempt: int) -> None:
            nonce = next(nonces)
            group_key = message_group_of(msg)
            add_op(ops, ["L", qid, msg.queue_offset, attempt, until, nonce, group_key])
            picked.append((msg, attempt, nonce))
            if fifo and group_key:
                busy.add(group_key)

        # 1. pending and expired offsets inside the window, oldest first. An offset there
        # is done, leased, or free (a FIFO message passed over while its group was busy).
        # With none free, only the leases can be due: they are looked at, not every offset
        # acked behind a slow message (a window held back by one lease can span millions);
        # and with none of them due before `due_floor`, not even they are.
        free = window.next - window.low - len(window.done) - len(window.leases)
        offsets: Iterable[int] = ()
        if free:
            offsets = range(window.low, window.next)
        elif window.due_floor <= now and window.leases:
            offsets = sorted(window.leases)
        floor = _NO_LEASE  # the earliest end of the leases passed over, once all are seen
        for offset in offsets:
            if len(picked) >= want:
                break
            if offset in window.done:
                continue
            lease = window.leases.get(offset)
            if lease is not None and lease.until_ms > now:
                if lease.until_ms < floor:
                    floor = lease.until_ms
                continue
            msg = self._store.get_message_by_queue_offset(topic, qid, offset)
            if msg is None:  # cleaned from the store: nothing left to deliver
                ops.append(["D", qid, offset, offset + 1])
                continue
            group_key = message_group_of(msg)
            if fifo and group_key in busy:
                if lease is not None:
                    floor = lease.until_ms  # due, and still due after this receive
                continue
            attempt = lease.attempt + 1 if lease is not None else 1
            if attempt > max_attempts:
                self._dead_letter(group, msg, attempt - 1)
                ops.append(["D", qid, offset, offset + 1])
                continue
            take(msg, attempt)
        else:
            if offsets:  # every lease seen (those taken now are written with a later end)
                window.due_floor = floor
        # 2. new offsets
        offset = window.next
        while len(picked) < want:
            # no more records read (and decoded) than can still be taken
            result = self._store.get_messages(
                group, topic, qid, offset, min(_READ_BATCH, want - len(picked)), tags
            )
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
        self._commit(group, topic, ops, packed=True)
        return self._entries(topic, qid, picked, until)

    @staticmethod
    def _entries(
        topic: str, qid: int, picked: list[tuple[MessageExt, int, int]], until: int
    ) -> list[ReceivedEntry]:
        """What a receive hands out: each message taken, its handle, attempt and lease end."""
        out: list[ReceivedEntry] = []
        prefix = handle_prefix(topic, qid)
        new = tuple.__new__  # a named tuple without its generated __new__ (a Python call)
        for msg, attempt, nonce in picked:
            handle = issue_handle(topic, qid, prefix, msg.queue_offset, nonce, until, attempt)
            shown = (
                msg
                if msg.reconsume_times == attempt - 1
                else replace(msg, reconsume_times=attempt - 1)
            )
            out.append(new(ReceivedEntry, (shown, handle, attempt, until)))
        return out

    def _dead_letter(
        self, group: str, msg: MessageExt, reconsumed: int, parked_group: str | None = None
    ) -> None:
        self._put_dlq(
            build_dlq_message(
                group, replace(msg, reconsume_times=reconsumed), parked_group=parked_group
            )
        )

    # ------------------------------------------------------------------ ack & co
    def _lease_of(
        self, group: str, topic: str, handle: str, allow_done: bool, now: int | None = None
    ) -> tuple[ReceiptHandle, QueueWindow, Lease | None]:
        """The handle's lease (None: already acked, when `allow_done`); `now` is the clock
        read once for a batch of handles."""
        parsed = ReceiptHandle.decode(handle)
        if parsed.topic != topic:
            raise InvalidReceiptHandle(handle, f"issued for topic {parsed.topic!r}, not {topic!r}")
        window = self._state.get((group, topic), {}).get(parsed.queue_id)
        if window is None or parsed.queue_offset >= window.next:
            raise InvalidReceiptHandle(handle, f"no message was received by group {group!r}")
        lease = window.leases.get(parsed.queue_offset)
        if lease is None:
            if allow_done and (
                parsed.queue_offset < window.low or parsed.queue_offset in window.done
            ):
                return parsed, window, None  # already acknowledged: acks are idempotent
            raise InvalidReceiptHandle(handle, "the message is not in flight")
        if lease.nonce != parsed.nonce:
            raise InvalidReceiptHandle(handle, "superseded by a newer receipt handle")
        if lease.until_ms <= (self._clock() if now is None else now):
            raise ReceiptHandleExpired(handle, "the invisible time has ended")
        return parsed, window, lease

    def ack(self, group: str, topic: str, handle: str) -> None:
        with self._changing():
            parsed, _, lease = self._lease_of(group, topic, handle, allow_done=True)
            if lease is None:
                return
            self._commit(
                group, topic, [["D", parsed.queue_id, parsed.queue_offset, parsed.queue_offset + 1]]
            )

    def ack_many(
        self, group: str, topic: str, handles: Sequence[str]
    ) -> list[ReceiptHandleError | None]:
        """Ack several handles with one revive-log record; per handle None or its error."""
        with self._changing():
            out: list[ReceiptHandleError | None] = []
            done: set[tuple[int, int]] = set()  # (queue id, offset) of each live lease
            now = self._clock()
            for handle in handles:
                try:
                    parsed, _, lease = self._lease_of(group, topic, handle, True, now)
                except ReceiptHandleError as exc:
                    out.append(exc)
                    continue
                out.append(None)
                if lease is not None:
                    done.add((parsed.queue_id, parsed.queue_offset))
            self._commit(group, topic, _done_ranges(done))
            return out

    def change_invisible_duration(
        self, group: str, topic: str, handle: str, invisible_ms: int
    ) -> str:
        with self._changing():
            parsed, _, lease = self._lease_of(group, topic, handle, allow_done=False)
            assert lease is not None
            nonce = next(self._nonces)
            until = self._clock() + invisible_ms
            self._commit(
                group,
                topic,
                [
                    [
                        "L",
                        parsed.queue_id,
                        parsed.queue_offset,
                        lease.attempt,
                        until,
                        nonce,
                        lease.message_group,
                    ]
                ],
            )
            return ReceiptHandle(
                topic, parsed.queue_id, parsed.queue_offset, nonce, until, lease.attempt
            ).encode()

    def forward_to_dlq(
        self, group: str, topic: str, handle: str, parked: Callable[[str], bool] | None = None
    ) -> None:
        """Dead-letter a leased message now. `parked(message_group)` is asked first for a
        message of a message group: True stamps the copy as parked (see broker.parking)."""
        with self._changing():
            parsed, _, lease = self._lease_of(group, topic, handle, allow_done=False)
            assert lease is not None
            msg = self._store.get_message_by_queue_offset(
                topic, parsed.queue_id, parsed.queue_offset
            )
            if msg is not None:
                message_group = message_group_of(msg)
                stamp = (
                    message_group
                    if parked is not None and message_group is not None and parked(message_group)
                    else None
                )
                self._dead_letter(group, msg, lease.attempt - 1, stamp)
            self._commit(
                group, topic, [["D", parsed.queue_id, parsed.queue_offset, parsed.queue_offset + 1]]
            )

    # ------------------------------------------------------------------ a slave's report
    def merge_done(
        self,
        group: str,
        topic: str,
        queues: Mapping[int, tuple[int, Collection[int]]],
        dead: Mapping[int, Mapping[int, tuple[int, str | None]]] | None = None,
        *,
        all_dead: bool = False,
    ) -> int:
        """Mark done what a slave acknowledged while it acted for this broker (queue id ->
        (its low, offsets done above it); docs/ha.md "Reading from a slave"): offsets below
        its low and its done offsets become done here too, in one record. Never moves a
        window back: what is done here stays done. `dead` (queue id -> offset -> (times
        reconsumed, parked message group)) are the offsets the slave dead-lettered: each not
        done here yet is dead-lettered from this store's copy first (a crash before the
        record is written dead-letters it again when the report comes again). `all_dead`:
        dead-letter every one of them (a promoted slave taking its own report: its offsets
        already include them). Returns the offsets newly done."""
        with self._changing():
            windows = self._state.get((group, topic), {})
            ops: list[Op] = []
            marked = 0
            for qid, (low, done) in sorted(queues.items()):
                end = self._store.get_max_offset_in_queue(topic, qid)
                low = min(low, end)
                window = windows.get(qid)
                if window is None:
                    base = self._initial_offset(group, topic, qid)
                    opened: list[Op] = [["I", qid, base]]
                    already: Collection[int] = ()
                else:
                    base, opened, already = window.low, [], window.done
                to_dlq = (dead or {}).get(qid, {})
                for offset, (reconsumed, stamp) in sorted(to_dlq.items()):
                    if offset < end and (all_dead or (base <= offset and offset not in already)):
                        msg = self._store.get_message_by_queue_offset(topic, qid, offset)
                        if msg is not None:
                            self._dead_letter(group, msg, reconsumed, stamp)
                queue_ops: list[Op] = []
                if low > base:
                    queue_ops.append(["D", qid, base, low])
                    marked += low - base - sum(1 for o in already if o < low)
                above = {
                    (qid, o)
                    for o in {*done, *to_dlq}
                    if max(base, low) <= o < end and o not in already
                }
                queue_ops += _done_ranges(above)
                marked += len(above)
                if queue_ops:
                    ops += opened + queue_ops
            self._commit(group, topic, ops)
            return marked

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
                    if window.due_floor > now or not window.leases:
                        continue
                    floor = _NO_LEASE  # the earliest end of the leases kept
                    for offset, lease in sorted(window.leases.items()):
                        if lease.until_ms <= now:
                            wake.add(topic)
                            if lease.attempt >= limit:
                                msg = self._store.get_message_by_queue_offset(topic, qid, offset)
                                if msg is not None:
                                    self._dead_letter(group, msg, lease.attempt - 1)
                                ops.append(["D", qid, offset, offset + 1])
                                dead += 1
                                continue
                        floor = min(floor, lease.until_ms)  # a due one: a receive redelivers it
                    window.due_floor = floor
                self._commit(group, topic, ops)
        return dead, sorted(wake)
