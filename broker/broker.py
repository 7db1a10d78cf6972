"""The `Broker`: delivery semantics over one `MessageStore`.

One object per broker process; the embedded transport calls it in-process and the gRPC
server wraps it. Every public method validates its input and raises a `BrokerError`
subclass for bad requests (nothing is stored then); the parts live in their own modules:

    names.py         topic and group names, system topics
    topic.py         topic table, permissions             subscription.py  groups, retry settings
    offsets.py       consumer offsets                     consumers.py     live consumers
    schedule.py      SCHEDULE_TOPIC_XXXX -> real topics   sendback.py      retry ladder, DLQ
    pop.py           receive/ack policy (invisible time)  pop_journal.py   its windows, revive log
    produce_engine.py  validate and store messages        produce.py       its pure rules
    transaction.py   half messages, checks                long_poll.py     wake parked waits
    parking.py       parked message groups                results.py       returned values
    config.py        BrokerConfig, the delay ladder       config_files.py  config/ file names

This module is the facade: lifecycle, topics and groups, pull, send-back, consumers and
invisible-time calls. `Broker` is built on `ProduceEngine`, whose methods are its produce
API (`send_message`, `send_batch`, `send_batch_pending`, `send_bodies`).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from broker.acting import (
    ACTING_OFFSETS_FILE,
    ActingPolicy,
    ActingReport,
    parse_report,
    refuse_dead_letter,
)
from broker.config import BrokerConfig
from broker.config_files import (
    DELAY_OFFSETS_FILE,
    GROUPS_FILE,
    OFFSETS_FILE,
    POP_STATE_FILE,
    TOPICS_FILE,
)
from broker.consumers import ConsumerRegistry, tag_set
from broker.errors import (
    BrokerError,
    BrokerNotRunning,
    ConsumeDisabled,
    GroupNotFound,
    InvalidArgument,
    NoPermission,
    ReplicaNotServing,
    TopicNotFound,
)
from broker.long_poll import ArrivalNotifier
from broker.names import validate_group_name, validate_topic_name, validate_user_topic
from broker.offsets import (
    DEFAULT_CONSUME_TIMESTAMP_AGO_MS,
    ConsumeFromWhere,
    ConsumerOffsetManager,
)
from broker.parking import PARKED_FILE, ParkedGroups
from broker.pop import PopPolicy, ReceivedEntry, message_group_of
from broker.pop_journal import InFlight
from broker.produce_engine import ProduceEngine
from broker.receipt import SEPARATOR as RECEIPT_SEPARATOR
from broker.receipt import VERSION as RECEIPT_VERSION
from broker.receipt import ReceiptHandle
from broker.results import (
    PULL_STATUS,
    PullResult,
    QueueProgress,
    SendResult,
    TopicRoute,
)
from broker.schedule import ScheduleMessageService
from broker.sendback import (
    PARKED_MESSAGE_GROUP,
    build_dlq_message,
    build_retry_message,
    original_topic,
    retry_level,
    unschedule_now,
)
from broker.store.config import StoreConfig
from broker.store.message import (
    Message,
    MessageExt,
)
from broker.store.service import ServiceThread
from broker.store.store import MessageStore
from broker.subscription import SubscriptionGroupConfig, SubscriptionGroupManager
from broker.topic import PERM_READ_WRITE, TopicConfig, TopicConfigManager, TopicMessageType
from broker.transaction import Checker, TransactionService, look_checked, transaction_id_of
from protocol.clock import wall_ms
from protocol.limits import DEFAULT_QUEUE_NUMS, DEFAULT_RETRY_MAX_TIMES
from protocol.names import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    dlq_topic,
    is_dlq_topic,
    is_retry_topic,
    retry_topic,
)
from protocol.results import PullStatus
from protocol.stats import KeyedCounter

__all__ = ["Broker", "PullResult", "PullStatus", "ReceivedEntry", "SendResult", "TopicRoute"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class _Maintenance(ServiceThread):
    """Persists offsets and progress, sweeps expired leases and consumers."""

    name = "broker-maintenance"

    def __init__(self, broker: Broker, interval_s: float) -> None:
        super().__init__()
        self._broker = broker
        self._interval_s = interval_s

    def run(self) -> None:
        while not self.stopped:
            try:
                self._broker.do_maintenance()
            except Exception:
                log.exception("broker maintenance pass failed")
            self.wait_for_running(self._interval_s)


class Broker(ProduceEngine):
    """Topics, groups, produce, pull, send-back, invisible-time receive, transactions.

    The produce methods (`send_message`, `send_batch`, `send_batch_pending`,
    `send_bodies`) are the `ProduceEngine`'s; this class supplies its primitives
    `_require_running` and `_topic`.
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
        clock = clock or wall_ms
        store = (
            MessageStore(store_config, clock=clock)
            if disk_usage is None
            else MessageStore(store_config, clock=clock, disk_usage=disk_usage)
        )
        self._topics = TopicConfigManager(store.config_file(TOPICS_FILE))
        self._groups = SubscriptionGroupManager(store.config_file(GROUPS_FILE))
        self._offsets = ConsumerOffsetManager(store.config_file(OFFSETS_FILE))
        self._consumers = ConsumerRegistry(clock, config.consumer_expiry_ms)
        self.parked = ParkedGroups(store.config_file(PARKED_FILE))
        self._notifier = ArrivalNotifier()
        levels = config.delay_levels_ms
        self._schedule = ScheduleMessageService(
            store,
            levels,
            store.config_file(DELAY_OFFSETS_FILE),
            clock,
            config.schedule_interval_ms,
            before_put=self._ensure_derived_topic,
        )
        self._pop = PopPolicy(
            store,
            store.config_file(POP_STATE_FILE),
            clock,
            commit_offset=self._offsets.commit,
            query_offset=self._offsets.query,
            put_dlq=self._put_dlq,
        )
        # a slave acting for its dead master (broker.acting): the server's decision, asked
        # at each receive and ack; the acting policy while it acts; what it acknowledged
        self.acting_gate: Callable[[], bool] = lambda: False
        self._acting: ActingPolicy | None = None
        self._acting_lock = threading.Lock()
        self._acting_report = ActingReport(store.config_file(ACTING_OFFSETS_FILE))
        transactions = TransactionService(
            store,
            clock,
            commit_offset=self._offsets.commit,
            query_offset=self._offsets.query,
            timeout_ms=config.transaction_timeout_ms,
            check_interval_ms=config.transaction_check_interval_ms,
            check_max=config.transaction_check_max,
            pass_interval_ms=min(config.transaction_check_interval_ms, 1_000),
        )
        super().__init__(config, store, clock, levels, transactions)
        self._maintenance = _Maintenance(
            self,
            min(self.config.pop_revive_interval_ms, self.config.flush_offset_interval_ms) / 1000,
        )
        self._last_persist = 0
        self._last_revive = 0
        self._lock = threading.Lock()
        self._running = False
        # messages handed out and acknowledged per (group, topic), for broker.metrics
        self.delivered: KeyedCounter[tuple[str, str]] = KeyedCounter()
        self.acked: KeyedCounter[tuple[str, str]] = KeyedCounter()
        self._notifier_added = False

    # ------------------------------------------------------------------ lifecycle
    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> None:
        with self._lock:
            if self._running:
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
            self._running = True

    def shutdown(self) -> None:
        with self._lock:
            if not self._running:
                return
            self._running = False
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

    def _require_running(self) -> None:
        if not self._running:
            raise BrokerNotRunning("the broker is not running")

    # ------------------------------------------------------------------ topics and groups
    def create_topic(
        self,
        name: str,
        *,
        queues: int = DEFAULT_QUEUE_NUMS,
        perm: int = PERM_READ_WRITE,
        message_type: str | TopicMessageType = "NORMAL",
        read_queues: int | None = None,
        write_queues: int | None = None,
    ) -> TopicConfig:
        """Create or update a topic (an upsert, like mqadmin updateTopic)."""
        validate_user_topic(name)
        mtype = TopicMessageType.parse(message_type)
        cfg = TopicConfig(
            name,
            read_queue_nums=read_queues or queues,
            write_queue_nums=write_queues or queues,
            perm=perm,
            message_type=mtype,
            order=mtype is TopicMessageType.FIFO,
        )
        return self._topics.put(cfg)

    def delete_topic(self, name: str) -> bool:
        validate_user_topic(name)
        deleted = self._topics.delete(name)
        if deleted and self._running:
            self._pop.forget_topic(name)
            self.store.delete_topics([name])
        if deleted:
            self._offsets.remove_topic(name)
            self.parked.forget_topic(name)
        return deleted

    def get_topic(self, name: str) -> TopicConfig | None:
        return self._topics.get(name)

    def topics(self) -> list[TopicConfig]:
        return self._topics.all()

    def create_group(
        self,
        group: str,
        *,
        retry_max_times: int = DEFAULT_RETRY_MAX_TIMES,
        retry_queue_nums: int = 1,
        consume_broadcast: bool = True,
        fifo: bool = False,
        consume_enable: bool = True,
    ) -> SubscriptionGroupConfig:
        validate_group_name(group)
        return self._groups.put(
            SubscriptionGroupConfig(
                group,
                consume_enable=consume_enable,
                consume_broadcast=consume_broadcast,
                retry_queue_nums=retry_queue_nums,
                retry_max_times=retry_max_times,
                fifo=fifo,
            )
        )

    def delete_group(self, group: str) -> bool:
        validate_group_name(group)
        if self._running:
            self._pop.forget_group(group)
        self._offsets.remove_group(group)
        return self._groups.delete(group)

    def get_group(self, group: str) -> SubscriptionGroupConfig | None:
        return self._groups.get(group)

    def groups(self) -> list[SubscriptionGroupConfig]:
        return self._groups.all()

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
        self._offsets.replace(self._with_acting_offsets(dict(snapshot.get("offsets", {}))))
        if delay is not None:
            self._schedule.replace(delay)

    def _with_acting_offsets(self, table: dict[str, Any]) -> dict[str, Any]:
        """The master's offset table, with this slave's offsets acknowledged while acting
        where they are higher (the master may not have them yet): a config sync never moves
        them back. The entries the master's offsets have reached are forgotten."""
        lows = self._acting_report.lows()
        if not lows:
            return table
        key = ConsumerOffsetManager.key
        master: dict[tuple[str, str, int], int] = {}
        for group, topic, qid in lows:
            queues = table.get(key(topic, group))
            if isinstance(queues, dict) and isinstance(queues.get(str(qid)), int):
                master[(group, topic, qid)] = int(queues[str(qid)])
        self._acting_report.settle(master)
        merged = {k: dict(v) if isinstance(v, dict) else v for k, v in table.items()}
        for (group, topic, qid), low in self._acting_report.lows().items():
            if master.get((group, topic, qid), -1) < low:
                merged.setdefault(key(topic, group), {})[str(qid)] = low
        return merged

    # --- a slave acting for its master (broker.acting)
    def _leases(self) -> PopPolicy:
        """The policy receives and acks go through: a master's own; a slave's acting
        policy while the server says its master is down (`acting_gate`); else refused."""
        if not self.config.replica:
            return self._pop
        with self._acting_lock:
            if self.acting_gate():
                if self._acting is None:
                    self._acting = ActingPolicy(
                        self.store,
                        self.store.config_file(POP_STATE_FILE),  # never written
                        self._clock,
                        commit_offset=self._acting_commit,
                        query_offset=self._offsets.query,
                        put_dlq=refuse_dead_letter,
                    )
                    self._acting.report = self._acting_report
                    log.warning("acting for the master: serving receives and acks")
                return self._acting
            self._stop_acting()
        raise ReplicaNotServing(
            "this broker is a slave and its master is up: receive from the master of its "
            "broker group"
        )

    def _stop_acting(self) -> None:
        acting, self._acting = self._acting, None
        if acting is not None:
            self._acting_report.add(acting.progress())
            self._acting_report.persist()
            log.warning(
                "stopped acting for the master; %d queues acknowledged meanwhile, to report",
                len(self._acting_report.lows()),
            )

    def _acting_commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        if offset > self._offsets.query(group, topic, queue_id):
            self._offsets.commit(group, topic, queue_id, offset)
        self._acting_report.note_low(group, topic, queue_id, offset)

    @property
    def acting(self) -> bool:
        """A slave serving receives for its dead master right now."""
        return self._acting is not None

    def acting_report(self) -> dict[str, Any] | None:
        """A slave's link to its master is back: stop acting, and return what was
        acknowledged while it acted and the master may not have (None: nothing)."""
        with self._acting_lock:
            self._stop_acting()
        return self._acting_report.document()

    def merge_acting_offsets(self, report: Mapping[str, Any], *, own: bool = False) -> int:
        """A master takes what its slave acknowledged while acting for it: those offsets
        are done here too (never moving an offset back). Returns the offsets newly done.
        `own`: a promoted slave taking its own report (every dead-letter in it is written:
        its offsets already count them done). ConfigShapeError for a malformed report."""
        if self.config.replica:
            return 0
        progress, dead = parse_report(report)
        by_topic: dict[tuple[str, str], dict[int, tuple[int, frozenset[int]]]] = {}
        for (group, topic, qid), entry in progress.items():
            by_topic.setdefault((group, topic), {})[qid] = entry
        marked = 0
        for (group, topic), queues in sorted(by_topic.items()):
            if self._topics.get(topic) is None:
                continue  # deleted meanwhile
            to_dlq = {q: dead.get((group, topic, q), {}) for q in queues}
            marked += self._pop.merge_done(group, topic, queues, to_dlq, all_dead=own)
        return marked

    def _forget_topic(self, name: str) -> None:
        """A slave deletes a topic its master no longer has (any topic, system ones
        included: the master's table is the whole truth)."""
        if self._topics.delete(name):
            if self._running:
                self._pop.forget_topic(name)
                self.store.delete_topics([name])
            self._offsets.remove_topic(name)
            self.parked.forget_topic(name)

    def promote(self) -> None:
        """A slave becomes a master (docs/ha.md, promotion): it writes from now on, and
        starts the services that do (delayed delivery, transaction checks, pop revive,
        which `do_maintenance` runs once `replica` is off)."""
        with self._lock:
            if not self.config.replica:
                return
            with self._acting_lock:
                self._stop_acting()
            self.config = dataclasses.replace(self.config, replica=False)
            if self._running:
                # what the master decided reached this log through replication, byte for
                # byte: its leases (the revive log) and its transaction checks (the op
                # log). Taken now, before anything is written here, so a message received
                # on the old master stays invisible until its lease ends, and a half
                # message checked there waits for its next check time (docs/ha.md)
                self.store.wait_dispatched(timeout_s=60.0)
                self._pop.load()
                self._tx.load()
            report = self._acting_report.document()
            if report is not None and self._running:
                self.merge_acting_offsets(report, own=True)
                self._acting_report.clear()
                self._acting_report.persist()
            if self._running:
                self._last_revive = self._clock()
                self._schedule.start()
                self._tx.start()

    def _group(self, group: str) -> SubscriptionGroupConfig:
        validate_group_name(group)
        cfg = self._groups.get(group)
        if cfg is not None:
            return cfg
        if not self.config.auto_create_subscription_group:
            raise GroupNotFound(group)
        return self._groups.get_or_create(
            SubscriptionGroupConfig(group, retry_max_times=self.config.default_retry_max_times)
        )

    def _derived_config(self, name: str) -> TopicConfig | None:
        """Retry and DLQ topics are created on demand from their group's settings."""
        if is_retry_topic(name):
            group = self._group(name[len(RETRY_GROUP_TOPIC_PREFIX) :])
            cfg = TopicConfig(
                name,
                group.retry_queue_nums,
                group.retry_queue_nums,
                PERM_READ_WRITE,
                TopicMessageType.MIXED,
            )
        elif is_dlq_topic(name):
            self._group(name[len(DLQ_GROUP_TOPIC_PREFIX) :])
            cfg = TopicConfig(name, 1, 1, PERM_READ_WRITE, TopicMessageType.MIXED)
        else:
            return None
        existing = self._topics.get_or_create(cfg)
        if is_retry_topic(name):
            existing = self._topics.widen_queues(name, cfg.read_queue_nums)
        return existing

    def _ensure_derived_topic(self, msg: Message) -> None:
        if self._topics.get(msg.topic) is None:
            self._derived_config(msg.topic)

    def _topic(self, name: str, *, create: bool) -> TopicConfig:
        validate_user_topic(name)
        cfg = self._topics.get(name)
        if cfg is not None:
            return cfg
        derived = self._derived_config(name)
        if derived is not None:
            return derived
        if create and self.config.auto_create_topic:
            return self._topics.get_or_create(
                TopicConfig(
                    name,
                    self.config.default_queue_nums,
                    self.config.default_queue_nums,
                    PERM_READ_WRITE,
                    TopicMessageType.MIXED,
                )
            )
        raise TopicNotFound(name)

    def route(self, topic: str) -> TopicRoute:
        """Queues and permission of a topic; auto-creates it when configured."""
        cfg = self._topic(topic, create=True)
        return TopicRoute(
            cfg.name, cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm, cfg.message_type
        )

    def retry_topic(self, group: str) -> str:
        return retry_topic(validate_group_name(group))

    def dlq_topic(self, group: str) -> str:
        return dlq_topic(validate_group_name(group))

    def max_delivery_attempts(self, group: str) -> int:
        cfg = self._groups.get(group)
        retries = cfg.retry_max_times if cfg else self.config.default_retry_max_times
        return retries + 1

    def delay_levels_ms(self) -> list[int]:
        return list(self._levels)

    # ------------------------------------------------------------------ produce
    def recall_message(self, topic: str, recall_handle: str) -> str:
        """Cancel a delayed message before it is due (RocketMQ 5 RecallMessage); returns its
        message id. InvalidRecallHandle when malformed or already delivered."""
        self._require_running()
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
        self._require_running()
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

    # ------------------------------------------------------------------ pull model
    def _readable(self, group: str, topic: str, queue_id: int | None) -> TopicConfig:
        gcfg = self._group(group)
        if not gcfg.consume_enable:
            raise ConsumeDisabled(group)
        cfg = self._topic(topic, create=False)
        if not cfg.readable:
            raise NoPermission(topic, "readable", cfg.perm)
        if queue_id is not None and (
            not isinstance(queue_id, int) or not 0 <= queue_id < cfg.read_queue_nums
        ):
            raise InvalidArgument(
                f"queue id {queue_id!r} is not one of the "
                f"{cfg.read_queue_nums} read queues of {topic!r}"
            )
        return cfg

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
        self._require_running()
        self._readable(group, topic, queue_id)
        if not isinstance(offset, int) or offset < 0:
            raise InvalidArgument(f"offset {offset!r} must be a non-negative integer")
        if not isinstance(max_msgs, int) or max_msgs < 1:
            raise InvalidArgument(f"max_msgs {max_msgs!r} must be at least 1")
        batch = min(max_msgs, self.config.max_pull_batch)
        tags = tag_set(tags)
        deadline = time.monotonic() + min(max(suspend_ms, 0), self.config.long_poll_max_ms) / 1e3
        while True:
            version = self._notifier.version(topic)
            got = self.store.get_messages(group, topic, queue_id, offset, batch, tags)
            status = PULL_STATUS.get(got.status, PullStatus.NO_NEW_MSG)
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if status is not PullStatus.NO_NEW_MSG or remaining_ms <= 0 or not self._running:
                if got.messages:
                    self.delivered.add((group, topic), len(got.messages))
                return PullResult(
                    status, got.messages, got.next_begin_offset, got.min_offset, got.max_offset
                )
            self._notifier.wait({topic: version}, remaining_ms)

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
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
                return self.store.get_min_offset_in_queue(topic, queue_id)
            if where is ConsumeFromWhere.LAST_OFFSET:
                return self.store.get_max_offset_in_queue(topic, queue_id)
            ts = (
                timestamp_ms
                if timestamp_ms is not None
                else (self._clock() - DEFAULT_CONSUME_TIMESTAMP_AGO_MS)
            )
            return self.store.get_offset_in_queue_by_time(topic, queue_id, ts)

        return self._offsets.commit_if_absent(group, topic, queue_id, start)

    def offsets_of(self, group: str, topic: str) -> dict[int, int]:
        return self._offsets.table_of(group, topic)

    def persist_offsets(self) -> None:
        """Write consumerOffset.json now (it is also written every 5 s and at shutdown)."""
        self._offsets.persist(force=True)

    def consumer_progress(self, group: str, topic: str | None = None) -> list[QueueProgress]:
        """Per queue: the queue's end, the group's committed offset, messages in flight.
        Without `topic`: every topic the group has offsets for (its retry topic included)."""
        validate_group_name(group)
        topics = [validate_topic_name(topic)] if topic else self._offsets.topics_of_group(group)
        out: list[QueueProgress] = []
        for t in topics:
            cfg = self._topics.get(t)
            committed = self._offsets.table_of(group, t)
            queue_ids = set(committed) | set(range(cfg.read_queue_nums if cfg else 0))
            leased: dict[int, int] = {}
            for f in self._pop.in_flight(group, t):
                leased[f.queue_id] = leased.get(f.queue_id, 0) + 1
            out.extend(
                QueueProgress(
                    t,
                    q,
                    self.store.get_max_offset_in_queue(t, q),
                    committed.get(q, -1),
                    leased.get(q, 0),
                )
                for q in sorted(queue_ids)
            )
        return out

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self.store.get_min_offset_in_queue(topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self.store.get_max_offset_in_queue(topic, queue_id)

    # ------------------------------------------------------------------ send-back
    def _put_dlq(self, msg: Message) -> None:
        self._ensure_derived_topic(msg)
        self._stored(msg.topic, self.store.put_message(msg))

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
        self._require_running()
        gcfg = self._group(group)
        stored = look_checked(self.store, msg.commitlog_offset)
        if stored is None or stored.msg_id != msg.msg_id:
            stored = msg  # not (or no longer) in the commitlog: trust the client's copy
        limit = gcfg.retry_max_times if max_reconsume_times is None else max_reconsume_times
        if delay_level < 0 or stored.reconsume_times >= limit:
            # an ordered consumer parking the message group says so on its copy
            parked = msg.properties.get(PARKED_MESSAGE_GROUP) if delay_level < 0 else None
            if parked is not None:
                self.parked.park(group, original_topic(stored), parked)
            self._put_dlq(build_dlq_message(group, stored, parked_group=parked))
            return
        rcfg = self._derived_config(retry_topic(group))
        assert rcfg is not None
        level = retry_level(delay_level, stored.reconsume_times, len(self._levels))
        retry_msg = build_retry_message(
            group,
            stored,
            level=level,
            delay_ms=self._levels[level - 1],
            now_ms=self._clock(),
            retry_queue_id=random.randrange(rcfg.write_queue_nums),
            max_reconsume_times=limit,
        )
        self._stored(retry_msg.topic, self.store.put_message(retry_msg))

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
        self._require_running()
        self._group(group)
        stored = look_checked(self.store, commitlog_offset)
        if stored is None:
            raise InvalidArgument(f"no message at commitlog offset {commitlog_offset}")
        rcfg = self._derived_config(retry_topic(group))
        assert rcfg is not None
        copy = build_retry_message(
            group,
            stored,
            level=1,
            delay_ms=0,
            now_ms=self._clock(),
            retry_queue_id=random.randrange(rcfg.write_queue_nums),
            max_reconsume_times=self.max_delivery_attempts(group) - 1,
        )
        direct = unschedule_now(
            copy,
            reconsume_times=stored.reconsume_times if reconsume_times is None else reconsume_times,
        )
        direct.properties.update(properties or {})
        result = self._stored(direct.topic, self.store.put_message(direct))
        assert result.append is not None
        return SendResult(
            result.status,
            stored.msg_id,
            result.append.msg_id,
            direct.topic,
            direct.queue_id,
            result.append.queue_offset,
            result.append.wrote_offset,
        )

    def deliver_due(self) -> int:
        """Run one schedule pass now (the service runs one every `schedule_interval_ms`)."""
        return self._schedule.do_deliver()

    def schedule_offsets(self) -> dict[int, int]:
        return self._schedule.offsets()

    def next_due_ms(self) -> int | None:
        """When the earliest delayed or retried message still scheduled is due (None:
        nothing is scheduled): what a virtual clock advances to (`reliable.testing`)."""
        return self._schedule.next_due_ms()

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
        self._require_running()
        cfg = self._readable(group, topic, None)
        if not isinstance(max_msgs, int) or max_msgs < 1:
            raise InvalidArgument(f"max_msgs {max_msgs!r} must be at least 1")
        self._check_invisible(invisible_ms)
        gcfg = self._group(group)
        fifo = fifo or gcfg.fifo
        tags = tag_set(tags)
        want = min(max_msgs, self.config.max_receive_batch)
        wait_ms = min(max(long_poll_ms, 0), self.config.long_poll_max_ms)
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
            parked = self.parked.of(group, topic)
            if parked and entries and acting:  # held back: parking is the master's
                entries = [e for e in entries if message_group_of(e.message) not in parked]
            elif parked and entries:
                kept = self._divert_parked(group, topic, entries, parked)
                if len(kept) < len(entries) and not kept:
                    continue  # the parked group's next message may be free now: look again
                entries = kept
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if entries or remaining_ms <= 0 or not self._running:
                if entries:
                    self._count(self.delivered, group, topic, [e.receipt_handle for e in entries])
                return entries
            self._notifier.wait({topic: version}, remaining_ms)

    def _retry_config(self, group: str, topic: str, fifo: bool) -> TopicConfig | None:
        """The group's retry topic, when an invisible-time receive of `topic` reads it too:
        it exists, the group is neither FIFO nor has parked message groups there, and its
        live consumers subscribe to `topic` alone. (One retry topic serves all of a group's
        topics; a group reading several would be handed one topic's copies as another's.)"""
        name = retry_topic(group)
        if fifo or topic == name or self.parked.of(group, topic):
            return None
        cfg = self._topics.get(name)
        if cfg is None:
            return None
        subscribed = [
            {t for t in c.subscriptions if not is_retry_topic(t)}
            for c in self._consumers.consumers(group)
        ]
        if not subscribed or any(s != {topic} for s in subscribed):
            return None
        return cfg

    def _count(
        self, counter: KeyedCounter[tuple[str, str]], group: str, topic: str, handles: list[str]
    ) -> None:
        """Add received or acknowledged messages to `counter` under the topic each record is
        in: a `%RETRY%<group>` copy counts under the retry topic, as `group show` and the
        retry-depth gauge count it (docs/observability.md)."""
        name = retry_topic(group)
        on_retry = f"{RECEIPT_VERSION}{RECEIPT_SEPARATOR}{name}{RECEIPT_SEPARATOR}"
        retry = sum(1 for h in handles if h.startswith(on_retry))
        if retry:
            counter.add((group, name), retry)
        if len(handles) > retry:
            counter.add((group, topic), len(handles) - retry)

    @staticmethod
    def _lease_topic(group: str, topic: str, receipt_handle: str) -> str:
        """The topic a receipt handle's lease is on: the group's retry topic for a message
        `receive` took from it (the client only knows the topic it asked for), else `topic`."""
        name = retry_topic(group)
        if isinstance(receipt_handle, str) and receipt_handle.startswith(
            f"{RECEIPT_VERSION}{RECEIPT_SEPARATOR}{name}{RECEIPT_SEPARATOR}"
        ):
            return name
        return topic

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
            self.config.max_invisible_ms
        ):
            raise InvalidArgument(
                f"invisible duration {invisible_ms!r} ms must be {minimum}.."
                f"{self.config.max_invisible_ms}"
            )

    def ack(self, group: str, topic: str, receipt_handle: str) -> None:
        """Done with a received message. Acking the same handle twice is harmless."""
        self._require_running()
        validate_group_name(group)
        validate_topic_name(topic)
        lease_topic = self._lease_topic(group, topic, receipt_handle)
        self._leases().ack(group, lease_topic, receipt_handle)
        self.acked.add((group, lease_topic))
        self._touch(group, [receipt_handle])

    def ack_batch(
        self, group: str, topic: str, receipt_handles: Sequence[str]
    ) -> list[BrokerError | None]:
        """Ack many handles at once (one durable record): per handle None or its error."""
        self._require_running()
        validate_group_name(group)
        validate_topic_name(topic)
        handles = list(receipt_handles)
        retry = retry_topic(group)
        on_retry = f"{RECEIPT_VERSION}{RECEIPT_SEPARATOR}{retry}{RECEIPT_SEPARATOR}"
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
                self.acked.add((group, lease_topic), done)
        self._touch(group, [h for h, e in zip(handles, errors, strict=True) if e is None])
        return errors

    def _touch(self, group: str, handles: Sequence[str]) -> None:
        """Record when the group last acknowledged (or dead-lettered) in the queues these
        handles name."""
        now = self._clock()
        for t, q in {(h.topic, h.queue_id) for h in map(ReceiptHandle.decode, handles)}:
            self._offsets.touch(group, t, q, now)

    def consume_times(self, group: str, topic: str) -> dict[int, int]:
        """Per queue of `topic`: when `group` last acknowledged or committed there (ms)."""
        return self._offsets.consume_times(group, topic)

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

    def change_invisible_duration(
        self, group: str, topic: str, receipt_handle: str, invisible_ms: int
    ) -> str:
        """Hide the message for `invisible_ms` from now; returns the new handle (the old
        one stops working). The delivery attempt does not change; 0 makes the message
        visible again at once (a negative acknowledgement)."""
        self._require_running()
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
        self._require_running()
        self._group(group)
        validate_topic_name(topic)

        pop = self._leases()
        if park and pop is not self._pop:
            raise ReplicaNotServing(
                "this broker is a slave serving receives while its master is down: parking "
                "a message group is left to the master"
            )

        def parked(message_group: str) -> bool:
            if park:
                self.parked.park(group, topic, message_group)
                return True
            return message_group in self.parked.of(group, topic)

        pop.forward_to_dlq(
            group, self._lease_topic(group, topic, receipt_handle), receipt_handle, parked=parked
        )
        self._touch(group, [receipt_handle])

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
