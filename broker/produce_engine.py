"""The produce engine: validate messages, place delayed ones, store them, answer results.

`Broker` holds one and hands out its methods as its own produce API (`send_message`,
`send_batch`, `send_batch_pending`, `send_bodies` are this engine's bound methods), so a send
goes from the caller straight to this code with no call in between. It reads topics through
the broker's `Catalog` (retry/DLQ topics created on demand, user topics auto-created when
allowed) and checks the broker's `RunState`. The pure rules it applies (property checks,
message types, where a delayed message waits) are in `broker.produce`.

A batch of messages that differ only in body, KEYS and UNIQ_KEY (a producer's usual batch) is
stored as one record batch (`MessageStore.put_batch`); any other batch message by message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from broker.catalog import Catalog
from broker.config import BrokerConfig
from broker.errors import (
    BodyOverLimit,
    MessageIllegal,
    MessageTypeMismatch,
    NoPermission,
    ResponseCode,
    SendRejected,
)
from broker.lifecycle import RunState
from broker.names import validate_group_name
from broker.produce import (
    check_properties,
    message_type_of,
    schedule_target,
    scheduled_copy,
    without_delay,
)
from broker.results import PUT_STATUS_CODES, SendResult
from broker.schedule import encode_recall_handle
from broker.store.message import Message, PutMessageResult, PutMessageStatus
from broker.store.store import MessageStore
from broker.topic import TopicConfig
from broker.transaction import TransactionService
from protocol.props import Prop


class ProduceEngine:
    """Stores messages: normal, delayed, half (transactional), batches."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        clock: Callable[[], int],
        levels: tuple[int, ...],
        transactions: TransactionService,
        *,
        run: RunState,
        catalog: Catalog,
    ) -> None:
        # read for limits alone: fields a promotion never changes
        self._config = config
        self._store = store
        self._clock = clock
        self._levels = levels
        self._tx = transactions
        self._run = run
        self._catalog = catalog

    # ------------------------------------------------------------------ produce
    def _validate_message(self, msg: Message) -> TopicConfig:
        if not isinstance(msg, Message):
            raise MessageIllegal(f"expected a broker.store.Message, got {type(msg).__name__}")
        cfg = self._catalog.topic(msg.topic, create=True)
        if not cfg.writeable:
            raise NoPermission(msg.topic, "writeable", cfg.perm)
        if not isinstance(msg.body, bytes | bytearray | memoryview):
            raise MessageIllegal("message body must be bytes")
        if len(msg.body) == 0:
            raise MessageIllegal("message body is empty")
        if len(msg.body) > self._config.max_message_size:
            raise BodyOverLimit(len(msg.body), self._config.max_message_size)
        if not isinstance(msg.queue_id, int) or not 0 <= msg.queue_id < cfg.write_queue_nums:
            raise MessageIllegal(
                f"queue id {msg.queue_id!r} is not one of the "
                f"{cfg.write_queue_nums} write queues of {msg.topic!r}"
            )
        check_properties(msg.properties)
        if self._config.check_message_type:
            mtype = message_type_of(msg)
            if not cfg.message_type.accepts(mtype):
                raise MessageTypeMismatch(msg.topic, cfg.message_type.value, mtype.value)
        return cfg

    def send_message(self, msg: Message, *, producer_group: str | None = None) -> SendResult:
        """Store one message: normal, delayed (DELAY / TIMER_DELIVER_MS) or half (TRAN_MSG)."""
        self._run.require()
        self._validate_message(msg)
        props = msg.properties
        transactional = props.get(Prop.TRAN_MSG) == "true"
        if transactional:
            if Prop.DELAY in props or Prop.TIMER_DELIVER_MS in props:
                raise MessageIllegal("a transactional message cannot be delayed")
            if producer_group is None:
                producer_group = props.get(Prop.PRODUCER_GROUP)
            if not producer_group:
                raise MessageIllegal("a transactional message needs its producer group")
            validate_group_name(producer_group)
            result = stored(msg.topic, self._tx.prepare(msg, producer_group))
            assert result.append is not None
            return SendResult(
                result.status,
                msg.unique_key or result.append.msg_id,
                result.append.msg_id,
                msg.topic,
                msg.queue_id,
                -1,
                result.append.wrote_offset,
                transaction_id=msg.unique_key or result.append.msg_id,
            )
        target = schedule_target(msg, self._levels, self._clock(), self._config.max_delay_ms)
        to_store = without_delay(msg) if target is None else scheduled_copy(msg, *target)
        result = stored(msg.topic, self._store.put_message(to_store))
        assert result.append is not None
        msg_id = msg.unique_key or result.append.msg_id
        recall = None
        if target is not None:
            recall = encode_recall_handle(msg.topic, target[0], result.append.queue_offset, msg_id)
        return SendResult(
            result.status,
            msg_id,
            result.append.msg_id,
            msg.topic,
            msg.queue_id,
            result.append.queue_offset if target is None else -1,
            result.append.wrote_offset,
            recall_handle=recall,
        )

    def send_batch(self, msgs: Sequence[Message]) -> list[SendResult]:
        """Store messages of one topic and queue together (no delay, no transaction).

        Messages that differ only in body, KEYS and UNIQ_KEY (a producer's usual batch) are
        stored as one record batch (`MessageStore.put_batch`: records written in one pass,
        with the first message's born time, as RocketMQ's MessageBatch); others, or a batch
        whose whole size passes `max_message_size`, message by message. Either way each
        message is its own record, with its own offsets and results."""
        return self._send_batch(msgs, wait=True)[0]

    def send_batch_pending(self, msgs: Sequence[Message]) -> tuple[list[SendResult], int]:
        """`send_batch` without waiting for the disk under SYNC_FLUSH: (results, end of the
        last record). The messages are written (page cache, visible to consumers) but not
        yet acknowledged: call `when_durable(end, callback)` and acknowledge them only once
        it reports True. Under ASYNC_FLUSH the results are final."""
        return self._send_batch(msgs, wait=False)

    def send_bodies(
        self,
        topic: str,
        queue_id: int,
        bodies: Sequence[bytes],
        uniq_keys: Sequence[str],
        properties: Mapping[str, str] | None = None,
        *,
        keys: Sequence[str] | None = None,
        born_timestamp: int | None = None,
        born_host: tuple[str, int] = ("127.0.0.1", 0),
        wait: bool = True,
    ) -> PutMessageResult | None:
        """`send_batch` of a producer's usual batch given as its parts, without a store
        `Message` or a `SendResult` per message (the in-process client's send, the server's
        SendMessage): one record per body, each with `properties` plus its UNIQ_KEY (and
        its KEYS when `keys` is given), the batch's born time (default: now) and host,
        validated as `send_batch` validates (the first message in full, then each body,
        unique key and keys), stored as one record batch (`MessageStore.put_batch`).
        `wait=False` is `send_batch_pending`'s: under SYNC_FLUSH acknowledge the records
        only once `when_durable` reports them on disk.

        The stored result (`append.record_offsets`, `append.msg_id_at`, queue offsets from
        `append.queue_offset`), `SendRejected` when not stored, or None when `put_batch`
        refuses the batch as a whole (nothing stored): send it with `send_batch`, which
        gives each message its own verdict."""
        self._run.require()
        if not bodies or len(bodies) != len(uniq_keys):
            raise MessageIllegal("a batch needs one unique key per body, at least one body")
        if keys is not None and len(keys) != len(bodies):
            raise MessageIllegal("a batch with keys needs one KEYS value per body")
        shared = dict(properties) if properties else {}
        if any(
            k in shared
            for k in (Prop.DELAY, Prop.TIMER_DELIVER_MS, Prop.TRAN_MSG, Prop.KEYS, Prop.UNIQ_KEY)
        ):
            raise MessageIllegal("a body batch cannot hold delayed or transactional messages")
        first = {**shared, Prop.UNIQ_KEY: uniq_keys[0]}
        if keys is not None:
            first[Prop.KEYS] = keys[0]
        self._validate_message(Message(topic, bodies[0], queue_id, 0, first))
        limit = self._config.max_message_size
        for body, key in zip(bodies, uniq_keys, strict=True):
            if type(body) is not bytes or not 0 < len(body) <= limit:
                # the precise error (or a body type the record batch does not take)
                self._validate_message(Message(topic, body, queue_id))
                return None
            if type(key) is not str or "\x01" in key or "\x02" in key:
                check_properties({Prop.UNIQ_KEY: key})  # raises the precise error
        if keys is not None:
            for value in keys:
                if type(value) is not str or "\x01" in value or "\x02" in value:
                    check_properties({Prop.KEYS: value})  # raises the precise error
        result = self._store.put_batch(
            topic,
            queue_id,
            bodies,
            shared,
            keys=keys,
            uniq_keys=uniq_keys,
            born_timestamp=born_timestamp,
            born_host=born_host,
            wait=wait,
        )
        if result.status in (
            PutMessageStatus.MESSAGE_ILLEGAL,
            PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
        ):
            return None
        return stored(topic, result)

    def _send_batch(self, msgs: Sequence[Message], *, wait: bool) -> tuple[list[SendResult], int]:
        self._run.require()
        if not msgs:
            raise MessageIllegal("a batch needs at least one message")
        self._validate_batch(msgs)
        fast = self._send_record_batch(msgs, wait)
        if fast is not None:
            return fast
        results = self._store.put_messages(list(msgs), wait=wait)
        out: list[SendResult] = []
        end = -1
        for m, r in zip(msgs, results, strict=True):
            stored(m.topic, r)
            assert r.append is not None
            end = max(end, r.append.wrote_offset + r.append.wrote_bytes)
            out.append(
                SendResult(
                    r.status,
                    m.unique_key or r.append.msg_id,
                    r.append.msg_id,
                    m.topic,
                    m.queue_id,
                    r.append.queue_offset,
                    r.append.wrote_offset,
                )
            )
        return out, end

    def _validate_batch(self, msgs: Sequence[Message]) -> None:
        """`_validate_message` for each message of a batch, the topic and the properties
        the messages share judged once: a message whose properties equal the first's but
        for KEYS and UNIQ_KEY (a producer's usual batch) has only its body and those two
        values checked; any other goes through the full check."""
        first = msgs[0]
        self._validate_message(first)
        fp = first.properties
        if Prop.DELAY in fp or Prop.TIMER_DELIVER_MS in fp or Prop.TRAN_MSG in fp:
            raise MessageIllegal("a batch cannot hold delayed or transactional messages")
        topic, queue_id, width = first.topic, first.queue_id, len(fp)
        shared = [(k, v) for k, v in fp.items() if k != Prop.KEYS and k != Prop.UNIQ_KEY]
        varying = width - len(shared)  # how many of KEYS, UNIQ_KEY the first one has
        limit = self._config.max_message_size
        for m in msgs[1:]:
            p = m.properties
            body = m.body
            if (
                type(m) is Message
                and type(body) is bytes
                and 0 < len(body) <= limit
                and m.topic == topic
                and m.queue_id == queue_id
                and len(p) == width
                and (Prop.KEYS in p) + (Prop.UNIQ_KEY in p) == varying
                and all(p.get(k) == v for k, v in shared)
            ):
                for k in (Prop.KEYS, Prop.UNIQ_KEY):
                    v = p.get(k)
                    if v is not None and (type(v) is not str or "\x01" in v or "\x02" in v):
                        check_properties({k: v})  # raises the precise error
                continue
            self._validate_message(m)
            if (m.topic, m.queue_id) != (topic, queue_id):
                raise MessageIllegal("every message of a batch goes to one topic and queue")
            if any(k in p for k in (Prop.DELAY, Prop.TIMER_DELIVER_MS, Prop.TRAN_MSG)):
                raise MessageIllegal("a batch cannot hold delayed or transactional messages")

    def _send_record_batch(
        self, msgs: Sequence[Message], wait: bool
    ) -> tuple[list[SendResult], int] | None:
        """`send_batch` through `put_batch`; None when the batch has not that shape or
        `put_batch` refuses it as a whole (then nothing was stored)."""
        first = msgs[0]
        props = first.properties
        has_keys, has_uniq = Prop.KEYS in props, Prop.UNIQ_KEY in props
        shared = {k: v for k, v in props.items() if k != Prop.KEYS and k != Prop.UNIQ_KEY}
        width = len(shared) + has_keys + has_uniq
        for m in msgs:
            p = m.properties
            if (
                m.flag != first.flag
                or m.sys_flag != first.sys_flag
                or m.reconsume_times
                or m.prepared_tx_offset
                or m.born_host != first.born_host
                or not isinstance(m.body, bytes)
                or len(p) != width
                or (Prop.KEYS in p) != has_keys
                or (Prop.UNIQ_KEY in p) != has_uniq
                or any(p.get(k) != v for k, v in shared.items())
            ):
                return None
        result = self._store.put_batch(
            first.topic,
            first.queue_id,
            [m.body for m in msgs],
            shared,
            keys=[m.properties[Prop.KEYS] for m in msgs] if has_keys else None,
            uniq_keys=[m.properties[Prop.UNIQ_KEY] for m in msgs] if has_uniq else None,
            flag=first.flag,
            sys_flag=first.sys_flag,
            born_timestamp=first.born_timestamp,
            born_host=first.born_host,
            wait=wait,
        )
        if result.status in (
            PutMessageStatus.MESSAGE_ILLEGAL,
            PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
        ):
            return None  # message by message: each gets its own verdict
        stored(first.topic, result)
        append = result.append
        assert append is not None
        status, msg_id_at, base = result.status, append.msg_id_at, append.queue_offset
        out: list[SendResult] = []
        for i, (m, offset) in enumerate(zip(msgs, append.record_offsets, strict=True)):
            offset_msg_id = msg_id_at(offset)
            out.append(
                _send_result(
                    status,
                    m.unique_key or offset_msg_id,
                    offset_msg_id,
                    m.topic,
                    m.queue_id,
                    base + i,
                    offset,
                )
            )
        return out, append.wrote_offset + append.wrote_bytes


