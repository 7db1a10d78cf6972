"""The schedule service: moves due messages out of `SCHEDULE_TOPIC_XXXX` to their real topic.

Every message in the schedule topic carries its delivery time in `TIMER_DELIVER_MS`, and the
store's dispatcher writes that time as the consume-queue tag code, so due messages are found
from the queue alone. Queues:

    queue id         holds                                   order of delivery times
    0 .. levels-1    delay level L in queue L-1 (send-back,   non-decreasing (store time +
                     producers' DELAY property)              a constant delay)
    TIMER_QUEUE_ID   producers' TIMER_DELIVER_MS timestamps   any: kept in a heap

A level queue is drained from its head while the head is due. The timer queue is read
once into a heap of (delivery time, queue offset); due entries are delivered and their
offsets recorded until the low-water mark passes them.

Progress lives in `config/delayOffset.json`, written after every pass that moved messages,
every `flush_offset_interval_ms` and at shutdown:

    {"offsetTable": {"<level>": <next queue offset>, ...},
     "timer": {"low": <every offset below is delivered>, "delivered": [<offsets above>]},
     "recalled": [[<queue id>, <queue offset>], ...]}

A producer may recall a scheduled message before it is due (RocketMQ 5 RecallMessage) with
the recall handle returned by its send: `1~<topic>~<queue id>~<queue offset>~<msg id>~<crc>`.
The recall is written to delayOffset.json at once (before the answer), and the service skips
a recalled message instead of moving it.

The delivered message keeps `TIMER_DELIVER_MS` (when it was due) and loses `DELAY`.

Delivery is at-least-once: a crash between a pass's moves and its progress write moves
those messages again on restart (a duplicate the consumer's idempotency absorbs; never a
loss). RocketMQ writes this progress only every few seconds.
"""

from __future__ import annotations

import heapq
import logging
import threading
import zlib
from collections.abc import Callable
from typing import Any

from broker.errors import InvalidArgument
from broker.store.consume_queue import ConsumeQueue
from broker.store.errors import ConfigShapeError
from broker.store.json_config import JsonConfigFile, arr, integer, obj
from broker.store.message import Message, MessageExt
from broker.store.service import ServiceThread
from broker.store.store import MessageStore
from protocol.names import SCHEDULE_TOPIC
from protocol.props import Prop

log = logging.getLogger(__name__)

TIMER_QUEUE_ID = 64  # after the largest possible level queue (64 levels)
_READ_BATCH = 32
# properties that only mean something while the message waits in the schedule topic.
# TIMER_DELIVER_MS stays on the delivered message: it is when the message was due, which
# consumers read as its delivery time (the gRPC `delivery_timestamp`, as the Apache proxy
# reads it too). Outside SCHEDULE_TOPIC_XXXX the store gives it no meaning, and a send of
# the message again treats a past delivery time as "now".
_SCHEDULE_ONLY = (Prop.DELAY,)


class InvalidRecallHandle(InvalidArgument):
    """A recall handle is malformed, for another topic, or its message was already delivered."""

    def __init__(self, handle: str, reason: str) -> None:
        self.handle = handle
        self.reason = reason
        super().__init__(f"recall handle {handle[:80]!r}: {reason}")


def encode_recall_handle(topic: str, queue_id: int, queue_offset: int, msg_id: str) -> str:
    body = f"1~{topic}~{queue_id}~{queue_offset}~{msg_id}"
    return f"{body}~{zlib.crc32(body.encode()):08x}"


def decode_recall_handle(handle: object) -> tuple[str, int, int, str]:
    """(topic, schedule queue id, queue offset, message id); InvalidRecallHandle otherwise."""
    if not isinstance(handle, str) or not handle or len(handle) > 512:
        raise InvalidRecallHandle(repr(handle)[:80], "malformed")
    body, _, crc = handle.rpartition("~")
    parts = body.split("~")
    try:
        if (
            len(crc) != 8
            or int(crc, 16) != zlib.crc32(body.encode())
            or len(parts) != 5
            or parts[0] != "1"
        ):
            raise ValueError
        return parts[1], int(parts[2]), int(parts[3]), parts[4]
    except (ValueError, UnicodeEncodeError):
        raise InvalidRecallHandle(handle, "malformed") from None


