"""The grpc transport's consumer side: one client identity and Telemetry stream per
group, ReceiveMessage, acks (one, many, pipelined), invisible-time changes, dead-lettering,
offsets, what the server's Settings say of a group, and group administration through our
server's admin service.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import grpc

from broker.config import DEFAULT_DELAY_LEVELS_MS
from reliable.errors import (
    BadRequest,
    BrokerCallError,
    FailureKind,
    ReceiptHandleError,
    ReliableError,
    TransportError,
)
from reliable.message import ReceivedMessage
from reliable.transport import _grpc_wire as wire
from reliable.transport._grpc_session import GrpcSession
from reliable.transport._pb import definition_pb2, service_pb2
from reliable.transport.base import ConsumeFrom, DirectListener, QueueRef

log = logging.getLogger("reliable.transport.grpc")

_NO_ADMIN = {
    "SetGroupStart": "a new consumer group starts where the server's default puts it "
    "(set it with mqadmin resetOffsetByTime)",
    "ParkMessageGroup": "parked message groups are kept by each consumer only",
    "MakeGroupFifo": "an orderly consumer's group must be FIFO on the server "
    "(mqadmin updateSubGroup -o true)",
}


class _ConsumerIdentity:
    def __init__(self, group: str, client_id: str) -> None:
        self.group = group
        self.client_id = client_id
        self.subscriptions: dict[str, Collection[str] | None] = {}
        self.stream: wire.Telemetry | None = None  # to the access point's server
        self.streams: dict[str, wire.Telemetry] = {}  # group master's target -> its stream
        self.waited = False
        self.warned_fifo = False


class ConsumerSide(GrpcSession):
    """Receiving, acknowledging and offsets over the session."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._consumers: dict[str, _ConsumerIdentity] = {}
        self._no_admin: set[str] = set()
        self._direct: dict[str, DirectListener] = {}  # group -> who consumes direct deliveries
        self._turns: dict[tuple[str, str], int] = {}  # (group, topic) -> receives made

    def _end_clients(self) -> None:
        for identity in list(self._consumers.values()):
            self._terminate(identity.client_id, identity.group, identity.stream, identity.streams)
        self._consumers.clear()
        super()._end_clients()

    # --- offsets (GetOffset / QueryOffset: what the Apache proxy offers pull consumers)
    def _message_queue(self, target: Any, queue: QueueRef) -> None:
        self._resource(target.topic, queue.topic)
        target.id = queue.queue_id
        target.permission = wire.READ_WRITE
        target.broker.name = queue.broker
        target.broker.endpoints.CopyFrom(self.endpoints_of(queue.broker))

    def query_offset(self, group: str, queue: QueueRef) -> int:
        """The group's committed offset on `queue` (GetOffset), -1 when it has none."""
        request = service_pb2.GetOffsetRequest()
        self._resource(request.group, group)
        self._message_queue(request.message_queue, queue)
        try:
            return int(self._unary("GetOffset", request, broker=self._known(queue.broker)).offset)
        except BrokerCallError as exc:
            if exc.code == "OFFSET_NOT_FOUND":
                return -1
            raise

    def _queue_offset(
        self, queue: QueueRef, policy: definition_pb2.QueryOffsetPolicy.ValueType
    ) -> int:
        request = service_pb2.QueryOffsetRequest()
        self._message_queue(request.message_queue, queue)
        request.query_offset_policy = policy
        return int(self._unary("QueryOffset", request, broker=self._known(queue.broker)).offset)

    def min_offset(self, queue: QueueRef) -> int:
        """The queue's smallest offset still held (QueryOffset BEGINNING)."""
        return self._queue_offset(queue, wire.OFFSET_BEGINNING)

    def max_offset(self, queue: QueueRef) -> int:
        """One past the queue's last offset (QueryOffset END)."""
        return self._queue_offset(queue, wire.OFFSET_END)

    # --- consumers
    def _consumer(
        self, group: str, topic: str | None = None, tags: Collection[str] | None = None
    ) -> _ConsumerIdentity:
        with self._lock:
            identity = self._consumers.get(group)
            changed = False
            if identity is None:
                identity = _ConsumerIdentity(group, f"{self._base_id}@{group}")
                self._consumers[group] = identity
                changed = True
            if topic is not None and topic not in identity.subscriptions:
                identity.subscriptions[topic] = tags
                changed = True
            if identity.stream is None:
                self._require()
                identity.stream = self._consumer_stream(identity, None)
                for target in self.group_targets():
                    identity.streams[target] = self._consumer_stream(identity, target)
            elif changed:
                for stream in (identity.stream, *identity.streams.values()):
                    stream.resend_settings()
        if not identity.waited:  # once: the server's Settings tell FIFO and max attempts
            identity.stream.ready.wait(self._settings_timeout)
            identity.waited = True
        return identity

    def _consumer_stream(self, identity: _ConsumerIdentity, target: str | None) -> wire.Telemetry:
        """A Telemetry stream of `identity` to `target` (None: the access point): its
        Settings, and the direct deliveries that server sends it."""
        group = identity.group
        return wire.Telemetry(
            self.telemetry_host(target),
            identity.client_id,
            lambda: self._consumer_settings(identity),
            lambda _c: None,
            lambda pm: self._consume_directly(group, pm),
        )

    def _target_learned(self, target: str) -> None:
        super()._target_learned(target)
        with self._lock:
            for identity in self._consumers.values():
                if identity.stream is not None and target not in identity.streams:
                    identity.streams[target] = self._consumer_stream(identity, target)

    # --- direct delivery (the server's verify_message_command)
    def consumer_client_id(self, group: str) -> str:
        """The client id (`x-mq-client-id`) this transport consumes `group` under: the id
        `reliable admin group show` lists and `message reconsume --client` names."""
        return self._client_of(group)

    def set_direct_listener(self, group: str, listener: DirectListener | None) -> None:
        """Run `listener` on the messages the server delivers directly to this client of
        `group` (None: answer that nothing here consumes them)."""
        with self._lock:
            if listener is None:
                self._direct.pop(group, None)
            else:
                self._direct[group] = listener

    def _consume_directly(self, group: str, pm: Any) -> wire.Verdict:
        listener = self._direct.get(group)
        if listener is None:
            return (
                wire.NOT_IMPLEMENTED,
                f"client {self._client_of(group)} has no listener for group {group}: only "
                "a running push consumer consumes a message directly",
            )
        consumed, text = listener(wire.to_received(pm, group))
        return (wire.OK, "") if consumed else (wire.FAILED_TO_CONSUME, text)

    def _consumer_settings(self, identity: _ConsumerIdentity) -> Any:
        settings = definition_pb2.Settings()
        settings.client_type = wire.SIMPLE_CONSUMER
        settings.access_point.CopyFrom(self._access_point)
        settings.request_timeout.seconds = int(self._timeout)
        sub = settings.subscription
        self._resource(sub.group, identity.group)
        for topic, tags in sorted(identity.subscriptions.items()):
            entry = sub.subscriptions.add()
            self._resource(entry.topic, topic)
            entry.expression.type = wire.TAG
            entry.expression.expression = " || ".join(sorted(tags)) if tags else "*"
        sub.long_polling_timeout.seconds = 20
        settings.user_agent.language = wire.PYTHON
        settings.user_agent.version = wire.VERSION
        return settings

    def heartbeat(
        self, client_id: str, group: str, subscriptions: Mapping[str, Collection[str] | None]
    ) -> None:
        identity = self._consumer(group)
        changed = False
        with self._lock:
            for topic, tags in subscriptions.items():
                if identity.subscriptions.get(topic, ()) != tags:
                    identity.subscriptions[topic] = tags
                    changed = True
        if changed and identity.stream is not None:
            for stream in (identity.stream, *identity.streams.values()):
                stream.resend_settings()
        request = service_pb2.HeartbeatRequest()
        request.client_type = wire.SIMPLE_CONSUMER
        self._resource(request.group, group)
        self._unary("Heartbeat", request, identity.client_id)

    def unregister(self, client_id: str, group: str) -> None:
        with self._lock:
            identity = self._consumers.pop(group, None)
        if identity is not None and self.stub is not None:
            self._terminate(identity.client_id, group, identity.stream, identity.streams)

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
        auto_renew: bool = False,
    ) -> list[ReceivedMessage]:
        identity = self._consumer(group, topic, tags)
        if (
            fifo
            and not identity.warned_fifo
            and identity.stream is not None
            and identity.stream.reply is not None
            and not identity.stream.reply.subscription.fifo
        ):
            identity.warned_fifo = True
            log.warning(
                "group %s consumes in order but the server's group is not FIFO: "
                "create it with fifo (reliable admin group create %s --fifo; "
                "mqadmin updateSubGroup -o true)",
                group,
                group,
            )
        if topic not in self._brokers:
            self.route(topic)
        # a cluster's groups (several brokers at their own endpoints): each receive asks the
        # next group in turn, as the official SimpleConsumer does
        brokers = self.read_brokers(topic)
        broker: str | None = None
        if brokers:
            turn = self._turns.get((group, topic), 0)
            self._turns[(group, topic)] = turn + 1
            broker = brokers[turn % len(brokers)]
        request = service_pb2.ReceiveMessageRequest()
        self._resource(request.group, group)
        mq = request.message_queue
        self._resource(mq.topic, topic)
        mq.id = -1
        mq.permission = wire.READ_WRITE
        mq.broker.name = broker or self._brokers.get(topic, "")
        mq.broker.endpoints.CopyFrom(self.endpoints_of(broker))
        request.filter_expression.type = wire.TAG
        request.filter_expression.expression = " || ".join(sorted(tags)) if tags else "*"
        request.batch_size = max_msgs
        wire.set_ms(request.invisible_duration, invisible_ms)
        request.auto_renew = auto_renew  # the server renews until ack / nack / termination
        poll_ms = max(long_poll_ms, 0)
        wire.set_ms(request.long_polling_timeout, poll_ms)
        # a server may poll longer than asked (the proxy's floor is 5 s): leave it room
        wait_s = max(poll_ms, wire.MIN_LONG_POLL_MS) / 1000 + 1.0
        metadata = self.metadata(identity.client_id)
        timeout = self._timeout + wait_s
        if broker is not None:
            return self._receive_from(broker, request, group, timeout, metadata)
        stub = self._require()
        if self.batch_receive is not False:
            batched = self._receive_batched(request, group, timeout, metadata)
            if batched is not None:
                return batched
        return self._stream_receive(stub, self.endpoint, request, group, timeout, metadata)

    def _receive_from(
        self, broker: str, request: Any, group: str, timeout: float, metadata: Any
    ) -> list[ReceivedMessage]:
        """ReceiveMessage from one broker group; each message remembers its group (`source`),
        where its ack, invisible-time change or dead-lettering must go."""
        stub, target = self.stub_for(broker)
        topic = request.message_queue.topic.name
        return self._stream_receive(
            stub,
            target,
            request,
            group,
            timeout,
            metadata,
            source=_FromGroup(broker),
            gone=lambda: self._forget_route(topic),  # a group may be gone
        )

    @staticmethod
    def _stream_receive(
        stub: Any,
        target: str,
        request: Any,
        group: str,
        timeout: float,
        metadata: Any,
        source: Any = None,
        gone: Callable[[], None] | None = None,
    ) -> list[ReceivedMessage]:
        """The protocol's ReceiveMessage: a status, one response per message; `gone` is
        called when the call itself fails."""
        status: Any = None
        out: list[ReceivedMessage] = []
        try:
            for response in stub.ReceiveMessage(request, timeout=timeout, metadata=metadata):
                kind = response.WhichOneof("content")
                if kind == "status":
                    status = response.status
                elif kind == "message":
                    received = wire.to_received(response.message, group)
                    if source is not None:
                        received.source = source
                    out.append(received)
        except grpc.RpcError as exc:
            if gone is not None:
                gone()
            raise TransportError(
                f"ReceiveMessage from {target}: {exc.code().name}: {exc.details()}"
            ) from None
        if status is not None:
            try:
                wire.check_status(status, "ReceiveMessage")
            except BrokerCallError as exc:
                # e.g. a slave that served its dead master's group refuses once the master
                # is back: the next route names the master again
                if gone is not None and exc.kind is FailureKind.TRY_ELSEWHERE:
                    gone()
                raise
        return out

    def _known(self, broker: str | None) -> str | None:
        return broker if broker in self._broker_targets else None

    def _receive_batched(
        self, request: Any, group: str, timeout: float, metadata: list[tuple[str, str]]
    ) -> list[ReceivedMessage] | None:
        """The server's batch receive (`reliable.v1.BatchMessaging/ReceiveMessages`): the
        whole batch in one response. None when the server does not offer it (an Apache
        RocketMQ proxy answers UNIMPLEMENTED): this session then uses ReceiveMessage."""
        call = self.receive_messages
        if call is None:
            self._require()
            call = self.receive_messages
        try:
            response = call(request, timeout=timeout, metadata=metadata)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.info("%s has no batch receive: using ReceiveMessage", self.endpoint)
                self.batch_receive = False
                return None
            raise TransportError(
                f"ReceiveMessages from {self.endpoint}: {exc.code().name}: {exc.details()}"
            ) from None
        self.batch_receive = True
        if response.HasField("status"):
            wire.check_status(response.status, "ReceiveMessage")
        to_received = wire.to_received
        return [to_received(m, group) for m in response.messages]

    def _handle(self, message: ReceivedMessage) -> str:
        if not message.receipt_handle:
            raise ReceiptHandleError("", "the message carries no receipt handle")
        return message.receipt_handle

    def _client_of(self, group: str) -> str:
        identity = self._consumers.get(group)
        return identity.client_id if identity is not None else f"{self._base_id}@{group}"

    def ack(self, group: str, message: ReceivedMessage) -> None:
        request = service_pb2.AckMessageRequest()
        self._resource(request.group, group)
        self._resource(request.topic, message.topic)
        entry = request.entries.add()
        entry.message_id, entry.receipt_handle = message.message_id, self._handle(message)
        self._unary("AckMessage", request, self._client_of(group), broker=_group_of(message))

    def _ack_request(self, group: str, messages: Sequence[ReceivedMessage]) -> Any:
        request = service_pb2.AckMessageRequest()
        self._resource(request.group, group)
        self._resource(request.topic, messages[0].topic)
        for m in messages:
            if m.topic != messages[0].topic:
                raise BadRequest("one AckMessage acks messages of one topic")
            entry = request.entries.add()
            entry.message_id, entry.receipt_handle = m.message_id, self._handle(m)
        return request

    @staticmethod
    def _ack_results(
        messages: Sequence[ReceivedMessage], response: Any
    ) -> list[BaseException | None]:
        if len(response.entries) != len(messages):
            return [wire.miscounted(response, "AckMessage", len(messages))] * len(messages)
        out: list[BaseException | None] = []
        for entry in response.entries:
            try:
                wire.check_status(
                    entry.status if entry.HasField("status") else response.status, "AckMessage"
                )
                out.append(None)
            except ReliableError as exc:
                out.append(exc)
        return out

    def ack_many(
        self, group: str, messages: Sequence[ReceivedMessage]
    ) -> list[BaseException | None]:
        """Ack messages of one topic in one AckMessage (repeated entries): per message None
        or the error its entry reports; a failed request raises."""
        if not messages:
            return []
        parts = _by_group(messages)
        if len(parts) > 1:  # a cluster's groups: one AckMessage to each
            results: dict[int, BaseException | None] = {}
            for broker, indexed in parts.items():
                part = [m for _, m in indexed]
                for (i, _), result in zip(
                    indexed, self._ack_many_to(broker, group, part), strict=True
                ):
                    results[i] = result
            return [results[i] for i in range(len(messages))]
        return self._ack_many_to(next(iter(parts)), group, messages)

    def _ack_many_to(
        self, broker: str | None, group: str, messages: Sequence[ReceivedMessage]
    ) -> list[BaseException | None]:
        request = self._ack_request(group, messages)
        stub, target = self.stub_for(broker) if broker else (self._require(), self.endpoint)
        self.requests["AckMessage"] += 1
        try:
            response = stub.AckMessage(
                request, timeout=self._timeout, metadata=self.metadata(self._client_of(group))
            )
        except grpc.RpcError as exc:
            raise wire.call_failure("AckMessage", target, exc) from None
        return self._ack_results(messages, response)

    def submit_ack(
        self,
        group: str,
        messages: Sequence[ReceivedMessage],
        done: Callable[[list[BaseException | None] | BaseException], None],
    ) -> None:
        """`ack_many` without waiting: `done` gets the per-message results (or the request's
        error) on gRPC's completion thread."""
        parts = _by_group(messages)
        if len(parts) > 1:  # a cluster's groups: one AckMessage to each, results merged
            self._submit_acks_split(group, messages, parts, done)
            return
        broker = next(iter(parts))
        request = self._ack_request(group, messages)
        stub, target = self.stub_for(broker) if broker else (self._require(), self.endpoint)
        self.requests["AckMessage"] += 1
        call = stub.AckMessage.future(
            request, timeout=self._timeout, metadata=self.metadata(self._client_of(group))
        )
        self._when_answered(
            call, "AckMessage", lambda r: self._ack_results(messages, r), done, target=target
        )

    def _submit_acks_split(
        self,
        group: str,
        messages: Sequence[ReceivedMessage],
        parts: dict[str | None, list[tuple[int, ReceivedMessage]]],
        done: Callable[[list[BaseException | None] | BaseException], None],
    ) -> None:
        results: list[BaseException | None] = [None] * len(messages)
        pending = [len(parts)]
        lock = threading.Lock()

        def one(indexed: list[tuple[int, ReceivedMessage]]) -> Callable[[Any], None]:
            def finished(outcome: list[BaseException | None] | BaseException) -> None:
                for n, (i, _) in enumerate(indexed):
                    results[i] = outcome if isinstance(outcome, BaseException) else outcome[n]
                with lock:
                    pending[0] -= 1
                    last = pending[0] == 0
                if last:
                    done(results)

            return finished

        for indexed in parts.values():
            self.submit_ack(group, [m for _, m in indexed], one(indexed))

    def _change_request(self, group: str, message: ReceivedMessage, invisible_ms: int) -> Any:
        request = service_pb2.ChangeInvisibleDurationRequest()
        self._resource(request.group, group)
        self._resource(request.topic, message.topic)
        request.receipt_handle = self._handle(message)
        request.message_id = message.message_id
        wire.set_ms(request.invisible_duration, invisible_ms)
        return request

    def change_invisible_duration(
        self, group: str, message: ReceivedMessage, invisible_ms: int
    ) -> str:
        request = self._change_request(group, message, invisible_ms)
        response = self._unary(
            "ChangeInvisibleDuration", request, self._client_of(group), broker=_group_of(message)
        )
        message.receipt_handle = str(response.receipt_handle)
        return message.receipt_handle

    def submit_change_invisible(
        self,
        group: str,
        message: ReceivedMessage,
        invisible_ms: int,
        done: Callable[[str | BaseException], None],
    ) -> None:
        """`change_invisible_duration` without waiting (the protocol's request carries one
        handle, so these are pipelined rather than batched): `done` gets the new handle
        (also stored on `message`) or the error, on gRPC's completion thread."""
        request = self._change_request(group, message, invisible_ms)
        broker = _group_of(message)
        stub, target = self.stub_for(broker) if broker else (self._require(), self.endpoint)
        call = stub.ChangeInvisibleDuration.future(
            request, timeout=self._timeout, metadata=self.metadata(self._client_of(group))
        )

        def finished(f: Any) -> None:
            try:
                response = f.result()
                wire.check_status(response.status, "ChangeInvisibleDuration")
            except grpc.RpcError as exc:
                done(
                    TransportError(
                        f"ChangeInvisibleDuration to {target}: {exc.code().name}: {exc.details()}"
                    )
                )
                return
            except Exception as exc:
                done(exc)
                return
            message.receipt_handle = str(response.receipt_handle)
            done(message.receipt_handle)

        call.add_done_callback(finished)

    def forward_to_dlq(self, group: str, message: ReceivedMessage) -> None:
        request = service_pb2.ForwardMessageToDeadLetterQueueRequest()
        self._resource(request.group, group)
        self._resource(request.topic, message.topic)
        request.receipt_handle = self._handle(message)
        request.message_id = message.message_id
        request.delivery_attempt = message.delivery_attempt
        request.max_delivery_attempts = self.max_delivery_attempts(group)
        self._unary(
            "ForwardMessageToDeadLetterQueue",
            request,
            self._client_of(group),
            broker=_group_of(message),
        )

    def _settings_reply(self, group: str) -> Any:
        identity = self._consumers.get(group)
        stream = identity.stream if identity is not None else None
        return stream.reply if stream is not None else None

    def group_is_fifo(self, group: str) -> bool | None:
        """Whether the server delivers `group` FIFO, as its Settings reply says (None before
        a reply to a consumer of the group has come)."""
        reply = self._settings_reply(group)
        return None if reply is None else bool(reply.subscription.fifo)

    def max_delivery_attempts(self, group: str) -> int:
        reply = self._settings_reply(group)
        if reply is not None and reply.backoff_policy.max_attempts > 0:
            return int(reply.backoff_policy.max_attempts)
        return 17

    def delay_levels_ms(self, group: str | None = None) -> list[int]:
        """The server's ladder from a Settings reply (the group's own first), once one has
        arrived; RocketMQ's default ladder before."""
        identities = list(self._consumers.values())
        identities.sort(key=lambda i: i.group != group)
        for identity in identities:
            reply = identity.stream.reply if identity.stream is not None else None
            if (
                reply is not None
                and reply.backoff_policy.WhichOneof("strategy") == "customized_backoff"
            ):
                levels = [wire.ms_of(d) for d in reply.backoff_policy.customized_backoff.next]
                if levels:
                    return levels
        return list(DEFAULT_DELAY_LEVELS_MS)

    # --- group administration: our server's admin service (the protocol has no such calls)
    def _admin(self, method: str, params: dict[str, Any]) -> bool:
        """Call `reliable.admin.v1.Admin/<method>`; False (logged once per method) when the
        server does not offer it, e.g. an Apache RocketMQ proxy."""
        self._require()
        call = self._channel.unary_unary(
            f"/reliable.admin.v1.Admin/{method}",
            request_serializer=lambda v: json.dumps(v).encode(),
            response_deserializer=lambda b: json.loads(b.decode() or "{}"),
        )
        try:
            reply = call(params, timeout=self._timeout, metadata=self.metadata(self._base_id))
        except grpc.RpcError as exc:
            if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                if method not in self._no_admin:
                    self._no_admin.add(method)
                    log.warning(
                        "%s does not offer %s (no reliable admin service): %s",
                        self.endpoint,
                        method,
                        _NO_ADMIN.get(method, ""),
                    )
                return False
            raise TransportError(
                f"{method} to {self.endpoint}: {exc.code().name}: {exc.details()}"
            ) from None
        if not reply.get("ok"):
            raise BrokerCallError(
                FailureKind.BAD_REQUEST,
                f"{method}: {reply.get('message')}",
                code=str(reply.get("code")),
            )
        return True

    def set_group_start(
        self, group: str, topic: str, where: ConsumeFrom, timestamp_ms: int | None = None
    ) -> bool:
        """Where a new group starts on `topic` (`SetGroupStart`)."""
        params: dict[str, Any] = {"group": group, "topic": topic, "consume_from": where.value}
        if timestamp_ms is not None:
            params["timestamp_ms"] = timestamp_ms
        return self._admin("SetGroupStart", params)

    def make_group_fifo(self, group: str) -> bool:
        """Make the server's group FIFO, keeping its other settings (`MakeGroupFifo`)."""
        return self._admin("MakeGroupFifo", {"group": group})

    def park_message_group(self, group: str, topic: str, message_group: str) -> bool:
        """Park a message group on the server (`ParkMessageGroup`)."""
        return self._admin(
            "ParkMessageGroup", {"group": group, "topic": topic, "message_group": message_group}
        )


class _FromGroup(str):
    """`ReceivedMessage.source` of a message received from one of a cluster's groups."""


def _group_of(message: ReceivedMessage) -> str | None:
    return str(message.source) if isinstance(message.source, _FromGroup) else None


def _by_group(
    messages: Sequence[ReceivedMessage],
) -> dict[str | None, list[tuple[int, ReceivedMessage]]]:
    parts: dict[str | None, list[tuple[int, ReceivedMessage]]] = {}
    for i, m in enumerate(messages):
        parts.setdefault(_group_of(m), []).append((i, m))
    return parts
