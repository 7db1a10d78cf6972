"""Find stored messages, send one, deliver one to a group again (mqadmin's queryMsgById /
queryMsgByKey / queryMsgByUniqueKey / queryMsgByOffset, sendMessage, and the dashboard's
"resend to this group").

`QueryMessage` takes exactly one form:

    {id}                          an offset message id or a client message id (UNIQ_KEY):
                                  both readings are tried, in every topic unless `topic`
    {key, topic}                  one of the messages' KEYS
    {unique_key, topic}           the UNIQ_KEY (client message id)
    {topic, queue, offset}        one queue offset
    {topic, since_ms?, until_ms?} stored in that time range (`queue` to narrow it)

plus `limit` (default 32, at most 1,000), `body` (include bodies) and, for id/key forms,
`since_ms`/`until_ms` to narrow the index lookup. The answer is `{"messages": [...], "more":
bool}`, newest first; `more` says the limit cut the answer (or the index scan budget ran
out first). The index holds 31-bit key hashes: every candidate record is decoded and kept
only when its topic and key match exactly, so a colliding key is never returned.

`ReconsumeMessage {id, group, topic?, operator?}` writes a copy of the message to
`%RETRY%<group>` (only that group reads it), keeping its UNIQ_KEY and properties and
stamping `OPERATOR_ACTION=reconsume` and `OPERATOR=<operator>`. With `client_id` it is
RocketMQ's CONSUME_MESSAGE_DIRECTLY instead: the running server delivers the message to
that one client and returns its verdict (`broker.server.admin`, `broker.server.direct`);
on a stopped store, which has no clients, `client_id` is refused (NOT_IMPLEMENTED).
"""

from __future__ import annotations

import heapq
import random
import secrets
from collections.abc import Iterator

from broker.admin import params as p
from broker.admin.params import MessageNotFound
from broker.broker import Broker
from broker.errors import (
    BrokerError,
    GroupNotFound,
    InvalidArgument,
    ResponseCode,
    TopicNotFound,
)
from broker.store import query
from broker.store.errors import InvalidQuery
from broker.store.message import Message, MessageExt, decode_offset_msg_id
from broker.store.store import MessageStore
from protocol.admin import Params
from protocol.names import (
    REVIVE_TOPIC,
    TRANS_OP_HALF_TOPIC,
    is_dlq_topic,
    is_retry_topic,
    is_system_topic,
)
from protocol.props import Prop

OPERATOR_ACTION = "OPERATOR_ACTION"  # what an operator did to produce this record
OPERATOR = "OPERATOR"  # who (as the admin command was told)
MAX_ID_LENGTH = 128
# properties a sender may not set by name: they are set from the command's own options or
# mean something to the broker
_RESERVED = frozenset(v for k, v in vars(Prop).items() if k.isupper() and isinstance(v, str))
# topics whose records are not messages (the pop state log, transaction ops)
_NOT_MESSAGES = frozenset({REVIVE_TOPIC, TRANS_OP_HALF_TOPIC})


class Unsupported(BrokerError):
    """The operation exists in RocketMQ but this broker cannot do it."""

    code = ResponseCode.REQUEST_CODE_NOT_SUPPORTED


class _UncappedIndex:
    """The store's index with the result cap of an admin query instead of the store's."""

    def __init__(self, store: MessageStore, cap: int) -> None:
        self._index = store.index
        self.max_query_results = cap

    def iter_offsets(
        self, topic: str, key: str, begin_ms: int, end_ms: int, max_scan: int = 100_000
    ) -> Iterator[int]:
        return self._index.iter_offsets(topic, key, begin_ms, end_ms, max_scan)


def check_id(value: str) -> str:
    if len(value) > MAX_ID_LENGTH or any(c.isspace() or not c.isprintable() for c in value):
        raise InvalidArgument(
            f"message id {value[:MAX_ID_LENGTH]!r} is not an id: at most "
            f"{MAX_ID_LENGTH} printable characters, no spaces"
        )
    return value


