"""Redelivery: a message handed back goes up the retry ladder or to the dead-letter queue,
and an operator's reconsume delivers a stored message to a group again now.

The copies are built by `broker.sendback`'s rules and stored like any message: a retry copy
waits in `SCHEDULE_TOPIC_XXXX` until `broker.schedule` moves it to `%RETRY%<group>`, a
dead-letter copy goes straight to `%DLQ%<group>`, a reconsumed copy straight to
`%RETRY%<group>` (those topics are created on demand: `Catalog.derived`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping

from broker.catalog import Catalog
from broker.errors import InvalidArgument
from broker.lifecycle import RunState
from broker.parking import ParkedGroups
from broker.produce_engine import stored
from broker.results import SendResult
from broker.sendback import (
    PARKED_MESSAGE_GROUP,
    build_dlq_message,
    build_retry_message,
    original_topic,
    retry_level,
    unschedule_now,
)
from broker.store.message import Message, MessageExt
from broker.store.store import MessageStore
from broker.transaction import look_checked
from protocol.names import retry_topic


class Redelivery:
    """Send-back (retry ladder, DLQ), dead-letter copies, reconsume now."""

    def __init__(
        self,
        store: MessageStore,
        clock: Callable[[], int],
        levels: tuple[int, ...],
        *,
        run: RunState,
        catalog: Catalog,
        parked: ParkedGroups,
    ) -> None:
        self._store = store
        self._clock = clock
        self._levels = levels
        self._run = run
        self._catalog = catalog
        self._parked = parked

    def put_dlq(self, msg: Message) -> None:
        """Store a dead-letter copy (its `%DLQ%<group>` topic created when first needed)."""
        self._catalog.ensure_derived_topic(msg)
        stored(msg.topic, self._store.put_message(msg))

    def consumer_send_back(
        self,
        group: str,
        msg: MessageExt,
        delay_level: int = 0,
        max_reconsume_times: int | None = None,
    ) -> None:
        """Hand a failed message back: next rung of the retry ladder, or the DLQ.

        `delay_level` 0 uses 3 + reconsume times; -1 sends it to the DLQ now.
        """
        self._run.require()
        gcfg = self._catalog.group(group)
        was = look_checked(self._store, msg.commitlog_offset)
        if was is None or was.msg_id != msg.msg_id:
            was = msg  # not (or no longer) in the commitlog: trust the client's copy
        limit = gcfg.retry_max_times if max_reconsume_times is None else max_reconsume_times
        if delay_level < 0 or was.reconsume_times >= limit:
            # an ordered consumer parking the message group says so on its copy
            parked = msg.properties.get(PARKED_MESSAGE_GROUP) if delay_level < 0 else None
            if parked is not None:
                self._parked.park(group, original_topic(was), parked)
            self.put_dlq(build_dlq_message(group, was, parked_group=parked))
            return
        level = retry_level(delay_level, was.reconsume_times, len(self._levels))
        retry_msg = build_retry_message(
            group,
            was,
            level=level,
            delay_ms=self._levels[level - 1],
            now_ms=self._clock(),
            retry_queue_id=self._retry_queue(group),
            max_reconsume_times=limit,
        )
        stored(retry_msg.topic, self._store.put_message(retry_msg))

    def reconsume_directly(
        self,
        group: str,
        commitlog_offset: int,
        *,
        properties: Mapping[str, str] | None = None,
        reconsume_times: int | None = None,
    ) -> SendResult:
        """Admin: deliver one stored message to `group` again, now, through its retry topic
        (any topic's message, e.g. one from the DLQ). Reconsume times are kept unless
        `reconsume_times` says otherwise (a DLQ replay starts the ladder again at 0);
        `properties` are added to the copy (e.g. what operator action made it)."""
        self._run.require()
        self._catalog.group(group)
        was = look_checked(self._store, commitlog_offset)
        if was is None:
            raise InvalidArgument(f"no message at commitlog offset {commitlog_offset}")
        copy = build_retry_message(
            group,
            was,
            level=1,
            delay_ms=0,
            now_ms=self._clock(),
            retry_queue_id=self._retry_queue(group),
            max_reconsume_times=self._catalog.max_delivery_attempts(group) - 1,
        )
        direct = unschedule_now(
            copy,
            reconsume_times=was.reconsume_times if reconsume_times is None else reconsume_times,
        )
        direct.properties.update(properties or {})
        result = stored(direct.topic, self._store.put_message(direct))
        assert result.append is not None
        return SendResult(
            result.status,
            was.msg_id,
            result.append.msg_id,
            direct.topic,
            direct.queue_id,
            result.append.queue_offset,
            result.append.wrote_offset,
        )

    def _retry_queue(self, group: str) -> int:
        """A queue of the group's retry topic, at random (the topic created when first
        needed)."""
        rcfg = self._catalog.derived(retry_topic(group))
        assert rcfg is not None
        return random.randrange(rcfg.write_queue_nums)
