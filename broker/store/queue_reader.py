"""Reading a consume queue: its units from an offset, their records from the commitlog,
filtered by tag (`MessageStore.get_messages`).

Units are filtered by tag code first, then each message's TAGS is checked exactly (hash
codes collide). A unit that does not point at its record (a damaged queue file) makes the
queue be repaired from the commitlog and the read start over, once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Iterator

from broker.store.codec import tags_string_to_code
from broker.store.commitlog import CommitLog
from broker.store.consume_queue_store import ConsumeQueueStore
from broker.store.message import GetMessageResult, GetMessageStatus, MessageExt

log = logging.getLogger("broker.store.store")

MAX_FILTER_SCAN = 16_000  # consume-queue units one get_messages may inspect
_UNREPAIRABLE_LIMIT = 4096


class QueueReader:
    """Messages of one queue from an offset, by way of its units."""

    def __init__(
        self,
        consume_queues: ConsumeQueueStore,
        commitlog: CommitLog,
        repair_queue: Callable[[str, int], int],
    ) -> None:
        self._consume_queues = consume_queues
        self._commitlog = commitlog
        self._repair_queue = repair_queue
        # units a repair found right but whose record is unreadable (fails its checksum):
        # not repaired again on every read (bounded)
        self._unrepairable: set[tuple[str, int, int]] = set()

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int,
        tags: Collection[str] | None,
        *,
        repair: bool = True,
    ) -> GetMessageResult:
        """Up to `max_msgs` messages from queue offset `offset`, filtered by tags (None,
        empty or containing "*": all)."""
        cq = self._consume_queues.get(topic, queue_id)
        if cq is None:
            return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, [], 0, 0, 0)
        min_off = cq.get_min_offset_in_queue()
        max_off = cq.get_max_offset_in_queue()
        outside = _outside(offset, min_off, max_off)
        if outside is not None:
            return outside
        wanted: frozenset[str] | None = None
        codes: frozenset[int] | None = None
        if tags and "*" not in tags:
            wanted = frozenset(tags)
            codes = frozenset(tags_string_to_code(t) for t in wanted)
        messages: list[MessageExt] = []
        limit = max(1, max_msgs)
        scan = min(MAX_FILTER_SCAN, max(limit, limit * 32 if codes is not None else limit))
        next_offset = offset
        cl_min = self._commitlog.get_min_offset()
        saw_unit = False
        removing = False
        units: Iterable[tuple[int, int, int, int]] = cq.iter_units(offset, scan)
        looked: Iterator[MessageExt | None] | None = None
        if codes is None:  # every unit is read (at most `limit`): their records at once
            units = list(units)
            looked = iter(self._commitlog.look_messages([unit[1] for unit in units]))
        for index, phy, size, tag in units:
            next_offset = index + 1
            saw_unit = True
            if looked is not None:
                msg = next(looked)
            elif codes is not None and tag not in codes:
                continue
            else:
                msg = self._commitlog.look_message(phy)
            if msg is None or not _points_at(msg, index, size, topic, queue_id):
                if phy < cl_min:
                    removing = True
                    continue
                if phy in self._commitlog.reader.quarantined:
                    continue  # damaged, kept, logged at start and on read: no repair helps
                if self._repaired(topic, queue_id, index, phy, repair):
                    return self.get_messages(topic, queue_id, offset, max_msgs, tags, repair=False)
                continue
            if wanted is not None and msg.tags not in wanted:
                continue
            messages.append(msg)
            if len(messages) >= limit:
                break
        else:
            if not saw_unit:
                next_offset = min(offset + scan, max_off)
        if messages:
            status = GetMessageStatus.FOUND
        elif removing:
            status = GetMessageStatus.MESSAGE_WAS_REMOVING
        elif saw_unit:
            status = GetMessageStatus.NO_MATCHED_MESSAGE
        else:
            status = GetMessageStatus.OFFSET_FOUND_NULL
        return GetMessageResult(status, messages, next_offset, min_off, max_off)

    def _repaired(self, topic: str, queue_id: int, index: int, phy: int, repair: bool) -> bool:
        """A unit that does not point at its record: a damaged queue file (or a record
        that fails its checksum, which no repair brings back). True when `repair` and a
        repair of the queue rewrote units; a unit no repair fixed is not repaired again on
        every read."""
        where = (topic, queue_id, index)
        if repair and where not in self._unrepairable:
            log.error(
                "consume queue %s-%d: unit %d points at %d, not at its record: "
                "repairing the queue from the commitlog",
                topic,
                queue_id,
                index,
                phy,
            )
            if self._repair_queue(topic, queue_id):
                return True
        if len(self._unrepairable) >= _UNREPAIRABLE_LIMIT:
            self._unrepairable.clear()
        self._unrepairable.add(where)
        return False


def _outside(offset: int, min_off: int, max_off: int) -> GetMessageResult | None:
    """The answer for an offset outside the queue (or an empty queue); None inside it."""
    if max_off == 0:
        return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, [], 0, 0, 0)
    if offset < min_off:
        return GetMessageResult(GetMessageStatus.OFFSET_TOO_SMALL, [], min_off, min_off, max_off)
    if offset == max_off:
        return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, [], offset, min_off, max_off)
    if offset > max_off:
        return GetMessageResult(
            GetMessageStatus.OFFSET_OVERFLOW_BADLY, [], max_off, min_off, max_off
        )
    return None


def _points_at(msg: MessageExt, index: int, size: int, topic: str, queue_id: int) -> bool:
    """The record is the one the unit names."""
    return (
        msg.queue_offset == index
        and msg.store_size == size
        and msg.queue_id == queue_id
        and msg.topic == topic
    )
