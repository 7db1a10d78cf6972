"""Invisible-time consumption as the broker's calls serve it (RocketMQ 5 "pop"): receive,
ack, change the invisible time, dead-letter now.

`broker.pop.PopPolicy` decides about leases on one topic; this is what a call adds around
it:

- which policy: a master's own, or a slave's acting one while it serves for its dead master
  (`leases`, the `broker.acting.ActingRole`'s choice; a slave refuses otherwise);
- a receive reads the group's retry topic first, when the group's consumers read that one
  topic alone (`_retry_config`), and waits for an arrival up to its long-poll time;
- a message of a parked message group (`broker.parking`) goes to the DLQ instead of the
  consumer (an acting slave holds it back instead: parking is the master's);
- a receipt handle of a retry-topic copy names its lease's topic (`_lease_topic`): the
  client only knows the topic it asked for;
- counts: messages delivered and acknowledged per (group, topic), for `broker.metrics`, and
  when the group last acknowledged in each queue (`ConsumerOffsetManager.touch`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence

from broker.catalog import Catalog
from broker.config import BrokerConfig
from broker.consumers import ConsumerRegistry, tag_set
from broker.errors import BrokerError, InvalidArgument, ReplicaNotServing
from broker.lifecycle import RunState
from broker.long_poll import ArrivalNotifier
from broker.names import validate_group_name, validate_topic_name
from broker.offsets import ConsumerOffsetManager
from broker.parking import ParkedGroups
from broker.pop import PopPolicy, ReceivedEntry, message_group_of
from broker.receipt import SEPARATOR as RECEIPT_SEPARATOR
from broker.receipt import VERSION as RECEIPT_VERSION
from broker.receipt import ReceiptHandle
from broker.topic import TopicConfig
from protocol.names import is_retry_topic, retry_topic
from protocol.stats import KeyedCounter

# messages handed out or acknowledged, per (group, topic)
Counts = KeyedCounter[tuple[str, str]]


def _on_retry_prefix(group: str) -> str:
    """How a receipt handle of a message in the group's retry topic begins."""
    return f"{RECEIPT_VERSION}{RECEIPT_SEPARATOR}{retry_topic(group)}{RECEIPT_SEPARATOR}"


