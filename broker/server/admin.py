"""Administration: topics and groups, against a running server or a stopped store.

`AdminOps` works on a `Broker` directly (the CLI's `--store` mode opens one on the store
directory). A running server exposes the same operations as the gRPC service
`reliable.admin.v1.Admin` on its own port: unary methods whose request and response bodies
are UTF-8 JSON objects (no generated stubs needed):

| method        | request                                              | result              |
|---------------|------------------------------------------------------|---------------------|
| `CreateTopic` | `{name, queues=4, perm=6, type=NORMAL}`              | the topic           |
| `ListTopics`  | `{}`                                                 | `{topics: [...]}`   |
| `GetTopic`    | `{name}`                                             | topic + queues      |
| `CreateGroup` | `{name, fifo=false, max_retries=16}`                 | the group           |
| `ListGroups`  | `{}`                                                 | `{groups: [...]}`   |
| `GetGroup`    | `{name, topic?}`                                     | group+consumers+lag |
| `SetGroupStart` | `{group, topic, consume_from=LAST, timestamp_ms?}` | `{queues: [...]}`   |
| `ParkMessageGroup` | `{group, topic, message_group}`                  | `{parked: bool}`    |
| `ListParkedGroups` | `{group?}`                                       | `{parked: [...]}`   |
| `UnparkMessageGroup` | `{group, topic, message_group}`                | `{unparked: bool}`  |
| `MakeGroupFifo` | `{group}`                                          | the group           |
| `HaStatus`    | `{}`                                                 | role, offsets, lag  |
| `PromoteBroker` | `{sync=false, force=false}`                        | before, after       |

`SetGroupStart` is what a consumer calls when it joins: on every queue of `topic` where the
group has no committed offset yet it commits the start (`FIRST`: the queue's first message
still held, `LAST`: its end, `TIMESTAMP`: the first message stored at/after `timestamp_ms`,
30 minutes ago by default); queues the group already consumed keep their offset. Without
it, a group's first receive starts at the queue's start while nothing was cleaned from it
(RocketMQ's pop behaviour).

`HaStatus` is the broker's replication state (docs/ha.md): its role, its commitlog end,
and for a master each connected slave's acknowledged offset and lag in bytes, for a slave
its master and its lag; `{"role": "none"}` for a single broker; for `--store`, the role
the store last ran with (`<store>/ha/role.json`), its log end, epochs and acknowledged
offset, and `"running": false`.
`PromoteBroker` turns a running slave into the master of its group (`broker.ha.node`);
a refusal is `FORBIDDEN` with a `reason` (`not-a-slave`, `not-caught-up`,
`master-alive`, `ha-port`).

`MakeGroupFifo` is what an orderly consumer calls when it joins: the server delivers a
group's messages in message-group order only when the group is FIFO, so the group is
created FIFO, or made FIFO keeping its other settings.

`ParkMessageGroup` is what an ordered consumer calls before it dead-letters the message it
gave up on: from then on the server moves every message of that message group to
`%DLQ%<group>` (in order, with `PARKED_MESSAGE_GROUP`) instead of delivering it, until an
operator calls `UnparkMessageGroup` (see `broker.parking`).

Messages (`QueryMessage`, `TraceMessage`, `SendMessage`, `ReconsumeMessage`),
`TopicStatus`, dead letters (`ListDeadLetters`, `ReplayDeadLetters`, `DeadLetterAudit`) and
groups (`GroupProgress`, `ResetGroupOffset`, `DeleteGroup`, `DeleteTopic`) and the store
(`StoreStatus`) are the operator operations of `broker.admin`, documented there.

`ReconsumeMessage` with a `client_id` (and `timeout_ms`, default 5,000, at most 60,000)
is served here rather than by `broker.admin`, because only a running server has clients:
it delivers the message to that one live consumer of the group on its Telemetry stream and
answers with the client's verdict, `{msg_id, group, client_id, source, consumed, status,
message, elapsed_ms}` (see `broker.server.direct`). A client that is not a live consumer of
the group is `NOT_FOUND` (with `details.live_clients`); one that does not answer in time is
`PROXY_TIMEOUT`.

A response is `{"ok": true, "result": ...}` or `{"ok": false, "code": "<protocol code name>",
"message": ..., "details"?: {...}}`. The same access keys as the messaging service apply.
The Python client of this service is `reliable.admin.AdminClient`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NoReturn

import grpc

from broker.admin import methods as operator_methods
from broker.admin import params as p
from broker.admin.messages import MessageOps, check_id
from broker.broker import Broker
from broker.errors import GroupNotFound, InvalidArgument, TopicNotFound
from broker.offsets import ConsumeFromWhere
from broker.server.calls import CallContext
from broker.server.context import ServerContext
from broker.server.direct import DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS
from broker.server.errors import BadRequest
from broker.server.status import code_of, status_of
from broker.server.validation import TOPIC_TYPES, check_group, check_topic
from broker.subscription import SubscriptionGroupConfig
from broker.topic import PERM_READ_WRITE, TopicConfig, perm_to_string
from protocol import admin as admin_wire
from protocol.admin import SERVICE, Params, Reply
from protocol.limits import DEFAULT_QUEUE_NUMS, DEFAULT_RETRY_MAX_TIMES

log = logging.getLogger(__name__)


def topic_json(cfg: TopicConfig) -> dict[str, object]:
    return {
        "name": cfg.name,
        "read_queues": cfg.read_queue_nums,
        "write_queues": cfg.write_queue_nums,
        "perm": cfg.perm,
        "perm_string": perm_to_string(cfg.perm),
        "type": cfg.message_type.value,
    }


def group_json(cfg: SubscriptionGroupConfig) -> dict[str, object]:
    return {
        "name": cfg.group,
        "fifo": cfg.fifo,
        "max_retries": cfg.retry_max_times,
        "max_delivery_attempts": cfg.max_delivery_attempts,
        "retry_queues": cfg.retry_queue_nums,
        "consume_enable": cfg.consume_enable,
        # not `consume_broadcast`: RocketMQ's "broadcasting allowed" flag, which nothing here
        # enforces, and a mode gRPC consumers cannot use (docs/client.md, Broadcasting)
    }


def _int(params: Params, name: str, default: int) -> int:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer")
    return value


class AdminOps:
    """The admin operations, blocking, on one broker."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.methods: dict[str, Callable[[Params], object]] = {
            "CreateTopic": self.create_topic,
            "ListTopics": self.list_topics,
            "GetTopic": self.get_topic,
            "CreateGroup": self.create_group,
            "ListGroups": self.list_groups,
            "GetGroup": self.get_group,
            "SetGroupStart": self.set_group_start,
            "ParkMessageGroup": self.park,
            "ListParkedGroups": self.list_parked,
            "UnparkMessageGroup": self.unpark,
            "MakeGroupFifo": self.make_group_fifo,
            "HaStatus": self._stored_ha_status,
            "PromoteBroker": self._no_promotion,
        }
        self.methods.update(operator_methods(broker))

    def _stored_ha_status(self, params: Params) -> dict[str, object]:
        """A stopped store: the role it last ran with (`broker.ha.state.stored_status`)."""
        from broker.ha.state import stored_status

        store = self.broker.store
        return stored_status(store.config.store_dir, store.get_commitlog_max_offset())

    @staticmethod
    def _no_promotion(params: Params) -> NoReturn:
        from broker.ha.errors import PromotionRefused

        raise PromotionRefused("not-a-slave", "a stopped store has no replication role")

    def call(self, method: str, params: Params) -> object:
        op = self.methods.get(method)
        if op is None:
            raise BadRequest(f"unknown admin method {method!r}")
        return op(params)

    def create_topic(self, params: Params) -> dict[str, object]:
        name = check_topic(str(params.get("name", "")))
        kind = str(params.get("type", "NORMAL")).upper()
        if kind not in TOPIC_TYPES:
            raise BadRequest(f"topic type must be one of {', '.join(TOPIC_TYPES)}")
        cfg = self.broker.create_topic(
            name,
            queues=_int(params, "queues", DEFAULT_QUEUE_NUMS),
            perm=_int(params, "perm", PERM_READ_WRITE),
            message_type=kind,
        )
        return topic_json(cfg)

    def list_topics(self, params: Params) -> dict[str, object]:
        return {"topics": [topic_json(c) for c in self.broker.topics()]}

    def get_topic(self, params: Params) -> dict[str, object]:
        name = str(params.get("name", ""))
        cfg = self.broker.get_topic(name)
        if cfg is None:
            raise TopicNotFound(name)
        out = topic_json(cfg)
        out["queues"] = [
            {
                "queue_id": q,
                "min_offset": self.broker.min_offset(name, q),
                "max_offset": self.broker.max_offset(name, q),
            }
            for q in range(max(cfg.read_queue_nums, cfg.write_queue_nums))
        ]
        return out

    def create_group(self, params: Params) -> dict[str, object]:
        name = check_group(str(params.get("name", "")))
        fifo = params.get("fifo", False)
        if not isinstance(fifo, bool):
            raise BadRequest("fifo must be true or false")
        cfg = self.broker.create_group(
            name, retry_max_times=_int(params, "max_retries", DEFAULT_RETRY_MAX_TIMES), fifo=fifo
        )
        return group_json(cfg)

    def make_group_fifo(self, params: Params) -> dict[str, object]:
        name = check_group(str(params.get("group", "")))
        cfg = self.broker.get_group(name)
        if cfg is None:
            if not self.broker.config.auto_create_subscription_group:
                from broker.server.errors import ConsumerGroupNotFound

                raise ConsumerGroupNotFound(f"consumer group {name!r} does not exist")
            # what the group would have been created with on first use, FIFO
            cfg = self.broker.create_group(
                name, retry_max_times=self.broker.config.default_retry_max_times, fifo=True
            )
        elif not cfg.fifo:
            cfg = self.broker.create_group(
                name,
                retry_max_times=cfg.retry_max_times,
                retry_queue_nums=cfg.retry_queue_nums,
                consume_broadcast=cfg.consume_broadcast,
                fifo=True,
                consume_enable=cfg.consume_enable,
            )
        return group_json(cfg)

    def list_groups(self, params: Params) -> dict[str, object]:
        return {"groups": [group_json(c) for c in self.broker.groups()]}

    def get_group(self, params: Params) -> dict[str, object]:
        name = str(params.get("name", ""))
        cfg = self.broker.get_group(name)
        if cfg is None:
            from broker.server.errors import ConsumerGroupNotFound

            raise ConsumerGroupNotFound(f"consumer group {name!r} does not exist")
        out = group_json(cfg)
        out["consumers"] = self.broker.consumer_ids(name)
        topic = params.get("topic")
        if topic:
            tcfg = self.broker.get_topic(str(topic))
            queues = tcfg.read_queue_nums if tcfg is not None else 0
            progress = []
            for q in range(queues):
                broker_offset = self.broker.max_offset(str(topic), q)
                consumer_offset = self.broker.query_offset(name, str(topic), q)
                progress.append(
                    {
                        "queue_id": q,
                        "broker_offset": broker_offset,
                        "consumer_offset": consumer_offset,
                        "lag": broker_offset - max(consumer_offset, 0),
                    }
                )
            out["progress"] = {"topic": topic, "queues": progress}
        return out

    def set_group_start(self, params: Params) -> dict[str, object]:
        group = check_group(str(params.get("group", "")))
        topic = check_topic(str(params.get("topic", "")))
        where = _STARTS.get(str(params.get("consume_from", "LAST")).upper())
        if where is None:
            raise BadRequest(f"consume_from must be one of {', '.join(_STARTS)}")
        timestamp = params.get("timestamp_ms")
        if timestamp is not None and (
            isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0
        ):
            raise BadRequest("timestamp_ms must be a non-negative integer")
        cfg = self.broker.get_topic(topic)
        if cfg is None:
            raise TopicNotFound(topic)
        queues = []
        for q in range(cfg.read_queue_nums):
            before = self.broker.query_offset(group, topic, q)
            offset = self.broker.initial_offset(group, topic, q, where, timestamp)
            queues.append({"queue_id": q, "offset": offset, "set": before < 0})
        return {"group": group, "topic": topic, "queues": queues}

    def list_parked(self, params: Params) -> dict[str, object]:
        group = params.get("group")
        return {
            "parked": self.broker.parked_message_groups(check_group(str(group)) if group else None)
        }

    @staticmethod
    def _parked_target(params: Params) -> tuple[str, str, str]:
        group = check_group(str(params.get("group", "")))
        topic = check_topic(str(params.get("topic", "")))
        message_group = params.get("message_group")
        if not isinstance(message_group, str) or not message_group:
            raise BadRequest("message_group must be a non-empty string")
        return group, topic, message_group

    def park(self, params: Params) -> dict[str, object]:
        return {"parked": self.broker.park_message_group(*self._parked_target(params))}

    def unpark(self, params: Params) -> dict[str, object]:
        return {"unparked": self.broker.unpark_message_group(*self._parked_target(params))}