def unschedule(msg: MessageExt) -> Message | None:
    """The message as it goes to its real topic; None when it names no real topic."""
    real_topic = msg.properties.get(Prop.REAL_TOPIC)
    raw_qid = msg.properties.get(Prop.REAL_QID, "0")
    if not real_topic:
        return None
    try:
        real_qid = int(raw_qid)
    except ValueError:
        return None
    props = {k: v for k, v in msg.properties.items() if k not in _SCHEDULE_ONLY}
    return Message(
        topic=real_topic,
        body=msg.body,
        queue_id=real_qid,
        flag=msg.flag,
        properties=props,
        sys_flag=msg.sys_flag,
        born_timestamp=msg.born_timestamp,
        born_host=msg.born_host,
        reconsume_times=msg.reconsume_times,
        prepared_tx_offset=msg.prepared_tx_offset,
    )


class ScheduleMessageService(ServiceThread):
    """Delivers due scheduled messages; `do_deliver()` is one pass (tests call it directly)."""

    name = "schedule-message-service"

    def __init__(
        self,
        store: MessageStore,
        levels_ms: tuple[int, ...],
        progress: JsonConfigFile,
        clock: Callable[[], int],
        interval_ms: int,
        before_put: Callable[[Message], None] | None = None,
    ) -> None:
        super().__init__()
        self._store = store
        self._levels = levels_ms
        self._file = progress
        self._clock = clock
        self._interval_s = interval_ms / 1000.0
        self._before_put = before_put
        self._lock = threading.Lock()
        self._offsets: dict[int, int] = {}  # level queue id -> next offset
        self._timer_low = 0
        self._timer_delivered: set[int] = set()
        self._timer_scanned = 0
        self._timer_heap: list[tuple[int, int]] = []
        self._recalled: set[tuple[int, int]] = set()
        self._dirty = False

    # --- persistence
    @staticmethod
    def parse(data: dict[str, Any]) -> tuple[dict[int, int], int, set[int], set[tuple[int, int]]]:
        """(level offsets, timer low, timer delivered, recalled) of a `delayOffset.json`
        document (ConfigShapeError)."""
        offsets = {
            integer(level, "offsetTable key", minimum=1) - 1: integer(
                off, f"offsetTable.{level}", minimum=0
            )
            for level, off in obj(data.get("offsetTable", {}), "offsetTable").items()
        }
        timer = obj(data.get("timer", {}), "timer")
        low = integer(timer.get("low", 0), "timer.low", minimum=0)
        delivered = {
            integer(o, "timer.delivered[]")
            for o in arr(timer.get("delivered", []), "timer.delivered")
        }
        recalled: set[tuple[int, int]] = set()
        for pair in arr(data.get("recalled", []), "recalled"):
            pair = arr(pair, "recalled[]")
            if len(pair) != 2:
                raise ConfigShapeError(f"recalled[]: expected [queueId, offset], got {pair!r:.60}")
            recalled.add(
                (
                    integer(pair[0], "recalled[][0]", minimum=0),
                    integer(pair[1], "recalled[][1]", minimum=0),
                )
            )
        return offsets, low, {o for o in delivered if o >= low}, recalled

    def load(self) -> None:
        parsed = self._file.load(self.parse)
        offsets, low, delivered, recalled = parsed or ({}, 0, set(), set())
        with self._lock:
            self._offsets = offsets
            self._timer_low = low
            self._timer_delivered = delivered
            self._timer_scanned = self._timer_low
            self._timer_heap = []
            self._recalled = recalled
            self._dirty = False

    def _document_locked(self) -> dict[str, object]:
        return {
            "offsetTable": {str(q + 1): o for q, o in sorted(self._offsets.items())},
            "timer": {"low": self._timer_low, "delivered": sorted(self._timer_delivered)},
            "recalled": [
                [q, o] for q, o in sorted(self._recalled) if not self._delivered_locked(q, o)
            ],
        }

    def persist(self, force: bool = False) -> bool:
        with self._lock:
            if not (self._dirty or force):
                return False
            data = self._document_locked()
            self._dirty = False
        self._file.save(data)
        return True

    def snapshot(self) -> dict[str, object]:
        """The progress in `delayOffset.json`'s shape (a slave's config sync)."""
        with self._lock:
            return self._document_locked()

    def replace(self, data: dict[str, Any]) -> None:
        """Take a master's progress as it is (`snapshot()`'s shape; ConfigShapeError when
        it is not): a slave, whose service does not run, keeps its master's."""
        offsets, low, delivered, recalled = self.parse(data)
        with self._lock:
            if (offsets, low, delivered, recalled) == (
                self._offsets,
                self._timer_low,
                self._timer_delivered,
                self._recalled,
            ):
                return
            self._offsets = offsets
            self._timer_low = low
            self._timer_delivered = delivered
            self._timer_scanned = low
            self._timer_heap = []
            self._recalled = recalled
            self._dirty = True

    def _delivered_locked(self, qid: int, offset: int) -> bool:
        if qid == TIMER_QUEUE_ID:
            return offset < self._timer_low or offset in self._timer_delivered
        return offset < self._offsets.get(qid, 0)

    def recall(self, topic: str, handle: str) -> str:
        """Cancel a scheduled message; returns its message id. Durable before it returns."""
        h_topic, qid, offset, msg_id = decode_recall_handle(handle)
        if h_topic != topic:
            raise InvalidRecallHandle(handle, f"issued for topic {h_topic!r}, not {topic!r}")
        with self._lock:
            if (qid, offset) in self._recalled:
                return msg_id
            if self._delivered_locked(qid, offset):
                raise InvalidRecallHandle(handle, "the message was already delivered")
            msg = self._store.get_message_by_queue_offset(SCHEDULE_TOPIC, qid, offset)
            if msg is None and self._store.wait_dispatched(5.0):  # sent a moment ago
                msg = self._store.get_message_by_queue_offset(SCHEDULE_TOPIC, qid, offset)
            if msg is None or msg.msg_id != msg_id or msg.properties.get(Prop.REAL_TOPIC) != topic:
                raise InvalidRecallHandle(handle, "no such scheduled message")
            self._recalled.add((qid, offset))
            self._dirty = True
        self.persist()
        return msg_id

    def offsets(self) -> dict[int, int]:
        """Delay level -> next schedule-queue offset to deliver (for admin and tests)."""
        with self._lock:
            return {q + 1: o for q, o in self._offsets.items()}

    def next_due_ms(self) -> int | None:
        """When the earliest message still scheduled is due (None: nothing waits): the head
        of each delay level's queue and the earliest of the timer queue. A recalled message
        may be that head: delivering at its time only skips it."""
        due: list[int] = []
        with self._lock:
            for qid in sorted(
                set(range(len(self._levels))) | set(self._store.queue_ids(SCHEDULE_TOPIC))
            ):
                cq = self._store.consume_queues.get(SCHEDULE_TOPIC, qid)
                if cq is None:
                    continue
                if qid == TIMER_QUEUE_ID:
                    self._scan_timer_queue(cq)
                    if self._timer_heap:
                        due.append(self._timer_heap[0][0])
                    continue
                offset = max(self._offsets.get(qid, 0), cq.get_min_offset_in_queue())
                if offset < cq.get_max_offset_in_queue():
                    head = next(iter(cq.iter_units(offset, _READ_BATCH)), None)
                    due.append(head[3] if head is not None else self._clock())
        return min(due, default=None)

    # --- the loop
    def run(self) -> None:
        while not self.stopped:
            try:
                self.do_deliver()
            except Exception:  # keep scheduling; the next pass retries
                log.exception("schedule pass failed")
            self.wait_for_running(self._interval_s)

    def do_deliver(self) -> int:
        """One pass over every schedule queue; returns how many messages were moved."""
        moved = 0
        with self._lock:
            queue_ids = set(range(len(self._levels))) | set(self._store.queue_ids(SCHEDULE_TOPIC))
            for qid in sorted(queue_ids):
                if qid == TIMER_QUEUE_ID:
                    moved += self._deliver_timer_queue()
                else:
                    moved += self._deliver_level_queue(qid)
        if moved:  # progress right after the moves: a crash re-moves one pass at most
            self.persist()
        return moved

    def _deliver_level_queue(self, qid: int) -> int:
        """Move due messages from the head of a level queue. The delivery time is the unit's
        tag code, so a head that is not due costs one 20-byte read, no commitlog access."""
        cq = self._store.consume_queues.get(SCHEDULE_TOPIC, qid)
        if cq is None:
            return 0
        moved = 0
        offset = max(self._offsets.get(qid, 0), cq.get_min_offset_in_queue())
        end = cq.get_max_offset_in_queue()
        now = self._clock()
        while offset < end and not self.stopped:
            units = list(cq.iter_units(offset, _READ_BATCH))
            if not units:
                offset = min(offset + _READ_BATCH, end)  # blank units (recovery filler)
                continue
            blocked = False
            for index, phy, _size, deliver_ms in units:
                if deliver_ms > now:
                    blocked = True
                    break
                if (qid, index) not in self._recalled:
                    msg = self._store.look_message_by_offset(phy)
                    if msg is not None:  # None: cleaned from the commitlog, nothing to move
                        if not self._move(msg):
                            blocked = True
                            break
                        moved += 1
                offset = index + 1
            if blocked:
                break
            offset = max(offset, units[-1][0] + 1)
        if self._offsets.get(qid) != offset:
            self._offsets[qid] = offset
            self._dirty = True
        return moved

    def _deliver_timer_queue(self) -> int:
        cq = self._store.consume_queues.get(SCHEDULE_TOPIC, TIMER_QUEUE_ID)
        if cq is None:
            return 0
        self._scan_timer_queue(cq)
        moved = 0
        now = self._clock()
        while self._timer_heap and self._timer_heap[0][0] <= now and not self.stopped:
            _, qoff = self._timer_heap[0]
            due = self._store.get_message_by_queue_offset(SCHEDULE_TOPIC, TIMER_QUEUE_ID, qoff)
            recalled = (TIMER_QUEUE_ID, qoff) in self._recalled
            if due is not None and not recalled and not self._move(due):
                break
            heapq.heappop(self._timer_heap)
            self._timer_delivered.add(qoff)
            self._dirty = True
            if not recalled:
                moved += 1
        low = max(
            self._timer_low, self._store.get_min_offset_in_queue(SCHEDULE_TOPIC, TIMER_QUEUE_ID)
        )
        while low in self._timer_delivered:
            self._timer_delivered.discard(low)
            low += 1
        self._timer_delivered = {o for o in self._timer_delivered if o >= low}
        if moved or low != self._timer_low:
            self._timer_low = low
            self._dirty = True
        return moved

    def _scan_timer_queue(self, cq: ConsumeQueue) -> None:
        """Units not seen yet go into the heap: (delivery time = tag code, queue offset)."""
        end = cq.get_max_offset_in_queue()
        self._timer_scanned = max(self._timer_scanned, cq.get_min_offset_in_queue())
        while self._timer_scanned < end:
            for index, _phy, _size, deliver_ms in cq.iter_units(
                self._timer_scanned, _READ_BATCH * 32
            ):
                if index not in self._timer_delivered:
                    heapq.heappush(self._timer_heap, (deliver_ms, index))
            self._timer_scanned = min(self._timer_scanned + _READ_BATCH * 32, end)

    def _move(self, msg: MessageExt) -> bool:
        """Put `msg` into its real topic; False when the store refused (retry next pass)."""
        real = unschedule(msg)
        if real is None:
            log.error(
                "scheduled message at commitlog offset %d names no real topic; dropped",
                msg.commitlog_offset,
            )
            return True
        if self._before_put is not None:
            self._before_put(real)
        result = self._store.put_message(real)
        if not result.status.stored:
            log.warning(
                "schedule: moving message %d to %s failed: %s; retrying",
                msg.commitlog_offset,
                real.topic,
                result.status.value,
            )
            return False
        return True