class Receiver:
    """Receive, ack, change invisible duration, forward to the DLQ."""

    def __init__(
        self,
        config: BrokerConfig,
        clock: Callable[[], int],
        *,
        run: RunState,
        catalog: Catalog,
        pop: PopPolicy,
        leases: Callable[[], PopPolicy],
        offsets: ConsumerOffsetManager,
        consumers: ConsumerRegistry,
        parked: ParkedGroups,
        notifier: ArrivalNotifier,
        delivered: Counts,
        acked: Counts,
    ) -> None:
        # read for limits alone: fields a promotion never changes
        self._config = config
        self._clock = clock
        self._run = run
        self._catalog = catalog
        self._pop = pop  # the master's own policy
        self._leases = leases  # the policy a call goes through now
        self._offsets = offsets
        self._consumers = consumers
        self._parked = parked
        self._notifier = notifier
        self._delivered = delivered
        self._acked = acked

    def receive(
        self,
        group: str,
        topic: str,
        max_msgs: int,
        invisible_ms: int,
        tags: Collection[str] | str | None = None,
        *,
        long_poll_ms: int = 0,
        fifo: bool = False,
    ) -> list[ReceivedEntry]:
        """Up to `max_msgs` messages, each hidden from the group for `invisible_ms`; the
        group's retry topic first, when it reads `topic` alone (see `_retry_config`)."""
        self._run.require()
        cfg = self._catalog.readable(group, topic, None)
        if not isinstance(max_msgs, int) or max_msgs < 1:
            raise InvalidArgument(f"max_msgs {max_msgs!r} must be at least 1")
        self._check_invisible(invisible_ms)
        gcfg = self._catalog.group(group)
        fifo = fifo or gcfg.fifo
        tags = tag_set(tags)
        want = min(max_msgs, self._config.max_receive_batch)
        wait_ms = min(max(long_poll_ms, 0), self._config.long_poll_max_ms)
        deadline = time.monotonic() + wait_ms / 1000.0
        queue_ids = list(range(cfg.read_queue_nums))
        retry = self._retry_config(group, topic, fifo)
        pop = self._leases()
        acting = pop is not self._pop
        attempts = gcfg.max_delivery_attempts
        while True:
            version = self._notifier.version(topic)
            # the group's retry topic first (RocketMQ's pop reads it too): copies an operator
            # or the outbox sent to this group alone (reconsume, DLQ replay, resend)
            entries = (
                []
                if retry is None
                else pop.receive(
                    group,
                    retry.name,
                    list(range(retry.read_queue_nums)),
                    want,
                    invisible_ms,
                    tags,
                    fifo=False,
                    max_attempts=attempts,
                )
            )
            if len(entries) < want:
                entries += pop.receive(
                    group,
                    topic,
                    queue_ids,
                    want - len(entries),
                    invisible_ms,
                    tags,
                    fifo=fifo,
                    max_attempts=attempts,
                )
            parked = self._parked.of(group, topic)
            if parked and entries and acting:  # held back: parking is the master's
                entries = [e for e in entries if message_group_of(e.message) not in parked]
            elif parked and entries:
                kept = self._divert_parked(group, topic, entries, parked)
                if len(kept) < len(entries) and not kept:
                    continue  # the parked group's next message may be free now: look again
                entries = kept
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if entries or remaining_ms <= 0 or not self._run.on:
                if entries:
                    self._count(self._delivered, group, topic, [e.receipt_handle for e in entries])
                return entries
            self._notifier.wait({topic: version}, remaining_ms)

    def ack(self, group: str, topic: str, receipt_handle: str) -> None:
        """Done with a received message. Acking the same handle twice is harmless."""
        self._run.require()
        validate_group_name(group)
        validate_topic_name(topic)
        lease_topic = self._lease_topic(group, topic, receipt_handle)
        self._leases().ack(group, lease_topic, receipt_handle)
        self._acked.add((group, lease_topic))
        self._touch(group, [receipt_handle])

    def ack_batch(
        self, group: str, topic: str, receipt_handles: Sequence[str]
    ) -> list[BrokerError | None]:
        """Ack many handles at once (one durable record): per handle None or its error."""
        self._run.require()
        validate_group_name(group)
        validate_topic_name(topic)
        handles = list(receipt_handles)
        retry = retry_topic(group)
        on_retry = _on_retry_prefix(group)
        on = [  # `_lease_topic` of each, its prefix built once
            retry if isinstance(h, str) and h.startswith(on_retry) else topic for h in handles
        ]
        pop = self._leases()
        if all(t == topic for t in on):
            errors: list[BrokerError | None] = list(pop.ack_many(group, topic, handles))
        else:
            errors = [None] * len(handles)
            for lease_topic in set(on):
                at = [i for i, t in enumerate(on) if t == lease_topic]
                for i, error in zip(
                    at,
                    pop.ack_many(group, lease_topic, [handles[i] for i in at]),
                    strict=True,
                ):
                    errors[i] = error
        for lease_topic in set(on):
            done = sum(1 for t, e in zip(on, errors, strict=True) if t == lease_topic and e is None)
            if done:
                self._acked.add((group, lease_topic), done)
        self._touch(group, [h for h, e in zip(handles, errors, strict=True) if e is None])
        return errors

    def change_invisible_duration(
        self, group: str, topic: str, receipt_handle: str, invisible_ms: int
    ) -> str:
        """Hide the message for `invisible_ms` from now; returns the new handle (the old
        one stops working). The delivery attempt does not change; 0 makes the message
        visible again at once (a negative acknowledgement)."""
        self._run.require()
        validate_group_name(group)
        validate_topic_name(topic)
        self._check_invisible(invisible_ms, minimum=0)
        return self._leases().change_invisible_duration(
            group, self._lease_topic(group, topic, receipt_handle), receipt_handle, invisible_ms
        )

    def forward_to_dlq(
        self, group: str, topic: str, receipt_handle: str, *, park: bool = False
    ) -> None:
        """Dead-letter a received message now. With `park` its message group is parked
        first: no later message of it reaches the group until an operator unparks it
        (`unpark_message_group`; see broker.parking). The copy of a message whose group is
        parked says so (`PARKED_MESSAGE_GROUP`)."""
        self._run.require()
        self._catalog.group(group)
        validate_topic_name(topic)

        pop = self._leases()
        if park and pop is not self._pop:
            raise ReplicaNotServing(
                "this broker is a slave serving receives while its master is down: parking "
                "a message group is left to the master"
            )

        def parked(message_group: str) -> bool:
            if park:
                self._parked.park(group, topic, message_group)
                return True
            return message_group in self._parked.of(group, topic)

        pop.forward_to_dlq(
            group, self._lease_topic(group, topic, receipt_handle), receipt_handle, parked=parked
        )
        self._touch(group, [receipt_handle])

    # ------------------------------------------------------------------ the parts
    def _retry_config(self, group: str, topic: str, fifo: bool) -> TopicConfig | None:
        """The group's retry topic, when an invisible-time receive of `topic` reads it too:
        it exists, the group is neither FIFO nor has parked message groups there, and its
        live consumers subscribe to `topic` alone. (One retry topic serves all of a group's
        topics; a group reading several would be handed one topic's copies as another's.)"""
        name = retry_topic(group)
        if fifo or topic == name or self._parked.of(group, topic):
            return None
        cfg = self._catalog.topics.get(name)
        if cfg is None:
            return None
        subscribed = [
            {t for t in c.subscriptions if not is_retry_topic(t)}
            for c in self._consumers.consumers(group)
        ]
        if not subscribed or any(s != {topic} for s in subscribed):
            return None
        return cfg

    def _divert_parked(
        self, group: str, topic: str, entries: list[ReceivedEntry], parked: frozenset[str]
    ) -> list[ReceivedEntry]:
        """Received messages of parked message groups go to the DLQ instead (in order: FIFO
        hands out one message of a group at a time); the rest are returned."""
        kept: list[ReceivedEntry] = []
        for entry in entries:
            if message_group_of(entry.message) not in parked:
                kept.append(entry)
                continue
            self._pop.forward_to_dlq(group, topic, entry.receipt_handle, parked=lambda _mg: True)
        return kept

    def _check_invisible(self, invisible_ms: int, minimum: int = 1) -> None:
        if not isinstance(invisible_ms, int) or not minimum <= invisible_ms <= (
            self._config.max_invisible_ms
        ):
            raise InvalidArgument(
                f"invisible duration {invisible_ms!r} ms must be {minimum}.."
                f"{self._config.max_invisible_ms}"
            )

    def _count(self, counter: Counts, group: str, topic: str, handles: list[str]) -> None:
        """Add received or acknowledged messages to `counter` under the topic each record is
        in: a `%RETRY%<group>` copy counts under the retry topic, as `group show` and the
        retry-depth gauge count it (docs/observability.md)."""
        on_retry = _on_retry_prefix(group)
        retry = sum(1 for h in handles if h.startswith(on_retry))
        if retry:
            counter.add((group, retry_topic(group)), retry)
        if len(handles) > retry:
            counter.add((group, topic), len(handles) - retry)

    @staticmethod
    def _lease_topic(group: str, topic: str, receipt_handle: str) -> str:
        """The topic a receipt handle's lease is on: the group's retry topic for a message
        `receive` took from it (the client only knows the topic it asked for), else `topic`."""
        if isinstance(receipt_handle, str) and receipt_handle.startswith(_on_retry_prefix(group)):
            return retry_topic(group)
        return topic

    def _touch(self, group: str, handles: Sequence[str]) -> None:
        """Record when the group last acknowledged (or dead-lettered) in the queues these
        handles name."""
        now = self._clock()
        for t, q in {(h.topic, h.queue_id) for h in map(ReceiptHandle.decode, handles)}:
            self._offsets.touch(group, t, q, now)
