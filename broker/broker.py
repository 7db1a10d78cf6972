"""The `Broker`: delivery semantics over one `MessageStore`.

One object per broker process; the embedded transport calls it in-process and the gRPC
server wraps it. Every public method validates its input and raises a `BrokerError`
subclass for bad requests (nothing is stored then). `Broker` is the facade: it builds the
store, the tables and the collaborators below, runs the lifecycle (start, shutdown,
maintenance, promotion) and hands each call to the one collaborator whose job it is, most
of them as that collaborator's own bound method (no call in between):

    catalog.py         topics and groups: lookups, creation, retry/DLQ topics on demand
    produce_engine.py  send_message, send_batch, send_batch_pending, send_bodies
    receiver.py        receive, ack, ack_batch, change_invisible_duration, forward_to_dlq
    pull.py            pull_message, commit/query/initial offsets, progress, reset
    redelivery.py      consumer_send_back, reconsume_directly, dead-letter copies
    acting.py          a slave acting for its dead master: which lease policy, its report
    lifecycle.py       the running flag every collaborator checks, the maintenance thread

and the parts they share, each in its own module:

    names.py         topic and group names, system topics
    topic.py         topic table, permissions             subscription.py  groups, retry settings
    offsets.py       consumer offsets                     consumers.py     live consumers
    schedule.py      SCHEDULE_TOPIC_XXXX -> real topics   sendback.py      retry ladder, DLQ
    pop.py           receive/ack policy (invisible time)  pop_journal.py   its windows, revive log
    produce.py       the produce path's pure rules        transaction.py   half messages, checks
    long_poll.py     wake parked waits                    parking.py       parked message groups
    results.py       returned values                      config.py        BrokerConfig, delays
    config_files.py  config/ file names
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, TypeVar

from broker.acting import ACTING_OFFSETS_FILE, ActingReport, ActingRole
from broker.catalog import Catalog
from broker.config import BrokerConfig
from broker.config_files import (
    DELAY_OFFSETS_FILE,
    GROUPS_FILE,
    OFFSETS_FILE,
    POP_STATE_FILE,
    TOPICS_FILE,
)
from broker.consumers import ConsumerRegistry
from broker.errors import InvalidArgument
from broker.lifecycle import MaintenanceService, RunState
from broker.long_poll import ArrivalNotifier
from broker.names import validate_group_name, validate_topic_name, validate_user_topic
from broker.offsets import ConsumerOffsetManager
from broker.parking import PARKED_FILE, ParkedGroups
from broker.pop import PopPolicy, ReceivedEntry
from broker.pop_journal import InFlight
from broker.produce_engine import ProduceEngine
from broker.pull import Puller
from broker.receiver import Receiver
from broker.redelivery import Redelivery
from broker.results import PullResult, SendResult, TopicRoute
from broker.schedule import ScheduleMessageService
from broker.store.config import StoreConfig
from broker.store.message import MessageExt
from broker.store.store import MessageStore
from broker.subscription import SubscriptionGroupConfig, SubscriptionGroupManager
from broker.topic import TopicConfig, TopicConfigManager
from broker.transaction import Checker, TransactionService, transaction_id_of
from protocol.clock import wall_ms
from protocol.names import dlq_topic, retry_topic
from protocol.results import PullStatus
from protocol.stats import KeyedCounter

__all__ = ["Broker", "PullResult", "PullStatus", "ReceivedEntry", "SendResult", "TopicRoute"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class Broker:
    """Topics, groups, produce, pull, send-back, invisible-time receive, transactions.

    Besides the methods below, each of these is its collaborator's method, bound at
    construction (their docstrings are there; an instance attribute, so a test or a
    wrapper replaces one by assigning to it):

    - produce (`ProduceEngine`): `send_message`, `send_batch`, `send_batch_pending`,
      `send_bodies`;
    - topics and groups (`Catalog`): `create_topic`, `create_group`, `route`,
      `max_delivery_attempts`;
    - invisible-time consumption (`Receiver`): `receive`, `ack`, `ack_batch`,
      `change_invisible_duration`, `forward_to_dlq`;
    - the pull model and progress (`Puller`): `pull_message`, `commit_offset`,
      `query_offset`, `initial_offset`, `consumer_progress`, `reset_offsets`;
    - redelivery (`Redelivery`): `consumer_send_back`, `reconsume_directly`;
    - acting for a dead master (`ActingRole`): `acting_report`, `merge_acting_offsets`.
    """

    def __init__(
        self,
        store_config: StoreConfig,
        config: BrokerConfig | None = None,
        *,
        clock: Callable[[], int] | None = None,
        disk_usage: Callable[[Path], float] | None = None,
    ) -> None:
        """`disk_usage` (a partition's used ratio) is the store's seam for tests of a full
        disk; by default the real partition is measured."""
        config = config or BrokerConfig()
        config.validate()
        self.config = config  # replaced by a promotion (`replica` off), nothing else
        self._clock = clock = clock or wall_ms
        self.store = store = (
            MessageStore(store_config, clock=clock)
            if disk_usage is None
            else MessageStore(store_config, clock=clock, disk_usage=disk_usage)
        )
        self._levels = levels = config.delay_levels_ms
        self._run = run = RunState()
        self._lock = threading.Lock()
        self._tables(store, config, clock)
        self._collaborators(store, config, clock, levels, run)
        self._take_api()
        self._maintenance = MaintenanceService(
            self.do_maintenance,
            min(config.pop_revive_interval_ms, config.flush_offset_interval_ms) / 1000,
        )
        self._last_persist = 0
        self._last_revive = 0
        self._notifier_added = False

    def _tables(self, store: MessageStore, config: BrokerConfig, clock: Callable[[], int]) -> None:
        """What the collaborators share: the metadata tables, live consumers, arrivals."""
        self._topics = TopicConfigManager(store.config_file(TOPICS_FILE))
        self._groups = SubscriptionGroupManager(store.config_file(GROUPS_FILE))
        self._offsets = ConsumerOffsetManager(store.config_file(OFFSETS_FILE))
        self._consumers = ConsumerRegistry(clock, config.consumer_expiry_ms)
        self.parked = ParkedGroups(store.config_file(PARKED_FILE))
        self._notifier = ArrivalNotifier()
        # a slave acting for its dead master: what it acknowledged meanwhile (broker.acting)
        self._acting_report = ActingReport(store.config_file(ACTING_OFFSETS_FILE))
        # messages handed out and acknowledged per (group, topic), for broker.metrics
        self.delivered: KeyedCounter[tuple[str, str]] = KeyedCounter()
        self.acked: KeyedCounter[tuple[str, str]] = KeyedCounter()

    def _collaborators(
        self,
        store: MessageStore,
        config: BrokerConfig,
        clock: Callable[[], int],
        levels: tuple[int, ...],
        run: RunState,
    ) -> None:
        """The store's services (delayed delivery, leases, transactions) and the
        collaborators that serve the broker's calls over them."""
        self._catalog = catalog = Catalog(config, self._topics, self._groups)
        self._redelivery = redelivery = Redelivery(
            store, clock, levels, run=run, catalog=catalog, parked=self.parked
        )
        self._schedule = ScheduleMessageService(
            store,
            levels,
            store.config_file(DELAY_OFFSETS_FILE),
            clock,
            config.schedule_interval_ms,
            before_put=catalog.ensure_derived_topic,
        )
        self._pop = pop = PopPolicy(
            store,
            store.config_file(POP_STATE_FILE),
            clock,
            commit_offset=self._offsets.commit,
            query_offset=self._offsets.query,
            put_dlq=redelivery.put_dlq,
        )
        self._tx = TransactionService(
            store,
            clock,
            commit_offset=self._offsets.commit,
            query_offset=self._offsets.query,
            timeout_ms=config.transaction_timeout_ms,
            check_interval_ms=config.transaction_check_interval_ms,
            check_max=config.transaction_check_max,
            pass_interval_ms=min(config.transaction_check_interval_ms, 1_000),
        )
        self._acting = acting = ActingRole(
            store,
            clock,
            pop=pop,
            offsets=self._offsets,
            report=self._acting_report,
            replica=lambda: self.config.replica,
            has_topic=lambda name: self._topics.get(name) is not None,
        )
        self._produce = ProduceEngine(
            config, store, clock, levels, self._tx, run=run, catalog=catalog
        )
        self._receiver = Receiver(
            config,
            clock,
            run=run,
            catalog=catalog,
            pop=pop,
            leases=acting.leases,
            offsets=self._offsets,
            consumers=self._consumers,
            parked=self.parked,
            notifier=self._notifier,
            delivered=self.delivered,
            acked=self.acked,
        )
        self._puller = Puller(
            config,
            store,
            clock,
            run=run,
            catalog=catalog,
            offsets=self._offsets,
            pop=pop,
            notifier=self._notifier,
            delivered=self.delivered,
        )

    def _take_api(self) -> None:
        """The collaborators' methods that are the broker's, unchanged: bound here, so a
        call reaches its collaborator with no call in between."""
        produce, catalog, receiver = self._produce, self._catalog, self._receiver
        puller, redelivery, acting = self._puller, self._redelivery, self._acting
        self.send_message = produce.send_message
        self.send_batch = produce.send_batch
        self.send_batch_pending = produce.send_batch_pending
        self.send_bodies = produce.send_bodies
        self.create_topic = catalog.create_topic
        self.create_group = catalog.create_group
        self.route = catalog.route
        self.max_delivery_attempts = catalog.max_delivery_attempts
        self.receive = receiver.receive
        self.ack = receiver.ack
        self.ack_batch = receiver.ack_batch
        self.change_invisible_duration = receiver.change_invisible_duration
        self.forward_to_dlq = receiver.forward_to_dlq
        self.pull_message = puller.pull_message
        self.commit_offset = puller.commit_offset
        self.query_offset = puller.query_offset
        self.initial_offset = puller.initial_offset
        self.consumer_progress = puller.consumer_progress
        self.reset_offsets = puller.reset_offsets
        self.consumer_send_back = redelivery.consumer_send_back
        self.reconsume_directly = redelivery.reconsume_directly
        self.acting_report = acting.acting_report
        self.merge_acting_offsets = acting.merge_acting_offsets

    # ------------------------------------------------------------------ lifecycle
    @property
    def running(self) -> bool:
        return self._run.on

    def start(self) -> None:
        with self._lock:
            if self._run.on:
                return
            self._topics.load()
            self._groups.load()
            self._offsets.load()
            self._acting_report.load()
            self.store.start()
            if not self._notifier_added:
                self.store.add_dispatcher(self._notifier)
                self._notifier_added = True
            self._notifier.reopen()
            try:  # a refused start leaves the store closed cleanly (no abort file)
                self.store.wait_dispatched(timeout_s=60.0)
                self._schedule.load()
                self._pop.load()
                self._tx.load()
            except BaseException:
                self.store.shutdown()
                raise
            self._last_persist = self._last_revive = self._clock()
            if not self.config.replica:  # a slave's commitlog is its master's alone
                self._schedule.start()
                self._tx.start()
            self._maintenance.start()
            self._run.on = True

    def shutdown(self) -> None:
        with self._lock:
            if not self._run.on:
                return
            self._run.on = False
            self._notifier.close()
            self._maintenance.shutdown()
            self._schedule.shutdown()
            self._tx.shutdown()
            self._persist_all(force=True)
            self.store.shutdown()

    def __enter__(self) -> Broker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _persist_all(self, force: bool = False) -> None:
        self._pop.persist(force)
        self._schedule.persist(force)
        self._offsets.persist(force)
        self._acting_report.persist(force)

    def do_maintenance(self) -> None:
        """One maintenance pass (the background service runs it; tests may call it)."""
        now = self._clock()
        if (
            now - self._last_revive >= self.config.pop_revive_interval_ms
            and not self.config.replica
        ):
            self._last_revive = now
            _, wake = self._pop.revive(self.max_delivery_attempts)
            for topic in wake:
                self._notifier.notify(topic)
            self._consumers.scan_expired()
        if now - self._last_persist >= self.config.flush_offset_interval_ms:
            self._last_persist = now
            self._persist_all()

    def promote(self) -> None:
        """A slave becomes a master (docs/ha.md, promotion): it writes from now on, and
        starts the services that do (delayed delivery, transaction checks, pop revive,
        which `do_maintenance` runs once `replica` is off)."""
        with self._lock:
            if not self.config.replica:
                return
            self._acting.stop()
            self.config = dataclasses.replace(self.config, replica=False)
            if self._run.on:
                # what the master decided reached this log through replication, byte for
                # byte: its leases (the revive log) and its transaction checks (the op
                # log). Taken now, before anything is written here, so a message received
                # on the old master stays invisible until its lease ends, and a half
                # message checked there waits for its next check time (docs/ha.md)
                self.store.wait_dispatched(timeout_s=60.0)
                self._pop.load()
                self._tx.load()
                self._acting.merge_own_report()
                self._last_revive = self._clock()
                self._schedule.start()
                self._tx.start()

    # ------------------------------------------------------------------ topics and groups
    def delete_topic(self, name: str) -> bool:
        validate_user_topic(name)
        return self._forget_topic(name)

    def _forget_topic(self, name: str) -> bool:
        """Delete a topic and forget it everywhere: its leases, its files, the offsets and
        parked message groups on it (a slave's config sync deletes any topic, system ones
        included: the master's table is the whole truth)."""
        deleted = self._topics.delete(name)
        if deleted:
            if self._run.on:
                self._pop.forget_topic(name)
                self.store.delete_topics([name])
            self._offsets.remove_topic(name)
            self.parked.forget_topic(name)
        return deleted

    def get_topic(self, name: str) -> TopicConfig | None:
        return self._topics.get(name)

    def topics(self) -> list[TopicConfig]:
        return self._topics.all()

    def delete_group(self, group: str) -> bool:
        validate_group_name(group)
        if self._run.on:
            self._pop.forget_group(group)
        self._offsets.remove_group(group)
        return self._groups.delete(group)

    def get_group(self, group: str) -> SubscriptionGroupConfig | None:
        return self._groups.get(group)

    def groups(self) -> list[SubscriptionGroupConfig]:
        return self._groups.all()

    def retry_topic(self, group: str) -> str:
        return retry_topic(validate_group_name(group))

    def dlq_topic(self, group: str) -> str:
        return dlq_topic(validate_group_name(group))

    def delay_levels_ms(self) -> list[int]:
        return list(self._levels)

    # ------------------------------------------------------------------ replication
    def config_snapshot(self) -> dict[str, Any]:
        """Topics, groups and committed offsets, JSON-shaped: what a master sends its
        slaves (docs/ha.md, config sync)."""
        return {
            "topics": [c.to_json() for c in self._topics.all()],
            "groups": [c.to_json() for c in self._groups.all()],
            "offsets": self._offsets.snapshot(),
            "delay": self._schedule.snapshot(),
        }

    def apply_config_snapshot(self, snapshot: Mapping[str, Any]) -> None:
        """A slave takes its master's configuration: its topics and groups (created,
        updated, and those the master no longer has deleted), its committed offsets and
        its delay offsets (each table whole). ValueError/KeyError/ConfigShapeError on a
        malformed snapshot, before anything changed for the bad part."""
        if not self.config.replica:
            raise InvalidArgument("only a slave takes its master's configuration")
        topics = [TopicConfig.from_json(t) for t in snapshot.get("topics", [])]
        groups = [SubscriptionGroupConfig.from_json(g) for g in snapshot.get("groups", [])]
        delay = snapshot.get("delay")
        if delay is not None:
            ScheduleMessageService.parse(delay)  # refused before anything changes
        for topic in topics:
            self._topics.put(topic)
        for group in groups:
            self._groups.put(group)
        kept_topics = {t.name for t in topics}
        for cfg in self._topics.all():
            if cfg.name not in kept_topics:
                self._forget_topic(cfg.name)
        kept_groups = {g.group for g in groups}
        for gcfg in self._groups.all():
            if gcfg.group not in kept_groups:
                self.delete_group(gcfg.group)
        offsets = self._acting.with_acting_offsets(dict(snapshot.get("offsets", {})))
        self._offsets.replace(offsets)
        if delay is not None:
            self._schedule.replace(delay)

    # --- a slave acting for its master (broker.acting)
    @property
    def acting_gate(self) -> Callable[[], bool]:
        """The server's decision, asked at each receive and ack of a slave: is its master
        down (then the slave serves them, acting for it)?"""
        return self._acting.gate

    @acting_gate.setter
    def acting_gate(self, gate: Callable[[], bool]) -> None:
        self._acting.gate = gate

    @property
    def acting(self) -> bool:
        """A slave serving receives for its dead master right now."""
        return self._acting.acting

    # ------------------------------------------------------------------ produce
    def recall_message(self, topic: str, recall_handle: str) -> str:
        """Cancel a delayed message before it is due (RocketMQ 5 RecallMessage); returns its
        message id. InvalidRecallHandle when malformed or already delivered."""
        self._run.require()
        validate_user_topic(topic)
        return self._schedule.recall(topic, recall_handle)

    def when_durable(self, end: int, callback: Callable[[bool], None]) -> bool:
        """Under SYNC_FLUSH: `callback(True)` once the commitlog is fsynced past `end`,
        `callback(False)` when the flush timed out or failed (the messages are stored, their
        durability unknown), called on the group-commit thread: keep it short (e.g. hand it
        to an event loop with `call_soon_threadsafe`). False, and no call, when the flush
        mode acknowledges without waiting (ASYNC_FLUSH)."""
        return self.store.when_flushed(end, callback)

    @property
    def sync_flush(self) -> bool:
        """SYNC_FLUSH: sends are acknowledged only once on disk (`when_durable`)."""
        return self.store.commitlog.sync_flush

    def durable_alone(self, end: int) -> bool | None:
        """Under SYNC_FLUSH, for a lone producer: fsync past `end` on the calling thread
        (blocking it for one fsync) when no other flush is waited for and the disk has been
        fast; True once on disk, False when the fsync failed. None, and nothing done, when
        others wait (share their group commit with `when_durable`) or under ASYNC_FLUSH."""
        return self.store.flush_alone(end)

    def deferring_durability(self, call: Callable[[], T]) -> tuple[T, int]:
        """Run `call` (one of `receive`, `ack`, `ack_batch`, `change_invisible_duration`)
        without its SYNC_FLUSH wait for the invisible-time records it writes: (its result,
        the commitlog end of those records, -1 when it wrote none). Answer its caller only
        once `when_durable(end, ...)` reports True: that is how an event loop makes these
        calls without parking a thread on the fsync."""
        return self._pop.deferring(call)

    # ------------------------------------------------------------------ transactions
    def end_transaction(
        self,
        producer_group: str,
        transaction_id: str,
        commitlog_offset: int,
        commit: bool,
        *,
        from_check: bool = False,
    ) -> None:
        """Commit (the real message becomes visible) or roll back a half message."""
        self._run.require()
        validate_group_name(producer_group)
        if not isinstance(commitlog_offset, int) or commitlog_offset < 0:
            raise InvalidArgument(f"commitlog offset {commitlog_offset!r} is not an offset")
        self._tx.end(producer_group, transaction_id, commitlog_offset, commit)
        if from_check:
            log.info(
                "transaction %s resolved by check-back: %s",
                transaction_id,
                "commit" if commit else "rollback",
            )

    def register_transaction_checker(self, producer_group: str, checker: Checker) -> None:
        """The check service calls `checker(half message)` (in a worker thread) for
        transactions left unknown; it answers with `end_transaction(..., from_check=True)`
        using `transaction_id_of(msg)` and `msg.commitlog_offset`."""
        validate_group_name(producer_group)
        self._tx.register_checker(producer_group, checker)

    def check_transactions(self) -> int:
        """Run one check pass now (the service runs them periodically)."""
        return self._tx.do_check()

    @staticmethod
    def transaction_id_of(msg: MessageExt) -> str:
        return transaction_id_of(msg)

    # ------------------------------------------------------------------ delayed delivery
    def deliver_due(self) -> int:
        """Run one schedule pass now (the service runs one every `schedule_interval_ms`)."""
        return self._schedule.do_deliver()

    def schedule_offsets(self) -> dict[int, int]:
        return self._schedule.offsets()

    def next_due_ms(self) -> int | None:
        """When the earliest delayed or retried message still scheduled is due (None:
        nothing is scheduled): what a virtual clock advances to (`reliable.testing`)."""
        return self._schedule.next_due_ms()

    # ------------------------------------------------------------------ offsets
    def offsets_of(self, group: str, topic: str) -> dict[int, int]:
        return self._offsets.table_of(group, topic)

    def consume_times(self, group: str, topic: str) -> dict[int, int]:
        """Per queue of `topic`: when `group` last acknowledged or committed there (ms)."""
        return self._offsets.consume_times(group, topic)

    def persist_offsets(self) -> None:
        """Write consumerOffset.json now (it is also written every 5 s and at shutdown)."""
        self._offsets.persist(force=True)

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self.store.get_min_offset_in_queue(topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self.store.get_max_offset_in_queue(topic, queue_id)

    # ------------------------------------------------------------------ consumers
    def heartbeat(
        self, client_id: str, group: str, subscriptions: Mapping[str, Collection[str] | None]
    ) -> None:
        validate_group_name(group)
        if not isinstance(client_id, str) or not client_id:
            raise InvalidArgument("client id must be a non-empty string")
        for topic in subscriptions:
            validate_topic_name(topic)
        self._consumers.heartbeat(client_id, group, subscriptions)

    def unregister(self, client_id: str, group: str) -> None:
        validate_group_name(group)
        self._consumers.unregister(client_id, group)

    def consumer_ids(self, group: str) -> list[str]:
        validate_group_name(group)
        return self._consumers.consumer_ids(group)

    # ------------------------------------------------------------------ invisible time
    def park_message_group(self, group: str, topic: str, message_group: str) -> bool:
        """Park a message group (an ordered consumer gave up on one of its messages): from
        now on its messages go to `%DLQ%<group>` instead of the group. False if it already
        was parked."""
        validate_group_name(group)
        validate_topic_name(topic)
        return self.parked.park(group, topic, message_group)

    def parked_message_groups(self, group: str | None = None) -> list[dict[str, str]]:
        """Parked message groups (`group`, `topic`, `message_group`), of one group or all."""
        return self.parked.listing(group)

    def unpark_message_group(self, group: str, topic: str, message_group: str) -> bool:
        """An operator's decision: the message group flows to `group` again from its next
        message (the parked ones stay in `%DLQ%<group>` for replay). False if not parked."""
        return self.parked.unpark(group, topic, message_group)

    def in_flight(self, group: str, topic: str) -> list[InFlight]:
        """Messages currently hidden from the group (admin, tests)."""
        return self._pop.in_flight(group, topic)

    def revive(self) -> int:
        """Dead-letter expired messages at their last attempt now; returns how many."""
        dead, wake = self._pop.revive(self.max_delivery_attempts)
        for topic in wake:
            self._notifier.notify(topic)
        return dead
