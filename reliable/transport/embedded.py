"""The embedded transport: an in-process `broker.broker.Broker`.

`EmbeddedTransport(store_dir=...)` opens (or shares) the broker of that store directory: every
client of the process naming the same directory uses one broker, started by the first
`start()` and shut down by the last `close()`. `EmbeddedTransport(broker=b)` uses a broker the
caller created and manages.

With `_embedded_convert` (its conversions and its errors), the only module of `reliable` that
uses the broker itself; the rest share only the broker's vocabulary (names, codes, limits).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from broker import errors as berr
from broker.broker import Broker
from broker.config import BrokerConfig
from broker.offsets import ConsumeFromWhere
from broker.results import SendResult
from broker.store.config import StoreConfig, embedded_store_config, max_message_size_for
from broker.store.message import MessageExt, PutMessageStatus, decode_offset_msg_id
from protocol.names import dlq_topic, retry_topic
from protocol.props import Prop
from reliable.errors import (
    BadRequest,
    ConfigurationError,
    ReceiptHandleError,
)
from reliable.message import Message, ReceivedMessage, SendReceipt, SendStatus, send_receipt
from reliable.transport._embedded_convert import (
    call,
    to_received,
    to_store_message,
    translate,
)
from reliable.transport.base import (
    Capability,
    ConsumeFrom,
    PullBatch,
    PullStatus,
    QueueRef,
    TopicRoute,
    TransactionChecker,
    TransactionRef,
    TransactionState,
)

log = logging.getLogger(__name__)

BROKER_NAME = "embedded"
_PERM_READ, _PERM_WRITE = 4, 2

_SEND_STATUS = {
    PutMessageStatus.PUT_OK: SendStatus.SEND_OK,
    PutMessageStatus.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}


class _Shared:
    """Brokers of this process by store directory, reference-counted."""

    lock = threading.Lock()
    brokers: dict[Path, tuple[Broker, int]] = {}

    @classmethod
    def acquire(cls, store_config: StoreConfig, config: BrokerConfig | None) -> Broker:
        key = Path(store_config.store_dir).resolve()
        with cls.lock:
            if key in cls.brokers:
                broker, n = cls.brokers[key]
                cls.brokers[key] = (broker, n + 1)
                return broker
            broker = Broker(store_config, config)
            broker.start()
            cls.brokers[key] = (broker, 1)
            return broker

    @classmethod
    def release(cls, broker: Broker) -> None:
        with cls.lock:
            for key, (b, n) in list(cls.brokers.items()):
                if b is broker:
                    if n > 1:
                        cls.brokers[key] = (b, n - 1)
                        return
                    del cls.brokers[key]
                    break
            else:
                return
        broker.shutdown()


class _Membership:
    """Group-membership watchers of this process, per broker: a consumer joining or
    leaving makes the others rebalance at once instead of at their next period."""

    lock = threading.Lock()
    watchers: dict[tuple[int, str], dict[str, Callable[[str], None]]] = {}

    @classmethod
    def watch(
        cls, broker: Broker, group: str, key: str, callback: Callable[[str], None] | None
    ) -> None:
        with cls.lock:
            slot = cls.watchers.setdefault((id(broker), group), {})
            if callback is None:
                slot.pop(key, None)
            else:
                slot[key] = callback

    @classmethod
    def notify(cls, broker: Broker, group: str) -> None:
        with cls.lock:
            callbacks = list(cls.watchers.get((id(broker), group), {}).values())
        for cb in callbacks:
            try:
                cb(group)
            except Exception:
                log.warning("membership watcher of %s failed", group, exc_info=True)


class EmbeddedTransport:
    """A `PullTransport` over an in-process broker."""

    name = "embedded"
    # submit_send and submit_ack complete before they return: callers may run them
    inline_sends = inline_acks = True
    capabilities = frozenset(
        {
            Capability.PULL,
            Capability.BROKER_SIDE_FIFO,
            Capability.MEMBERSHIP_EVENTS,
            Capability.PARKED_GROUPS,
        }
    )

    def __init__(
        self,
        *,
        store_dir: str | Path | None = None,
        broker: Broker | None = None,
        broker_config: BrokerConfig | None = None,
        store_config: StoreConfig | None = None,
        delay_levels: str | None = None,
        **store_options: Any,
    ) -> None:
        """`store_dir` (default `~/.reliable/store`) plus optional `StoreConfig` fields as
        keywords (`flush_mode=`, `mapped_file_size_commitlog=`, ...) and `geometry=`
        ("development", the default for a new store: 64 MiB commitlog files; "production":
        1 GiB; an existing store keeps its own sizes); or a full
        `store_config`; or an existing `broker`. `delay_levels` overrides the delay table
        (e.g. `"100ms 200ms 500ms"`) of a default `BrokerConfig`."""
        if broker is not None and (
            store_dir is not None
            or store_config is not None
            or broker_config is not None
            or store_options
            or delay_levels is not None
        ):
            raise ConfigurationError("give broker= or store settings, not both")
        if store_config is not None and (store_dir is not None or store_options):
            raise ConfigurationError("give store_config= or store_dir=/store options, not both")
        if delay_levels is not None:
            if broker_config is not None:
                raise ConfigurationError("give delay_levels= or broker_config=, not both")
            broker_config = BrokerConfig(message_delay_level=delay_levels)
        if broker_config is not None:
            try:
                broker_config.validate()
            except berr.BrokerError as exc:
                raise ConfigurationError(str(exc)) from exc
        self._given = broker
        if broker is None and store_config is None:
            try:
                store_config = embedded_store_config(store_dir, **store_options)
            except TypeError as exc:
                raise ConfigurationError(f"unknown embedded transport option: {exc}") from None
            except ValueError as exc:
                raise ConfigurationError(str(exc)) from None
        if store_config is not None and broker_config is not None:
            # one body limit: the store's records must hold the broker's largest body
            record = max_message_size_for(broker_config.max_message_size)
            if store_config.max_message_size < record:
                store_config = dataclasses.replace(store_config, max_message_size=record)
        self._store_config = store_config
        self._broker_config = broker_config
        self._broker: Broker | None = broker
        self._checkers: dict[str, TransactionChecker] = {}
        self._started = broker is not None

    @property
    def broker(self) -> Broker:
        if self._broker is None:
            raise ConfigurationError("the embedded transport is not started")
        return self._broker

    def start(self) -> None:
        if self._broker is None:
            assert self._store_config is not None
            self._broker = _Shared.acquire(self._store_config, self._broker_config)
        self._started = True

    def close(self) -> None:
        for group in list(self._checkers):
            self.set_transaction_checker(group, None)
        if self._given is None and self._broker is not None:
            broker, self._broker = self._broker, None
            _Shared.release(broker)
        self._started = False

    # --- producing
    def route(self, topic: str) -> TopicRoute:
        r = call(self.broker.route, topic)
        writable, readable = bool(r.perm & _PERM_WRITE), bool(r.perm & _PERM_READ)
        writes = tuple(QueueRef(topic, BROKER_NAME, q) for q in r.write_queue_ids if writable)
        reads = tuple(QueueRef(topic, BROKER_NAME, q) for q in r.read_queue_ids if readable)
        return TopicRoute(topic, writes, reads)

    def _receipt(self, m: Message, result: SendResult) -> SendReceipt:
        status = result.status
        if isinstance(status, PutMessageStatus):
            send_status = _SEND_STATUS.get(status)
            if send_status is None:
                raise translate(
                    berr.SendRejected(m.topic, status.value, berr.ResponseCode.SYSTEM_ERROR)
                )
        else:
            send_status = SendStatus.SEND_OK
        return SendReceipt(
            message_id=result.msg_id or m.message_id,
            topic=m.topic,
            queue_id=result.queue_id,
            queue_offset=result.queue_offset,
            status=send_status,
            offset_msg_id=result.offset_msg_id,
            transaction_id=result.transaction_id,
            recall_handle=result.recall_handle,
        )

    def send(
        self,
        message: Message,
        queue: QueueRef,
        *,
        producer_group: str | None = None,
        transactional: bool = False,
        timeout_s: float | None = None,
    ) -> SendReceipt:
        sm = to_store_message(message, queue.queue_id)
        if transactional:
            sm.properties[Prop.TRAN_MSG] = "true"
            sm.properties[Prop.PRODUCER_GROUP] = producer_group or ""
        result = call(self.broker.send_message, sm, producer_group=producer_group)
        return self._receipt(message, result)

    def recall(self, topic: str, recall_handle: str) -> str:
        return str(call(self.broker.recall_message, topic, recall_handle))

    def send_batch(
        self, messages: Sequence[Message], queue: QueueRef, *, producer_group: str | None = None
    ) -> list[SendReceipt]:
        plain = self._send_plain(messages, queue.queue_id)
        if plain is not None:
            return plain
        queue_id = queue.queue_id
        sms = [to_store_message(m, queue_id) for m in messages]
        results = call(self.broker.send_batch, sms)
        out: list[SendReceipt] = []
        ok = PutMessageStatus.PUT_OK
        for m, r in zip(messages, results, strict=True):
            if r.status is ok:  # a batch holds plain messages: no transaction, no recall
                out.append(
                    SendReceipt(
                        r.msg_id or m.message_id,
                        m.topic,
                        r.queue_id,
                        r.queue_offset,
                        SendStatus.SEND_OK,
                        r.offset_msg_id,
                    )
                )
            else:
                out.append(self._receipt(m, r))
        return out

    def _send_plain(self, messages: Sequence[Message], queue_id: int) -> list[SendReceipt] | None:
        """Messages of one topic and message group with nothing but a body and an id (a
        producer's usual send), stored as one record batch straight from their bodies and
        ids (`Broker.send_bodies`): no store `Message`, no broker result per message. None
        when they are not all such messages, or the broker refuses the batch as a whole
        (nothing stored): the caller sends them the general way."""
        first = messages[0]
        topic, group = first.topic, first.message_group
        for m in messages:
            if (
                m.properties
                or m.tags
                or m.keys
                or m.delay_level is not None
                or m.deliver_at_ms is not None
                or m.message_group != group
                or m.topic != topic
            ):
                return None
        result = call(
            self.broker.send_bodies,
            topic,
            queue_id,
            [b if type(b) is bytes else bytes(b) for b in [m.body for m in messages]],
            [m.message_id for m in messages],
            None if group is None else {Prop.SHARDING_KEY: group},
        )
        if result is None:
            return None
        status = _SEND_STATUS.get(result.status)
        if status is None:  # pragma: no cover - send_bodies raises for what was not stored
            raise translate(
                berr.SendRejected(topic, result.status.value, berr.ResponseCode.SYSTEM_ERROR)
            )
        append = result.append
        assert append is not None
        msg_id_at, offset = append.msg_id_at, append.queue_offset
        out: list[SendReceipt] = []
        add = out.append
        for m, at in zip(messages, append.record_offsets, strict=True):
            offset_id = msg_id_at(at)
            add(send_receipt(m.message_id or offset_id, topic, queue_id, offset, status, offset_id))
            offset += 1
        return out

    def submit_send(
        self,
        messages: Sequence[Message],
        queue: QueueRef,
        *,
        producer_group: str | None,
        timeout_s: float | None,
        done: Callable[[list[SendReceipt | BaseException] | BaseException], None],
    ) -> None:
        """The pipelined producer's send: runs inline (the broker is in this process). A
        batch of plain messages (a body and an id) is stored as one record batch straight
        from the bodies (`_send_plain`); other batches of undelayed messages through
        `Broker.send_batch`; delayed ones message by message. `done` gets a result per
        message."""
        results: list[SendReceipt | BaseException]
        try:
            plain = self._send_plain(messages, queue.queue_id)
            if plain is not None:
                results = list(plain)
            elif len(messages) > 1 and all(
                m.delay_level is None and m.deliver_at_ms is None for m in messages
            ):
                results = list(self.send_batch(messages, queue, producer_group=producer_group))
            else:
                results = []
                for m in messages:
                    try:
                        results.append(self.send(m, queue, producer_group=producer_group))
                    except Exception as exc:
                        results.append(exc)
        except Exception as exc:
            done(exc)
            return
        done(results)

    def end_transaction(
        self,
        producer_group: str,
        ref: TransactionRef,
        state: TransactionState,
        *,
        from_check: bool = False,
    ) -> None:
        if state is TransactionState.UNKNOWN:
            return
        if ref.offset_msg_id is None:
            raise BadRequest("end_transaction needs the half message's offset id")
        _, offset = decode_offset_msg_id(ref.offset_msg_id)
        call(
            self.broker.end_transaction,
            producer_group,
            ref.transaction_id or ref.message_id,
            offset,
            state is TransactionState.COMMIT,
            from_check=from_check,
        )

    def set_transaction_checker(
        self, producer_group: str, checker: TransactionChecker | None
    ) -> None:
        if checker is None:
            self._checkers.pop(producer_group, None)
            # the broker keeps the last registration; answer nothing (checks stay pending)
            self.broker.register_transaction_checker(producer_group, lambda msg: None)
            return
        self._checkers[producer_group] = checker

        def on_check(msg: MessageExt) -> None:
            received = to_received(msg)
            state = checker(received)
            ref = TransactionRef(
                received.topic,
                received.message_id,
                Broker.transaction_id_of(msg),
                msg.offset_msg_id,
            )
            self.end_transaction(producer_group, ref, state, from_check=True)

        self.broker.register_transaction_checker(producer_group, on_check)

    # --- liveness
    def heartbeat(
        self, client_id: str, group: str, subscriptions: Mapping[str, Collection[str] | None]
    ) -> None:
        known = client_id in call(self.broker.consumer_ids, group)
        call(self.broker.heartbeat, client_id, group, subscriptions)
        if not known:
            _Membership.notify(self.broker, group)

    def unregister(self, client_id: str, group: str) -> None:
        if self._broker is not None:
            call(self.broker.unregister, client_id, group)
            _Membership.notify(self.broker, group)

    def watch_consumers(
        self, group: str, client_id: str, callback: Callable[[str], None] | None
    ) -> None:
        _Membership.watch(self.broker, group, client_id, callback)

    def consumer_ids(self, group: str) -> list[str]:
        return list(call(self.broker.consumer_ids, group))

    # --- pull
    def pull(
        self,
        group: str,
        queue: QueueRef,
        offset: int,
        max_msgs: int,
        tags: Collection[str] | None = None,
        *,
        suspend_ms: int = 0,
    ) -> PullBatch:
        r = call(
            self.broker.pull_message,
            group,
            queue.topic,
            queue.queue_id,
            offset,
            max_msgs,
            tags,
            suspend_ms=suspend_ms,
        )
        msgs = [to_received(m) for m in r.messages]
        # the broker's PullStatus is the transport's own; FOUND without messages is nothing
        status = (
            PullStatus.FOUND
            if msgs
            else (PullStatus.NO_NEW_MSG if r.status is PullStatus.FOUND else r.status)
        )
        return PullBatch(status, msgs, r.next_begin_offset, r.min_offset, r.max_offset)

    def commit_offset(self, group: str, queue: QueueRef, offset: int) -> None:
        call(self.broker.commit_offset, group, queue.topic, queue.queue_id, offset)

    def query_offset(self, group: str, queue: QueueRef) -> int:
        return int(call(self.broker.query_offset, group, queue.topic, queue.queue_id))

    def min_offset(self, queue: QueueRef) -> int:
        """The queue's smallest offset still held."""
        return int(call(self.broker.min_offset, queue.topic, queue.queue_id))

    def max_offset(self, queue: QueueRef) -> int:
        """One past the queue's last offset."""
        return int(call(self.broker.max_offset, queue.topic, queue.queue_id))

    def initial_offset(
        self, group: str, queue: QueueRef, where: ConsumeFrom, timestamp_ms: int | None = None
    ) -> int:
        w = {
            ConsumeFrom.LAST: ConsumeFromWhere.LAST_OFFSET,
            ConsumeFrom.FIRST: ConsumeFromWhere.FIRST_OFFSET,
            ConsumeFrom.TIMESTAMP: ConsumeFromWhere.TIMESTAMP,
        }[where]
        return int(
            call(self.broker.initial_offset, group, queue.topic, queue.queue_id, w, timestamp_ms)
        )

    def send_back(
        self,
        group: str,
        message: ReceivedMessage,
        delay_level: int = 0,
        max_reconsume_times: int | None = None,
    ) -> None:
        raw = self._raw(message)
        call(self.broker.consumer_send_back, group, raw, delay_level, max_reconsume_times)

    @staticmethod
    def _raw(message: ReceivedMessage) -> MessageExt:
        if not isinstance(message.source, MessageExt):
            raise BadRequest(f"message {message.message_id} was not received from this transport")
        raw = message.source
        if message.reconsume_times != raw.reconsume_times and not message.receipt_handle:
            raw.reconsume_times = message.reconsume_times  # local retries count too
        extra = {k: v for k, v in message.properties.items() if k not in raw.properties}
        if extra:
            raw.properties.update(extra)
        return raw

    def delay_levels_ms(self, group: str | None = None) -> list[int]:
        return list(self.broker.delay_levels_ms())

    # --- invisible time
    def receive(
        self,
        group: str,
        topic: str,
        max_msgs: int,
        invisible_ms: int,
        tags: Collection[str] | None = None,
        *,
        long_poll_ms: int = 0,
        fifo: bool = False,
    ) -> list[ReceivedMessage]:
        entries = call(
            self.broker.receive,
            group,
            topic,
            max_msgs,
            invisible_ms,
            tags,
            long_poll_ms=long_poll_ms,
            fifo=fifo,
        )
        return [
            to_received(e.message, receipt_handle=e.receipt_handle, attempt=e.delivery_attempt)
            for e in entries
        ]

    @staticmethod
    def _handle(message: ReceivedMessage) -> str:
        if not message.receipt_handle:
            raise ReceiptHandleError("", "the message carries no receipt handle")
        return message.receipt_handle

    def _source_topic(self, message: ReceivedMessage) -> str:
        raw = message.source
        return raw.topic if isinstance(raw, MessageExt) else message.topic

    def ack(self, group: str, message: ReceivedMessage) -> None:
        call(self.broker.ack, group, self._source_topic(message), self._handle(message))

    def ack_many(
        self, group: str, messages: Sequence[ReceivedMessage]
    ) -> list[BaseException | None]:
        """Ack many messages with one durable record per topic (`Broker.ack_batch`): per
        message None or its error (a dead receipt handle fails that message alone)."""
        out: list[BaseException | None] = [None] * len(messages)
        by_topic: dict[str, list[int]] = {}
        for i, m in enumerate(messages):
            if not m.receipt_handle:
                out[i] = ReceiptHandleError("", "the message carries no receipt handle")
                continue
            by_topic.setdefault(self._source_topic(m), []).append(i)
        for topic, indexes in by_topic.items():
            errors = call(
                self.broker.ack_batch, group, topic, [messages[i].receipt_handle for i in indexes]
            )
            for i, error in zip(indexes, errors, strict=True):
                if error is not None:
                    out[i] = translate(error)
        return out

    def submit_ack(
        self,
        group: str,
        messages: Sequence[ReceivedMessage],
        done: Callable[[list[BaseException | None] | BaseException], None],
    ) -> None:
        """`ack_many`, reported through `done` (inline: the broker is in this process)."""
        try:
            acked = self.ack_many(group, messages)
        except Exception as exc:
            done(exc)
            return
        done(acked)

    def change_invisible_duration(
        self, group: str, message: ReceivedMessage, invisible_ms: int
    ) -> str:
        new = call(
            self.broker.change_invisible_duration,
            group,
            self._source_topic(message),
            self._handle(message),
            invisible_ms,
        )
        message.receipt_handle = new
        return str(new)

    def submit_change_invisible(
        self,
        group: str,
        message: ReceivedMessage,
        invisible_ms: int,
        done: Callable[[str | BaseException], None],
    ) -> None:
        """`change_invisible_duration` reported through `done` (inline)."""
        try:
            handle = self.change_invisible_duration(group, message, invisible_ms)
        except Exception as exc:
            done(exc)
            return
        done(handle)

    def forward_to_dlq(self, group: str, message: ReceivedMessage) -> None:
        call(
            self.broker.forward_to_dlq,
            group,
            self._source_topic(message),
            self._handle(message),
            park="PARKED_MESSAGE_GROUP" in message.properties,
        )

    def max_delivery_attempts(self, group: str) -> int:
        return int(self.broker.max_delivery_attempts(group))

    def retry_topic(self, group: str) -> str:
        return retry_topic(group)

    def group_resend_supported(self) -> bool:
        """A send to `%RETRY%<group>` with `RETRY_TOPIC` reaches that group alone."""
        return True

    def dlq_topic(self, group: str) -> str:
        return dlq_topic(group)

    def parked_groups(self, group: str, topic: str) -> frozenset[str]:
        """The broker's durable record of `group`'s parked message groups on `topic`."""
        return self.broker.parked.of(group, topic)