def stored(topic: str, result: PutMessageResult) -> PutMessageResult:
    """`result`, when the message is stored; SendRejected with the put status's code
    otherwise."""
    if not result.status.stored or result.append is None:
        raise SendRejected(
            topic,
            result.status.value,
            PUT_STATUS_CODES.get(result.status, ResponseCode.SYSTEM_ERROR),
        )
    return result


# A frozen dataclass's __init__ sets each field through `object.__setattr__`; a record
# batch builds one SendResult per message, so `_send_result` sets the slots through their
# descriptors instead (about half the cost): the same frozen object, equal to the one
# `SendResult(...)` builds (a test holds them equal).
assert [f.name for f in dataclasses.fields(SendResult)] == [
    "status",
    "msg_id",
    "offset_msg_id",
    "topic",
    "queue_id",
    "queue_offset",
    "commitlog_offset",
    "transaction_id",
    "recall_handle",
]
(
    _set_status,
    _set_msg_id,
    _set_offset_msg_id,
    _set_topic,
    _set_queue_id,
    _set_queue_offset,
    _set_commitlog_offset,
    _set_transaction_id,
    _set_recall_handle,
) = (SendResult.__dict__[f.name].__set__ for f in dataclasses.fields(SendResult))
_new = object.__new__


def _send_result(
    status: PutMessageStatus,
    msg_id: str,
    offset_msg_id: str,
    topic: str,
    queue_id: int,
    queue_offset: int,
    commitlog_offset: int,
) -> SendResult:
    """`SendResult(status, msg_id, ..., commitlog_offset)`, without its __init__."""
    r: SendResult = _new(SendResult)
    _set_status(r, status)
    _set_msg_id(r, msg_id)
    _set_offset_msg_id(r, offset_msg_id)
    _set_topic(r, topic)
    _set_queue_id(r, queue_id)
    _set_queue_offset(r, queue_offset)
    _set_commitlog_offset(r, commitlog_offset)
    _set_transaction_id(r, None)
    _set_recall_handle(r, None)
    return r
