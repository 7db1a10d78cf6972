"""A sent message checked, and its queue chosen: what SendMessage does before storing.

The server chooses the queue (the client never sends one): round-robin over the topic's
write queues, or, for FIFO messages, a consistent hash of the message group so that one
group always lands in one queue (`group_queue`).
"""

from __future__ import annotations

import hashlib

from broker.server import convert, validation
from broker.server.clients import ClientHandlers
from broker.server.context import ServerContext
from broker.server.errors import Forbidden
from broker.server.group_resend import RETRY_TOPIC, check_group_resend
from broker.topic import PERM_WRITE, TopicConfig
from protocol.pb import definition_pb2

# what a message's record shares with the others of a record batch (`SendChecks.prepare`)
Shape = tuple[str, str, bool] | None
_MAX_TIMESTAMP_S, _MAX_NANOS = convert.MAX_TIMESTAMP_S, convert.MAX_NANOS
_RESEND_ALLOWED = frozenset({RETRY_TOPIC})


def jump_hash(key: int, buckets: int) -> int:
    """Jump consistent hash (Lamping & Veach): stable bucket for a key, minimal moves."""
    b, j = -1, 0
    key &= 0xFFFFFFFFFFFFFFFF
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & 0xFFFFFFFFFFFFFFFF
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


def group_queue(message_group: str, write_queues: int) -> int:
    digest = hashlib.sha256(message_group.encode()).digest()
    return jump_hash(int.from_bytes(digest[:8], "big"), write_queues)


class SendChecks:
    """Checks each message of a send and chooses its queue; keeps the round-robin turns."""

    def __init__(self, ctx: ServerContext, clients: ClientHandlers) -> None:
        self.ctx = ctx
        self.clients = clients
        self._round_robin: dict[str, int] = {}

    def prepare(
        self,
        pm: definition_pb2.Message,
        sp: definition_pb2.SystemProperties,
        queues: dict[str, int],
        accepted: dict[tuple[str, str], TopicConfig],
        named: set[str],
    ) -> tuple[str, int, Shape, bool]:
        """Check one message (`sp`: its system properties) and choose its queue: (topic,
        queue id, shape, whether it can go in a record batch: neither delayed nor
        transactional). Its shape is what its record shares with others of a producer's
        usual batch: (tag, message group, whether it has keys), or None when it carries
        user properties; see `ProducerHandlers._put_bodies`."""
        config = self.ctx.config
        topic = pm.topic.name
        if topic not in named:  # a request's messages mostly share their topic
            named.add(validation.check_topic(topic))
        validation.check_body(pm.body, config)
        tag = sp.tag if sp.HasField("tag") else ""
        if tag:
            validation.check_tag(tag)
        keys = sp.keys
        if keys:
            validation.check_keys(keys)
        message_type = convert.message_type_of(sp)
        grouped = sp.HasField("message_group")
        if grouped:
            validation.check_message_group(sp.message_group, config)
        user = pm.user_properties
        if user or tag or keys:
            if user and RETRY_TOPIC in user:  # a per-group resend, or refused
                check_group_resend(
                    topic,
                    user,
                    message_type,
                    enabled=config.group_resend,
                    group_config=self.clients.group_config,
                    existing_topic=self.ctx.broker.get_topic,
                )
                validation.check_properties(user, tag, keys, config, _RESEND_ALLOWED)
            else:
                validation.check_properties(user, tag, keys, config)
        delayed = sp.HasField("delivery_timestamp")
        if delayed:
            validation.check_delivery_time(
                convert.timestamp_ms(sp.delivery_timestamp), self.ctx.clock(), config
            )
        # a request's messages mostly share topic and type: the topic looked up once
        checked = accepted.get((topic, message_type))
        if checked is None:
            cfg = self.clients.topic_config(topic)
            validation.check_type_accepted(topic, cfg.message_type.value, message_type)
            if not cfg.perm & PERM_WRITE:
                raise Forbidden(f"topic {topic!r} is not writeable")
            checked = accepted[(topic, message_type)] = cfg
        cfg = checked
        transactional = message_type == "TRANSACTION"
        if grouped and sp.message_group:
            queue_id = group_queue(sp.message_group, cfg.write_queue_nums)
        else:
            queue_id = queues.get(topic, -1)
            if queue_id < 0:
                queue_id = queues[topic] = self.next_queue(cfg)
        if sp.HasField("born_timestamp"):  # in range, as `convert.to_store` requires
            born = sp.born_timestamp
            if not (0 <= born.seconds <= _MAX_TIMESTAMP_S and 0 <= born.nanos <= _MAX_NANOS):
                convert.timestamp_ms(born, "born timestamp")  # raises
        shape = None if user else (tag, sp.message_group if grouped else "", bool(keys))
        return topic, queue_id, shape, not (delayed or transactional)

    def _next_queue(self, cfg: TopicConfig) -> int:
        turn = self._round_robin.get(cfg.name, 0)
        self._round_robin[cfg.name] = turn + 1
        return turn % cfg.write_queue_nums

    def next_queue(self, cfg: TopicConfig) -> int:
        turn = self._round_robin.get(cfg.name, 0)
        self._round_robin[cfg.name] = turn + 1
        return turn % cfg.write_queue_nums

    def queue_for(self, cfg: TopicConfig, sp: definition_pb2.SystemProperties) -> int:
        if sp.HasField("message_group") and sp.message_group:
            return group_queue(sp.message_group, cfg.write_queue_nums)
        return self.next_queue(cfg)
