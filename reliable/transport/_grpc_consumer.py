"""The grpc transport's consumer side: one client identity (with its Telemetry streams,
`_grpc_telemetry`) per group, heartbeats, ReceiveMessage (batched where the server offers
it, from each of a cluster's groups in turn), direct deliveries, offsets and what the
server's Settings say of a group; over the session (`_grpc_session`). What becomes of a
received message (acks, invisible-time changes, dead-lettering) is `_grpc_acks`'.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping

import grpc

from broker.config import DEFAULT_DELAY_LEVELS_MS
from reliable.errors import BrokerCallError, ConfigurationError, FailureKind, TransportError
from reliable.message import ReceivedMessage
from reliable.transport import _grpc_convert as convert
from reliable.transport._grpc_session import GrpcSession, Metadata, Stub
from reliable.transport._grpc_telemetry import (
    FAILED_TO_CONSUME,
    NOT_IMPLEMENTED,
    OK,
    IdentityStreams,
    Telemetry,
    Verdict,
)
from reliable.transport._pb import definition_pb2, service_pb2
from reliable.transport.base import DirectListener, QueueRef

log = logging.getLogger("reliable.transport.grpc")


class _ConsumerIdentity:
    def __init__(self, group: str, client_id: str) -> None:
        self.group = group
        self.client_id = client_id
        self.subscriptions: dict[str, Collection[str] | None] = {}
        self.streams: IdentityStreams | None = None  # its Telemetry streams, once opened
        self.waited = False
        self.warned_fifo = False


class ConsumerSide:
    """Consumer identities, receiving and offsets over the session."""

    def __init__(self, session: GrpcSession, telemetry: Telemetry) -> None:
        self._session = session
        self._telemetry = telemetry
        self._consumers: dict[str, _ConsumerIdentity] = {}
        self._direct: dict[str, DirectListener] = {}  # group -> who consumes direct deliveries
        self._turns: dict[tuple[str, str], int] = {}  # (group, topic) -> receives made

    def end(self) -> None:
        """Tell the servers every consumer identity is gone (the transport closes)."""
        for identity in list(self._consumers.values()):
            if identity.streams is not None:
                self._telemetry.end(identity.streams, identity.group)
        self._consumers.clear()

    # --- offsets (GetOffset / QueryOffset: what the Apache proxy offers pull consumers)
    def _message_queue(self, target: definition_pb2.MessageQueue, queue: QueueRef) -> None:
        self._session.resource(target.topic, queue.topic)
        target.id = queue.queue_id
        target.permission = convert.READ_WRITE
        target.broker.name = queue.broker
        target.broker.endpoints.CopyFrom(self._session.endpoints_of(queue.broker))

    def query_offset(self, group: str, queue: QueueRef) -> int:
        """The group's committed offset on `queue` (GetOffset), -1 when it has none."""
        request = service_pb2.GetOffsetRequest()
        self._session.resource(request.group, group)
        self._message_queue(request.message_queue, queue)
        broker = self._session.known(queue.broker)
        try:
            return int(self._session.unary(lambda s: s.GetOffset, request, broker=broker).offset)
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
        broker = self._session.known(queue.broker)
        return int(self._session.unary(lambda s: s.QueryOffset, request, broker=broker).offset)

    def min_offset(self, queue: QueueRef) -> int:
        """The queue's smallest offset still held (QueryOffset BEGINNING)."""
        return self._queue_offset(queue, convert.OFFSET_BEGINNING)

    def max_offset(self, queue: QueueRef) -> int:
        """One past the queue's last offset (QueryOffset END)."""
        return self._queue_offset(queue, convert.OFFSET_END)

    # --- consumers
    def _consumer(
        self, group: str, topic: str | None = None, tags: Collection[str] | None = None
    ) -> _ConsumerIdentity:
        with self._session.lock:
            identity = self._consumers.get(group)
            changed = False
            if identity is None:
                identity = _ConsumerIdentity(group, f"{self._session.base_id}@{group}")
                self._consumers[group] = identity
                changed = True
            if topic is not None and topic not in identity.subscriptions:
                identity.subscriptions[topic] = tags
                changed = True
            streams = identity.streams
            if streams is None:  # its Settings, and the direct deliveries each server sends
                streams = identity.streams = self._telemetry.open(
                    identity.client_id,
                    lambda: self._consumer_settings(identity),
                    on_verify=lambda pm: self._consume_directly(group, pm),
                )
            elif changed:
                streams.resend_settings()
        if not identity.waited:  # once: the server's Settings tell FIFO and max attempts
            streams.wait_ready(self._session.settings_timeout)
            identity.waited = True
        return identity

    def client_of(self, group: str) -> str:
        """The client id the group's calls go under (its identity's, once it has one)."""
        identity = self._consumers.get(group)
        return identity.client_id if identity is not None else f"{self._session.base_id}@{group}"

    # --- direct delivery (the server's verify_message_command)
    def consumer_client_id(self, group: str) -> str:
        """The client id (`x-mq-client-id`) this transport consumes `group` under: the id
        `reliable admin group show` lists and `message reconsume --client` names."""
        return self.client_of(group)

    def set_direct_listener(self, group: str, listener: DirectListener | None) -> None:
        """Run `listener` on the messages the server delivers directly to this client of
        `group` (None: answer that nothing here consumes them)."""
        with self._session.lock:
            if listener is None:
                self._direct.pop(group, None)
            else:
                self._direct[group] = listener

    def _consume_directly(self, group: str, pm: definition_pb2.Message) -> Verdict:
        listener = self._direct.get(group)
        if listener is None:
            return (
                NOT_IMPLEMENTED,
                f"client {self.client_of(group)} has no listener for group {group}: only "
                "a running push consumer consumes a message directly",
            )
        consumed, text = listener(convert.to_received(pm, group))
        return (OK, "") if consumed else (FAILED_TO_CONSUME, text)

    def _consumer_settings(self, identity: _ConsumerIdentity) -> definition_pb2.Settings:
        session = self._session
        settings = definition_pb2.Settings()
        settings.client_type = convert.SIMPLE_CONSUMER
        settings.access_point.CopyFrom(session.access_point)
        settings.request_timeout.seconds = int(session.timeout)
        sub = settings.subscription
        session.resource(sub.group, identity.group)
        for topic, tags in sorted(identity.subscriptions.items()):
            entry = sub.subscriptions.add()
            session.resource(entry.topic, topic)
            entry.expression.type = convert.TAG
            entry.expression.expression = " || ".join(sorted(tags)) if tags else "*"
        sub.long_polling_timeout.seconds = 20
        settings.user_agent.language = convert.PYTHON
        settings.user_agent.version = convert.VERSION
        return settings

    def heartbeat(
        self, client_id: str, group: str, subscriptions: Mapping[str, Collection[str] | None]
    ) -> None:
        identity = self._consumer(group)
        changed = False
        with self._session.lock:
            for topic, tags in subscriptions.items():
                if identity.subscriptions.get(topic, ()) != tags:
                    identity.subscriptions[topic] = tags
                    changed = True
        if changed and identity.streams is not None:
            identity.streams.resend_settings()
        request = service_pb2.HeartbeatRequest()
        request.client_type = convert.SIMPLE_CONSUMER
        self._session.resource(request.group, group)
        self._session.unary(lambda s: s.Heartbeat, request, identity.client_id)

    def unregister(self, client_id: str, group: str) -> None:
        with self._session.lock:
            identity = self._consumers.pop(group, None)
        if identity is not None and identity.streams is not None and self._session.started:
            self._telemetry.end(identity.streams, group)

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
        reply = identity.streams.reply if identity.streams is not None else None
        if fifo and not identity.warned_fifo and reply is not None and not reply.subscription.fifo:
            identity.warned_fifo = True
            log.warning(
                "group %s consumes in order but the server's group is not FIFO: "
                "create it with fifo (reliable admin group create %s --fifo; "
                "mqadmin updateSubGroup -o true)",
                group,
                group,
            )
        session = self._session
        if session.broker_of(topic) is None:
            session.route(topic)
        # a cluster's groups (several brokers at their own endpoints): each receive asks the
        # next group in turn, as the official SimpleConsumer does
        brokers = session.read_brokers(topic)
        broker: str | None = None
        if brokers:
            turn = self._turns.get((group, topic), 0)
            self._turns[(group, topic)] = turn + 1
            broker = brokers[turn % len(brokers)]
        request = service_pb2.ReceiveMessageRequest()
        session.resource(request.group, group)
        mq = request.message_queue
        session.resource(mq.topic, topic)
        mq.id = -1
        mq.permission = convert.READ_WRITE
        mq.broker.name = broker or session.broker_of(topic) or ""
        mq.broker.endpoints.CopyFrom(session.endpoints_of(broker))
        request.filter_expression.type = convert.TAG
        request.filter_expression.expression = " || ".join(sorted(tags)) if tags else "*"
        request.batch_size = max_msgs
        convert.set_ms(request.invisible_duration, invisible_ms)
        request.auto_renew = auto_renew  # the server renews until ack / nack / termination
        poll_ms = max(long_poll_ms, 0)
        convert.set_ms(request.long_polling_timeout, poll_ms)
        # a server may poll longer than asked (the proxy's floor is 5 s): leave it room
        wait_s = max(poll_ms, convert.MIN_LONG_POLL_MS) / 1000 + 1.0
        metadata = session.metadata(identity.client_id)
        timeout = session.timeout + wait_s
        if broker is not None:
            return self._receive_from(broker, request, group, timeout, metadata)
        stub = session.require()
        if session.batch_receive is not False:
            batched = self._receive_batched(request, group, timeout, metadata)
            if batched is not None:
                return batched
        return self._stream_receive(stub, session.endpoint, request, group, timeout, metadata)

    def _receive_from(
        self,
        broker: str,
        request: service_pb2.ReceiveMessageRequest,
        group: str,
        timeout: float,
        metadata: Metadata,
    ) -> list[ReceivedMessage]:
        """ReceiveMessage from one broker group; each message remembers its group (`source`),
        where its ack, invisible-time change or dead-lettering must go."""
        stub, target = self._session.stub_for(broker)
        topic = request.message_queue.topic.name
        return self._stream_receive(
            stub,
            target,
            request,
            group,
            timeout,
            metadata,
            source=_FromGroup(broker),
            gone=lambda: self._session.forget_route(topic),  # a group may be gone
        )

    @staticmethod
    def _stream_receive(
        stub: Stub,
        target: str,
        request: service_pb2.ReceiveMessageRequest,
        group: str,
        timeout: float,
        metadata: Metadata,
        source: _FromGroup | None = None,
        gone: Callable[[], None] | None = None,
    ) -> list[ReceivedMessage]:
        """The protocol's ReceiveMessage: a status, one response per message; `gone` is
        called when the call itself fails."""
        status: definition_pb2.Status | None = None
        out: list[ReceivedMessage] = []
        try:
            for response in stub.ReceiveMessage(request, timeout=timeout, metadata=metadata):
                kind = response.WhichOneof("content")
                if kind == "status":
                    status = response.status
                elif kind == "message":
                    received = convert.to_received(response.message, group)
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
                convert.check_status(status, "ReceiveMessage")
            except BrokerCallError as exc:
                # e.g. a slave that served its dead master's group refuses once the master
                # is back: the next route names the master again
                if gone is not None and exc.kind is FailureKind.TRY_ELSEWHERE:
                    gone()
                raise
        return out

    def _receive_batched(
        self,
        request: service_pb2.ReceiveMessageRequest,
        group: str,
        timeout: float,
        metadata: Metadata,
    ) -> list[ReceivedMessage] | None:
        """The server's batch receive (`reliable.v1.BatchMessaging/ReceiveMessages`): the
        whole batch in one response. None when the server does not offer it (an Apache
        RocketMQ proxy answers UNIMPLEMENTED): this session then uses ReceiveMessage."""
        session = self._session
        call = session.receive_messages
        if call is None:
            raise ConfigurationError("the grpc transport is not started")
        try:
            response = call(request, timeout=timeout, metadata=metadata)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.info("%s has no batch receive: using ReceiveMessage", session.endpoint)
                session.batch_receive = False
                return None
            raise TransportError(
                f"ReceiveMessages from {session.endpoint}: {exc.code().name}: {exc.details()}"
            ) from None
        session.batch_receive = True
        if response.HasField("status"):
            convert.check_status(response.status, "ReceiveMessage")
        to_received = convert.to_received
        return [to_received(m, group) for m in response.messages]

    def _settings_reply(self, group: str) -> definition_pb2.Settings | None:
        identity = self._consumers.get(group)
        streams = identity.streams if identity is not None else None
        return streams.reply if streams is not None else None

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
            reply = identity.streams.reply if identity.streams is not None else None
            if (
                reply is not None
                and reply.backoff_policy.WhichOneof("strategy") == "customized_backoff"
            ):
                levels = [convert.ms_of(d) for d in reply.backoff_policy.customized_backoff.next]
                if levels:
                    return levels
        return list(DEFAULT_DELAY_LEVELS_MS)


class _FromGroup(str):
    """`ReceivedMessage.source` of a message received from one of a cluster's groups."""


def group_of(message: ReceivedMessage) -> str | None:
    """The broker group a message was received from (None: the access point's)."""
    return str(message.source) if isinstance(message.source, _FromGroup) else None