_STARTS = {
    "FIRST": ConsumeFromWhere.FIRST_OFFSET,
    "LAST": ConsumeFromWhere.LAST_OFFSET,
    "TIMESTAMP": ConsumeFromWhere.TIMESTAMP,
}


def _decode(raw: bytes) -> dict[str, object]:
    value = admin_wire.decode(raw)
    return {"__malformed__": True} if value is None else value


async def reconsume_to_client(ctx: ServerContext, params: Params) -> dict[str, object]:
    """`ReconsumeMessage` with `client_id`: deliver the message to that one live client of
    the group on its Telemetry stream and return its verdict (`broker.server.direct`)."""
    msg_id = check_id(p.text(params, "id", required=True) or "")
    group = p.text(params, "group", required=True)
    client_id = p.text(params, "client_id", required=True)
    assert group is not None and client_id is not None
    topic = p.topic(params)
    timeout_ms = p.integer(params, "timeout_ms", DEFAULT_TIMEOUT_MS, minimum=1)
    assert timeout_ms is not None
    if timeout_ms > MAX_TIMEOUT_MS:
        raise InvalidArgument(f"timeout_ms must be at most {MAX_TIMEOUT_MS}, got {timeout_ms}")
    broker: Broker = ctx.broker
    if broker.get_group(group) is None:
        raise GroupNotFound(group)
    message_ops = MessageOps(broker)
    source = await ctx.run_in_pool(message_ops.pick_source, msg_id, topic)
    session = ctx.direct.client(group, client_id)
    verdict = await ctx.direct.deliver(session, source, timeout_ms)
    log.info(
        "direct delivery of %s to %s (group %s, operator %s): %s",
        msg_id,
        client_id[:128],
        group,
        (p.text(params, "operator") or "unknown")[:64],
        verdict["status"],
    )
    return {
        "msg_id": msg_id,
        "group": group,
        "client_id": client_id,
        "source": p.message_json(source),
        **verdict,
    }


