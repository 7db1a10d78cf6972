"""The pull model and a group's progress: read a queue from an offset, the offsets a group
commits, where a new group starts, and per queue how far a group has come.

A pull reads the consume queue from the offset the client names and may wait for an arrival
(`suspend_ms`, at most `long_poll_max_ms`); the client commits its own offsets
(`broker.offsets`). The progress report and an admin's reset also see the invisible-time
windows (`broker.pop`), which a receive moves instead of the client.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping

from broker.catalog import Catalog
from broker.config import BrokerConfig
from broker.consumers import tag_set
from broker.errors import InvalidArgument
from broker.lifecycle import RunState
from broker.long_poll import ArrivalNotifier
from broker.names import validate_group_name, validate_topic_name
from broker.offsets import (
    DEFAULT_CONSUME_TIMESTAMP_AGO_MS,
    ConsumeFromWhere,
    ConsumerOffsetManager,
)
from broker.pop import PopPolicy
from broker.results import PULL_STATUS, PullResult, QueueProgress
from broker.store.store import MessageStore
from protocol.names import is_retry_topic
from protocol.results import PullStatus
from protocol.stats import KeyedCounter


class Puller:
    """Pull, commit and query offsets, a new group's start, progress, reset."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        clock: Callable[[], int],
        *,
        run: RunState,
        catalog: Catalog,
        offsets: ConsumerOffsetManager,
        pop: PopPolicy,
        notifier: ArrivalNotifier,
        delivered: KeyedCounter[tuple[str, str]],
    ) -> None:
        # read for limits alone: fields a promotion never changes
        self._config = config
        self._store = store
        self._clock = clock
        self._run = run
        self._catalog = catalog
        self._offsets = offsets
        self._pop = pop
        self._notifier = notifier
        self._delivered = delivered

    def pull_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int = 32,
        tags: Collection[str] | str | None = None,
        *,
        suspend_ms: int = 0,
    ) -> PullResult:
        """Read from `offset`; with `suspend_ms`, wait up to that long for a new message."""
        self._run.require()
        self._catalog.readable(group, topic, queue_id)
        if not isinstance(offset, int) or offset < 0:
            raise InvalidArgument(f"offset {offset!r} must be a non-negative integer")
        if not isinstance(max_msgs, int) or max_msgs < 1:
            raise InvalidArgument(f"max_msgs {max_msgs!r} must be at least 1")
        batch = min(max_msgs, self._config.max_pull_batch)
        tags = tag_set(tags)
        deadline = time.monotonic() + min(max(suspend_ms, 0), self._config.long_poll_max_ms) / 1e3
        while True:
            version = self._notifier.version(topic)
            got = self._store.get_messages(group, topic, queue_id, offset, batch, tags)
            status = PULL_STATUS.get(got.status, PullStatus.NO_NEW_MSG)
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if status is not PullStatus.NO_NEW_MSG or remaining_ms <= 0 or not self._run.on:
                if got.messages:
                    self._delivered.add((group, topic), len(got.messages))
                return PullResult(
                    status, got.messages, got.next_begin_offset, got.min_offset, got.max_offset
                )
            self._notifier.wait({topic: version}, remaining_ms)

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """The group is done with every message of the queue below `offset`."""
        validate_group_name(group)
        validate_topic_name(topic)
        self._offsets.commit(group, topic, queue_id, offset)
        self._offsets.touch(group, topic, queue_id, self._clock())

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, -1 when the group has none for that queue."""
        validate_group_name(group)
        validate_topic_name(topic)
        return self._offsets.query(group, topic, queue_id)

    def initial_offset(
        self,
        group: str,
        topic: str,
        queue_id: int,
        where: ConsumeFromWhere,
        timestamp_ms: int | None = None,
    ) -> int:
        """The committed offset, else where a new group starts (committed right away, so
        every consumer that takes the queue over later starts at the same place)."""
        validate_group_name(group)
        validate_topic_name(topic)
        if not isinstance(where, ConsumeFromWhere):
            raise InvalidArgument(f"unknown consume-from {where!r}")

        def start() -> int:
            if is_retry_topic(topic) or where is ConsumeFromWhere.FIRST_OFFSET:
                return self._store.get_min_offset_in_queue(topic, queue_id)
            if where is ConsumeFromWhere.LAST_OFFSET:
                return self._store.get_max_offset_in_queue(topic, queue_id)
            ts = (
                timestamp_ms
                if timestamp_ms is not None
                else (self._clock() - DEFAULT_CONSUME_TIMESTAMP_AGO_MS)
            )
            return self._store.get_offset_in_queue_by_time(topic, queue_id, ts)

        return self._offsets.commit_if_absent(group, topic, queue_id, start)

    def consumer_progress(self, group: str, topic: str | None = None) -> list[QueueProgress]:
        """Per queue: the queue's end, the group's committed offset, messages in flight.
        Without `topic`: every topic the group has offsets for (its retry topic included)."""
        validate_group_name(group)
        topics = [validate_topic_name(topic)] if topic else self._offsets.topics_of_group(group)
        out: list[QueueProgress] = []
        for t in topics:
            cfg = self._catalog.topics.get(t)
            committed = self._offsets.table_of(group, t)
            queue_ids = set(committed) | set(range(cfg.read_queue_nums if cfg else 0))
            leased: dict[int, int] = {}
            for f in self._pop.in_flight(group, t):
                leased[f.queue_id] = leased.get(f.queue_id, 0) + 1
            out.extend(
                QueueProgress(
                    t,
                    q,
                    self._store.get_max_offset_in_queue(t, q),
                    committed.get(q, -1),
                    leased.get(q, 0),
                )
                for q in sorted(queue_ids)
            )
        return out

    def reset_offsets(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        """Admin: move the group's committed offsets on `topic` (queue id -> offset). The
        group's invisible-time windows there are replaced by ones opening at the new offsets
        (one durable record), so leases handed out before no longer count; offsets are
        written to disk before this returns."""
        validate_group_name(group)
        validate_topic_name(topic)
        if not self._pop.reset_windows(group, topic, offsets):
            for q, offset in offsets.items():
                self._offsets.commit(group, topic, q, offset)
        self._offsets.persist(force=True)