def is_original(msg: MessageExt) -> bool:
    """A record of the message as its producer sent it (not a retry, DLQ or schedule copy)."""
    return not (is_retry_topic(msg.topic) or is_dlq_topic(msg.topic) or is_system_topic(msg.topic))


def searchable_topics(store: MessageStore) -> list[str]:
    """Every topic whose records are messages (user, retry, DLQ, schedule, half messages)."""
    return [t for t in store.topics() if t not in _NOT_MESSAGES]


class MessageFinder:
    """The lookups every admin message operation shares; each result is exact."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.store = broker.store

    def by_key(
        self,
        topic: str,
        key: str,
        match: query.KeyMatch,
        limit: int,
        begin_ms: int = 0,
        end_ms: int | None = None,
    ) -> tuple[list[MessageExt], bool]:
        """Up to `limit` records of `topic` with `key`, newest first; (records, more)."""
        hits = query.query_by_key(
            _UncappedIndex(self.store, limit + 1),
            self.store.look_current_message,
            topic,
            key,
            max_num=limit + 1,
            begin_ms=begin_ms,
            end_ms=end_ms,
            match=match,
        )
        return hits[:limit], len(hits) > limit

    def by_offset_id(self, msg_id: str) -> MessageExt | None:
        try:
            decode_offset_msg_id(msg_id)
        except ValueError:
            return None  # not that form: only a client id can name it
        return self.store.look_message_by_msg_id(msg_id)

    def by_id(
        self,
        msg_id: str,
        topics: list[str],
        limit: int,
        begin_ms: int = 0,
        end_ms: int | None = None,
        match: query.KeyMatch = query.KeyMatch.UNIQUE_KEY,
    ) -> tuple[list[MessageExt], bool]:
        """Records an id names: the one at its offset (offset message id) and every record
        whose UNIQ_KEY (or, with KeyMatch.ANY, a KEY) it is, in `topics`; newest first."""
        found: dict[int, MessageExt] = {}
        more = False
        direct = self.by_offset_id(msg_id)
        if direct is not None and (direct.topic in topics):
            found[direct.commitlog_offset] = direct
        if " " not in msg_id:
            for topic in topics:
                hits, cut = self.by_key(topic, msg_id, match, limit, begin_ms, end_ms)
                more = more or cut
                for m in hits:
                    found.setdefault(m.commitlog_offset, m)
        ordered = sorted(
            found.values(), key=lambda m: (m.store_timestamp, m.commitlog_offset), reverse=True
        )
        return ordered[:limit], more or len(ordered) > limit

    def by_time(
        self, topic: str, queues: list[int], since_ms: int, until_ms: int | None, limit: int
    ) -> tuple[list[MessageExt], bool]:
        """Records of `topic` stored in [since, until], newest first across its queues."""
        newest: list[Iterator[tuple[int, int, MessageExt]]] = []
        for q in queues:
            lo = self.store.get_offset_in_queue_by_time(topic, q, since_ms)
            hi = (
                self.store.get_max_offset_in_queue(topic, q)
                if until_ms is None
                else self.store.get_offset_in_queue_by_time(topic, q, until_ms + 1)
            )
            lo = max(lo, self.store.get_min_offset_in_queue(topic, q))
            if hi > lo:
                newest.append(self._downwards(topic, q, lo, hi, since_ms, until_ms))
        picked: list[MessageExt] = []
        for _t, _c, m in heapq.merge(*newest, reverse=True):  # lazily: reads limit + 1
            if len(picked) >= limit:
                return picked, True
            picked.append(m)
        return picked, False

    def _downwards(
        self, topic: str, q: int, lo: int, hi: int, since_ms: int, until_ms: int | None
    ) -> Iterator[tuple[int, int, MessageExt]]:
        for offset in range(hi - 1, lo - 1, -1):
            m = self.store.get_message_by_queue_offset(topic, q, offset)
            if (
                m is None
                or m.store_timestamp < since_ms
                or (until_ms is not None and m.store_timestamp > until_ms)
            ):
                continue
            yield m.store_timestamp, m.commitlog_offset, m


class MessageOps:
    """QueryMessage, SendMessage, ReconsumeMessage on one broker."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.find = MessageFinder(broker)

    # ------------------------------------------------------------------ query
    def query(self, params: Params) -> dict[str, object]:
        limit = p.limit(params)
        body = p.flag(params, "body")
        msg_id = p.text(params, "id")
        key = p.text(params, "key")
        unique_key = p.text(params, "unique_key")
        topic = p.topic(params)
        queue = p.integer(params, "queue")
        offset = p.integer(params, "offset")
        since = p.integer(params, "since_ms")
        until = p.integer(params, "until_ms")
        if since is not None and until is not None and until < since:
            raise InvalidArgument(f"until_ms ({until}) is before since_ms ({since})")
        forms = [
            name
            for name, value in (
                ("id", msg_id),
                ("key", key),
                ("unique_key", unique_key),
                ("offset", offset),
            )
            if value is not None
        ]
        if len(forms) > 1:
            raise InvalidArgument(
                f"give one of id, key, unique_key, offset; got {', '.join(forms)}"
            )
        begin, end = since or 0, until
        if topic is not None:
            self._check_where(topic, queue)
        if msg_id is not None:
            check_id(msg_id)
            topics = [topic] if topic else searchable_topics(self.broker.store)
            found, more = self.find.by_id(msg_id, topics, limit, begin, end)
        elif key is not None or unique_key is not None:
            if topic is None:
                raise InvalidArgument("a key or unique key query needs a topic")
            match = query.KeyMatch.KEYS if key is not None else query.KeyMatch.UNIQUE_KEY
            value = key if key is not None else unique_key
            assert value is not None
            try:
                found, more = self.find.by_key(topic, value, match, limit, begin, end)
            except InvalidQuery as exc:
                raise InvalidArgument(str(exc)) from None
        elif offset is not None:
            if topic is None or queue is None:
                raise InvalidArgument("an offset query needs a topic and a queue")
            m = self.broker.store.get_message_by_queue_offset(topic, queue, offset)
            found, more = ([m] if m is not None else []), False
        elif topic is not None and (since is not None or until is not None):
            queues = [queue] if queue is not None else self.broker.store.queue_ids(topic)
            found, more = self.find.by_time(topic, queues, since or 0, until, limit)
        else:
            raise InvalidArgument(
                "give id; key or unique_key with topic; topic, queue and "
                "offset; or topic with since_ms and/or until_ms"
            )
        return {"messages": [p.message_json(m, body=body) for m in found], "more": more}

    def _check_where(self, topic: str, queue: int | None) -> None:
        """A query of a topic that does not exist, or of a queue it does not have, says
        so: "no message found" would hide a misspelt name or a wrong queue."""
        store = self.broker.store
        cfg = self.broker.get_topic(topic)
        held = store.queue_ids(topic)
        if cfg is None and not held:
            raise TopicNotFound(topic)
        if queue is None:
            return
        count = max(cfg.read_queue_nums, cfg.write_queue_nums) if cfg is not None else 0
        if not 0 <= queue < count and queue not in held:
            have = f"queues 0..{count - 1}" if count else f"queues {held}"
            raise InvalidArgument(f"queue {queue} is out of range: topic {topic!r} has {have}")

    # ------------------------------------------------------------------ send
    def send(self, params: Params) -> dict[str, object]:
        topic = p.topic(params, required=True)
        assert topic is not None
        raw = params.get("body")
        body_hex = p.text(params, "body_hex")
        if body_hex is not None:
            try:
                body = bytes.fromhex(body_hex)
            except ValueError:
                raise InvalidArgument("body_hex is not hexadecimal") from None
        elif isinstance(raw, str):
            body = raw.encode()
        else:
            raise InvalidArgument("body (a string) or body_hex is required")
        keys = params.get("keys") or []
        if not isinstance(keys, list) or not all(
            isinstance(k, str) and k and " " not in k for k in keys
        ):
            raise InvalidArgument("keys must be a list of non-empty strings without spaces")
        tag = p.text(params, "tag")
        user = params.get("properties") or {}
        if not isinstance(user, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in user.items()
        ):
            raise InvalidArgument("properties must be an object of strings")
        reserved = sorted(set(user) & _RESERVED)
        if reserved:
            raise InvalidArgument(
                f"properties {', '.join(reserved)} are set by the broker or "
                "by the command's own options"
            )
        msg_id = p.text(params, "message_id") or secrets.token_hex(16).upper()
        check_id(msg_id)
        props = dict(user)
        props[Prop.UNIQ_KEY] = msg_id
        if keys:
            props[Prop.KEYS] = " ".join(keys)
        if tag is not None:
            props[Prop.TAGS] = tag
        route = self.broker.route(topic)
        queue = p.integer(params, "queue")
        if queue is None:
            queue = random.randrange(route.write_queue_nums)
        result = self.broker.send_message(
            Message(topic=topic, body=body, queue_id=queue, properties=props)
        )
        return {
            "msg_id": result.msg_id,
            "offset_msg_id": result.offset_msg_id,
            "topic": result.topic,
            "queue_id": result.queue_id,
            "queue_offset": result.queue_offset,
            "commitlog_offset": result.commitlog_offset,
            "status": result.status.value,
        }

    # ------------------------------------------------------------------ reconsume
    def reconsume(self, params: Params) -> dict[str, object]:
        msg_id = check_id(p.text(params, "id", required=True) or "")
        group = p.text(params, "group", required=True)
        assert group is not None
        topic = p.topic(params)
        operator = p.text(params, "operator") or "unknown"
        if p.text(params, "client_id") is not None:
            # a running server serves this form itself (broker.server.admin): here there is
            # only a store, and a stopped store has no clients
            raise Unsupported(
                "delivering a message to one client needs a running broker (--endpoint): "
                "a stopped store has no connected clients"
            )
        if self.broker.get_group(group) is None:
            raise GroupNotFound(group)
        source = self.pick_source(msg_id, topic)
        sent = self.broker.reconsume_directly(
            group,
            source.commitlog_offset,
            properties={OPERATOR_ACTION: "reconsume", OPERATOR: operator},
        )
        return {
            "msg_id": sent.msg_id,
            "group": group,
            "source": p.message_json(source),
            "copy": {
                "topic": sent.topic,
                "queue_id": sent.queue_id,
                "queue_offset": sent.queue_offset,
                "commitlog_offset": sent.commitlog_offset,
                "offset_msg_id": sent.offset_msg_id,
            },
        }

    def pick_source(self, msg_id: str, topic: str | None) -> MessageExt:
        """The record to deliver again: the producer's original (newest, if sent twice),
        else the newest dead-letter copy, else the newest retry copy."""
        topics = [topic] if topic else searchable_topics(self.broker.store)
        found, _ = self.find.by_id(msg_id, topics, p.MAX_LIMIT)
        if not found:
            raise MessageNotFound(f"with id {msg_id!r}" + (f" in topic {topic!r}" if topic else ""))
        originals = [m for m in found if is_original(m)]
        if len({m.topic for m in originals}) > 1:
            raise InvalidArgument(
                f"id {msg_id!r} names messages in topics "
                f"{', '.join(sorted({m.topic for m in originals}))}: "
                "give the topic"
            )
        dead = [m for m in found if is_dlq_topic(m.topic)]
        copies = [m for m in found if is_retry_topic(m.topic)]
        usable = originals or dead or copies
        if not usable:  # only a delayed or half message: not deliverable yet
            raise InvalidArgument(
                f"id {msg_id!r} names only {found[0].topic} records (a "
                "delayed or transactional message not delivered yet)"
            )
        return usable[0]