def admin_handler(ctx: ServerContext) -> grpc.GenericRpcHandler:
    """The generic gRPC handler serving `reliable.admin.v1.Admin` over `ctx.broker`."""
    ops = AdminOps(ctx.broker)
    ops.methods["HaStatus"] = lambda params: (
        ctx.ha_status() if ctx.ha_status is not None else {"role": "none"}
    )

    def promote(params: Params) -> dict[str, object]:
        sync, force = params.get("sync", False), params.get("force", False)
        if not isinstance(sync, bool) or not isinstance(force, bool):
            raise BadRequest("sync and force must be true or false")
        if ctx.ha_promote is None:
            from broker.ha.errors import PromotionRefused

            raise PromotionRefused("not-a-slave", "this broker has no replication role")
        return ctx.ha_promote(sync=sync, force=force)

    ops.methods["PromoteBroker"] = promote

    def method(name: str) -> grpc.RpcMethodHandler[Params, Reply]:
        async def handle(params: Params, context: CallContext) -> Reply:
            try:
                ctx.call_info(context, require_client_id=False)
                if params.get("__malformed__"):
                    raise BadRequest("request body must be a JSON object")
                result: object
                if name == "ReconsumeMessage" and params.get("client_id") is not None:
                    result = await reconsume_to_client(ctx, params)
                else:
                    result = await ctx.run_in_pool(ops.call, name, params)
                return {"ok": True, "result": result}
            except Exception as exc:
                reply: Reply = {
                    "ok": False,
                    "code": code_of(exc).name,
                    "message": status_of(exc).message,
                }
                details = getattr(exc, "details", None)
                if isinstance(details, dict):
                    reply["details"] = details
                reason = getattr(exc, "reason", None)
                if isinstance(reason, str):
                    reply["reason"] = reason  # a refusal's kind, for clients to branch on
                return reply

        return grpc.unary_unary_rpc_method_handler(
            handle, request_deserializer=_decode, response_serializer=admin_wire.encode
        )

    return grpc.method_handlers_generic_handler(SERVICE, {n: method(n) for n in ops.methods})
