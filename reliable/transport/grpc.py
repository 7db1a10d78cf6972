"""The `grpc` transport: any RocketMQ 5 gRPC endpoint (`apache.rocketmq.v2.MessagingService`).

It speaks only what the Apache RocketMQ 5 proxy implements, so the same configuration points
at our own server (`reliable broker start`) or at a RocketMQ 5 cluster's proxy:

    Producer(transport="grpc", endpoint="127.0.0.1:8081")

What it does better than the official Python client: errors are typed for the producer's
retry policy (flow control backs off instead of three immediate resends), nothing is logged
to files, and telemetry streams reconnect.

Model notes:
- Invisible-time consumption only (no `Capability.PULL`): the server keeps delivery state.
  FIFO is a property of the consumer group on the server (`reliable admin group create
  --fifo`); the Settings handshake reports it.
- Every call goes to the configured endpoint (the access point). A RocketMQ cluster exposes
  its proxies behind one address (or a load balancer), which is what this expects.
- The protocol does not report the queue a message was stored in (`SendResultEntry` has
  no queue, the message id is the client's own, and the proxy ignores a queue the client
  names): `SendReceipt.queue_id` is -1; `queue_offset` is the offset the server reports.
- Offsets: `query_offset(group, queue)` (GetOffset) and `min_offset` / `max_offset`
  (QueryOffset) are what `outbox.adapters.TransportOffsets` needs for the resend worker's
  watermark; they are not a pull capability.
- A delay level is sent as an absolute delivery time (the protocol has no delay levels),
  computed from RocketMQ's default level table.
- Each consumer group gets its own client identity and wire.Telemetry stream (as each official
  client does); a producer opens one when it registers a transaction checker, so the
  server's orphaned-transaction checks reach it.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from reliable.errors import (
    BadRequest,
    BrokerCallError,
    ConfigurationError,
    FailureKind,
    ReceiptHandleError,
    ReliableError,
    TransportError,
)
from reliable.message import Message, ReceivedMessage, SendReceipt, SendStatus
from reliable.transport import _grpc_wire as wire
from reliable.transport._pb import definition_pb2, service_pb2, service_pb2_grpc
from reliable.transport.base import (
    Capability,
    ConsumeFrom,
    QueueRef,
    TopicRoute,
    TransactionChecker,
    TransactionRef,
    TransactionState,
)

log = logging.getLogger(__name__)

# gRPC's default reconnect backoff (1 s growing x1.6 to 120 s) kept sends failing for
# seconds after the broker was back; a broker restart is the usual outage, so retry the
# connection within about a second (attempts stay cheap: one TCP connect each)
RECONNECT_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100),
                     ("grpc.min_reconnect_backoff_ms", 100),
                     ("grpc.max_reconnect_backoff_ms", 1_000)]

_NO_ADMIN = {
    "SetGroupStart": "a new consumer group starts where the server's default puts it "
                     "(set it with mqadmin resetOffsetByTime)",
    "ParkMessageGroup": "parked message groups are kept by each consumer only",
    "MakeGroupFifo": "an orderly consumer's group must be FIFO on the server "
                     "(mqadmin updateSubGroup -o true)",
}

ROUTE_TTL_S = 30.0


def _miscounted(response: Any, method: str, expected: int) -> ReliableError:
    """The error of a whole request whose answer has not one entry per item: the status's
    own error when it reports one, else a broker fault worth trying elsewhere."""
    try:
        wire.check_status(response.status, method)
    except ReliableError as exc:
        return exc
    return BrokerCallError(FailureKind.TRY_ELSEWHERE, f"{method} answered "
                           f"{len(response.entries)} entries for {expected} items")

class _ConsumerIdentity:
    def __init__(self, group: str, client_id: str) -> None:
        self.group = group
        self.client_id = client_id
        self.subscriptions: dict[str, Collection[str] | None] = {}
        self.stream: wire.Telemetry | None = None
        self.waited = False
        self.warned_fifo = False


class GrpcTransport:
    """A `Transport` over a RocketMQ 5 gRPC endpoint."""

    name = "grpc"
    capabilities = frozenset({Capability.BROKER_SIDE_FIFO, Capability.SERVER_LEASES,
                              Capability.GROUP_ADMIN})
    _ids = itertools.count()

    def __init__(self, *, endpoint: str, tls: bool = False, ca_file: str | Path | None = None,
                 access_key: str = "", secret_key: str = "", namespace: str = "",
                 request_timeout_s: float = 3.0, settings_timeout_s: float = 5.0) -> None:
        self.endpoint = endpoint
        self._access_point = wire.parse_endpoint(endpoint)
        self._tls, self._ca_file = tls, ca_file
        self._access_key, self._secret_key = access_key, secret_key
        self._namespace = namespace
        self._timeout = request_timeout_s
        self._settings_timeout = settings_timeout_s
        self._base_id = f"{socket.gethostname()}@{os.getpid()}@{next(self._ids)}@" \
                        f"{uuid.uuid4().hex[:8]}"
        self._lock = threading.RLock()
        self._channel: Any = None
        self.stub: Any = None
        self._brokers: dict[str, str] = {}  # topic -> a broker name from its route
        self._published: set[str] = set()
        self._checkers: dict[str, TransactionChecker] = {}
        self._producer_stream: wire.Telemetry | None = None
        self._consumers: dict[str, _ConsumerIdentity] = {}
        self._no_admin: set[str] = set()
        self._routes: dict[str, tuple[float, TopicRoute]] = {}  # topic -> (fetched at, route)
        self._static_md: dict[str, list[tuple[str, str]]] = {}  # client id -> fixed metadata
        self._md_second = -1
        self._md_date = ""
        self.requests = {"SendMessage": 0, "AckMessage": 0}  # requests made (observability)

    # --- lifecycle
    def start(self) -> None:
        with self._lock:
            if self._channel is not None:
                return
            options = [("grpc.enable_retries", 0), ("grpc.max_receive_message_length", -1),
                       ("grpc.max_send_message_length", -1), *RECONNECT_OPTIONS]
            if self._tls:
                roots = Path(self._ca_file).read_bytes() if self._ca_file else None
                self._channel = grpc.secure_channel(
                    self.endpoint, grpc.ssl_channel_credentials(roots), options)
            else:
                self._channel = grpc.insecure_channel(self.endpoint, options)
            self.stub = service_pb2_grpc.MessagingServiceStub(self._channel)

    def close(self) -> None:
        with self._lock:
            for identity in list(self._consumers.values()):
                self._terminate(identity.client_id, identity.group, identity.stream)
            self._consumers.clear()
            if self._producer_stream is not None:
                self._terminate(self._producer_stream.client_id, None, self._producer_stream)
                self._producer_stream = None
            if self._channel is not None:
                self._channel.close()
                self._channel = None
                self.stub = None

    def _terminate(self, client_id: str, group: str | None, stream: wire.Telemetry | None) -> None:
        request = service_pb2.NotifyClientTerminationRequest()
        if group:
            request.group.name, request.group.resource_namespace = group, self._namespace
        try:
            self._unary("NotifyClientTermination", request, client_id)
        except BrokerCallError as exc:
            log.debug("termination notice for %s failed: %s", client_id, exc)
        if stream is not None:
            stream.close()

    # --- calls
    def metadata(self, client_id: str) -> list[tuple[str, str]]:
        second = int(time.time())
        if second != self._md_second:  # the date header changes once a second, not per call
            self._md_date = datetime.fromtimestamp(second, UTC).strftime("%Y%m%dT%H%M%SZ")
            self._md_second = second
        now = self._md_date
        static = self._static_md.get(client_id)
        if static is None:
            static = [("x-mq-language", "PYTHON"), ("x-mq-protocol", "GRPC_V2"),
                      ("x-mq-client-version", wire.VERSION), ("x-mq-client-id", client_id),
                      ("x-mq-namespace", self._namespace)]
            if len(self._static_md) < 1024:
                self._static_md[client_id] = static
        md = [*static, ("x-mq-date-time", now), ("x-mq-request-id", uuid.uuid4().hex)]
        if self._access_key:
            import hashlib
            import hmac

            signature = hmac.new(self._secret_key.encode(), now.encode(),
                                 hashlib.sha1).hexdigest()
            md.append(("authorization", f"MQv2-HMAC-SHA1 Credential={self._access_key}, "
                                        f"SignedHeaders=x-mq-date-time, Signature={signature}"))
        return md

    def _require(self) -> Any:
        if self.stub is None:
            raise ConfigurationError("the grpc transport is not started")
        return self.stub

    def _unary(self, method: str, request: Any, client_id: str | None = None,
               timeout_s: float | None = None) -> Any:
        stub = self._require()
        try:
            response = getattr(stub, method)(request, timeout=timeout_s or self._timeout,
                                             metadata=self.metadata(client_id or self._base_id))
        except grpc.RpcError as exc:
            raise TransportError(f"{method} to {self.endpoint}: {exc.code().name}: "
                                 f"{exc.details()}") from None
        wire.check_status(response.status, method)
        return response

    def _resource(self, target: Any, name: str) -> None:
        target.name, target.resource_namespace = name, self._namespace

    # --- producing
    def route(self, topic: str) -> TopicRoute:
        """The topic's route, cached for `ROUTE_TTL_S` (the official clients refresh theirs
        every 30 s); a failed send forgets it so the next attempt asks again."""
        cached = self._routes.get(topic)
        if cached is not None and time.monotonic() - cached[0] < ROUTE_TTL_S:
            return cached[1]
        route = self._query_route(topic)
        if route.write_queues or route.read_queues:
            self._routes[topic] = (time.monotonic(), route)
        return route

    def _forget_route(self, topic: str) -> None:
        self._routes.pop(topic, None)

    def _query_route(self, topic: str) -> TopicRoute:
        request = service_pb2.QueryRouteRequest()
        self._resource(request.topic, topic)
        request.endpoints.CopyFrom(self._access_point)
        response = self._unary("QueryRoute", request)
        writes: list[QueueRef] = []
        reads: list[QueueRef] = []
        for mq in response.message_queues:
            if mq.broker.id != 0:
                continue
            ref = QueueRef(topic, mq.broker.name, int(mq.id))
            if mq.permission in (wire.WRITE, wire.READ_WRITE):
                writes.append(ref)
            if mq.permission in (wire.READ, wire.READ_WRITE):
                reads.append(ref)
        if reads or writes:
            self._brokers[topic] = (reads or writes)[0].broker
        return TopicRoute(topic, tuple(writes), tuple(reads))

    def _proto(self, m: Message, transactional: bool) -> Any:
        pm = definition_pb2.Message()
        self._resource(pm.topic, m.topic)
        pm.body = bytes(m.body)
        pm.user_properties.update(m.properties)
        sp = pm.system_properties
        if m.tags:
            sp.tag = m.tags
        sp.keys.extend(m.keys)
        sp.message_id = m.message_id
        wire.set_ms(sp.born_timestamp, int(time.time() * 1000))
        sp.born_host = wire.local_ip()
        sp.body_encoding = wire.IDENTITY
        deliver_at = m.deliver_at_ms
        if deliver_at is None and m.delay_level:
            level = min(max(m.delay_level, 1), len(wire.DEFAULT_DELAY_LEVELS_MS))
            deliver_at = int(time.time() * 1000) + wire.DEFAULT_DELAY_LEVELS_MS[level - 1]
        if transactional:
            if m.message_group or deliver_at is not None:
                raise BadRequest("a transactional message cannot be FIFO or delayed")
            sp.message_type = wire.TRANSACTION
        elif m.message_group:
            if deliver_at is not None:
                raise BadRequest("a FIFO message cannot be delayed")
            sp.message_type = wire.FIFO
            sp.message_group = m.message_group
        elif deliver_at is not None:
            sp.message_type = wire.DELAY
            wire.set_ms(sp.delivery_timestamp, deliver_at)
        else:
            sp.message_type = wire.NORMAL
        return pm

    def _request(self, messages: Sequence[Message], transactional: bool) -> Any:
        request = service_pb2.SendMessageRequest()
        request.messages.extend([self._proto(m, transactional) for m in messages])
        for m in messages:
            if m.topic not in self._published:
                self._note_topic(m.topic)
        return request

    def _results(self, messages: Sequence[Message], response: Any
                 ) -> list[SendReceipt | BaseException]:
        """One result per message: its receipt, or the error its entry reports."""
        if len(response.entries) != len(messages):
            return [_miscounted(response, "SendMessage", len(messages))] * len(messages)
        out: list[SendReceipt | BaseException] = []
        for m, entry in zip(messages, response.entries, strict=True):
            try:
                wire.check_status(entry.status if entry.HasField("status") else
                                  response.status, "SendMessage")
            except ReliableError as exc:
                out.append(exc)
                continue
            out.append(SendReceipt(
                message_id=entry.message_id or m.message_id, topic=m.topic, queue_id=-1,
                queue_offset=int(entry.offset), status=SendStatus.SEND_OK,
                transaction_id=entry.transaction_id or None,
                recall_handle=entry.recall_handle or None))
        return out

    def _send(self, messages: Sequence[Message], transactional: bool,
              timeout_s: float | None) -> list[SendReceipt]:
        request = self._request(messages, transactional)
        stub = self._require()
        self.requests["SendMessage"] += 1
        try:
            response = stub.SendMessage(request, timeout=timeout_s or self._timeout,
                                        metadata=self.metadata(self._producer_id))
        except grpc.RpcError as exc:
            self._forget_route(messages[0].topic)
            raise TransportError(f"SendMessage to {self.endpoint}: {exc.code().name}: "
                                 f"{exc.details()}") from None
        receipts = []
        for result in self._results(messages, response):
            if isinstance(result, BaseException):
                raise result
            receipts.append(result)
        return receipts

    def submit_send(self, messages: Sequence[Message], queue: QueueRef, *,
                    producer_group: str | None, timeout_s: float | None,
                    done: Callable[[list[SendReceipt | BaseException] | BaseException], None],
                    ) -> None:
        """One SendMessage carrying `messages`, without waiting: `done` gets a result per
        message (or the request's error) on gRPC's completion thread. Many may be in
        flight on the one channel."""
        request = self._request(messages, False)
        stub = self._require()
        self.requests["SendMessage"] += 1
        call = stub.SendMessage.future(request, timeout=timeout_s or self._timeout,
                                       metadata=self.metadata(self._producer_id))
        self._when_answered(call, "SendMessage", lambda r: self._results(messages, r), done,
                            on_rpc_error=lambda: self._forget_route(messages[0].topic))

    def send(self, message: Message, queue: QueueRef, *, producer_group: str | None = None,
             transactional: bool = False, timeout_s: float | None = None) -> SendReceipt:
        return self._send([message], transactional, timeout_s)[0]

    def send_batch(self, messages: Sequence[Message], queue: QueueRef, *,
                   producer_group: str | None = None) -> list[SendReceipt]:
        if not messages:
            return []
        return self._send(list(messages), False, None)

    def recall(self, topic: str, recall_handle: str) -> str:
        request = service_pb2.RecallMessageRequest()
        self._resource(request.topic, topic)
        request.recall_handle = recall_handle
        return str(self._unary("RecallMessage", request, self._producer_id).message_id)

    @property
    def _producer_id(self) -> str:
        return f"{self._base_id}@producer"

    def _note_topic(self, topic: str) -> None:
        with self._lock:
            if topic in self._published:
                return
            self._published.add(topic)
            stream = self._producer_stream
        if stream is not None:
            stream.resend_settings()

    def _producer_settings(self) -> Any:
        settings = definition_pb2.Settings()
        settings.client_type = wire.PRODUCER
        settings.access_point.CopyFrom(self._access_point)
        settings.request_timeout.seconds = int(self._timeout)
        for topic in sorted(self._published):
            self._resource(settings.publishing.topics.add(), topic)
        settings.publishing.max_body_size = 4 * 1024 * 1024
        settings.publishing.validate_message_type = True
        settings.user_agent.language = 6
        settings.user_agent.version = wire.VERSION
        settings.user_agent.hostname = socket.gethostname()
        return settings

    def end_transaction(self, producer_group: str, ref: TransactionRef,
                        state: TransactionState, *, from_check: bool = False) -> None:
        if state is TransactionState.UNKNOWN and not from_check:
            return
        request = service_pb2.EndTransactionRequest()
        self._resource(request.topic, ref.topic)
        request.message_id = ref.message_id
        request.transaction_id = ref.transaction_id or ""
        request.resolution = {TransactionState.COMMIT: wire.COMMIT,
                              TransactionState.ROLLBACK: wire.ROLLBACK}.get(state, 0)
        request.source = wire.SOURCE_SERVER_CHECK if from_check else wire.SOURCE_CLIENT
        self._unary("EndTransaction", request, self._producer_id)

    def set_transaction_checker(self, producer_group: str,
                                checker: TransactionChecker | None) -> None:
        with self._lock:
            if checker is None:
                self._checkers.pop(producer_group, None)
                return
            self._checkers[producer_group] = checker
            if self._producer_stream is None:
                self._require()
                self._producer_stream = wire.Telemetry(self, self._producer_id,
                                                   self._producer_settings, self._on_check)

    def _on_check(self, command: Any) -> None:
        with self._lock:
            checkers = list(self._checkers.items())
        if not checkers:
            return
        producer_group, checker = checkers[0]
        received = wire.to_received(command.message, None)
        received.transaction_id = command.transaction_id

        def resolve() -> None:
            try:
                state = checker(received)
                self.end_transaction(producer_group, TransactionRef(
                    received.topic, received.message_id, command.transaction_id, None),
                    state, from_check=True)
            except Exception:
                log.exception("transaction check of %s failed", received.message_id)

        threading.Thread(target=resolve, name="transaction-check", daemon=True).start()

    # --- offsets (GetOffset / QueryOffset: what the Apache proxy offers pull consumers)
    def _message_queue(self, target: Any, queue: QueueRef) -> None:
        self._resource(target.topic, queue.topic)
        target.id = queue.queue_id
        target.permission = wire.READ_WRITE
        target.broker.name = queue.broker
        target.broker.endpoints.CopyFrom(self._access_point)

    def query_offset(self, group: str, queue: QueueRef) -> int:
        """The group's committed offset on `queue` (GetOffset), -1 when it has none."""
        request = service_pb2.GetOffsetRequest()
        self._resource(request.group, group)
        self._message_queue(request.message_queue, queue)
        try:
            return int(self._unary("GetOffset", request).offset)
        except BrokerCallError as exc:
            if exc.code == "OFFSET_NOT_FOUND":
                return -1
            raise

    def _queue_offset(self, queue: QueueRef, policy: int) -> int:
        request = service_pb2.QueryOffsetRequest()
        self._message_queue(request.message_queue, queue)
        request.query_offset_policy = policy
        return int(self._unary("QueryOffset", request).offset)

    def min_offset(self, queue: QueueRef) -> int:
        """The queue's smallest offset still held (QueryOffset BEGINNING)."""
        return self._queue_offset(queue, wire.OFFSET_BEGINNING)

    def max_offset(self, queue: QueueRef) -> int:
        """One past the queue's last offset (QueryOffset END)."""
        return self._queue_offset(queue, wire.OFFSET_END)

    # --- consumers
    def _consumer(self, group: str, topic: str | None = None,
                  tags: Collection[str] | None = None) -> _ConsumerIdentity:
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
                identity.stream = wire.Telemetry(self, identity.client_id,
                                             lambda: self._consumer_settings(identity),
                                             lambda _c: None)
            elif changed:
                identity.stream.resend_settings()
        if not identity.waited:  # once: the server's Settings tell FIFO and max attempts
            identity.stream.ready.wait(self._settings_timeout)
            identity.waited = True
        return identity

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
        settings.user_agent.language = 6
        settings.user_agent.version = wire.VERSION
        return settings

    def heartbeat(self, client_id: str, group: str,
                  subscriptions: Mapping[str, Collection[str] | None]) -> None:
        identity = self._consumer(group)
        changed = False
        with self._lock:
            for topic, tags in subscriptions.items():
                if identity.subscriptions.get(topic, ()) != tags:
                    identity.subscriptions[topic] = tags
                    changed = True
        if changed and identity.stream is not None:
            identity.stream.resend_settings()
        request = service_pb2.HeartbeatRequest()
        request.client_type = wire.SIMPLE_CONSUMER
        self._resource(request.group, group)
        self._unary("Heartbeat", request, identity.client_id)

    def unregister(self, client_id: str, group: str) -> None:
        with self._lock:
            identity = self._consumers.pop(group, None)
        if identity is not None and self.stub is not None:
            self._terminate(identity.client_id, group, identity.stream)

    def receive(self, group: str, topic: str, max_msgs: int, invisible_ms: int,
                tags: Collection[str] | None = None, *, long_poll_ms: int = 0,
                fifo: bool = False, auto_renew: bool = False) -> list[ReceivedMessage]:
        identity = self._consumer(group, topic, tags)
        if fifo and not identity.warned_fifo and identity.stream is not None and \
                identity.stream.reply is not None and not identity.stream.reply.subscription.fifo:
            identity.warned_fifo = True
            log.warning("group %s consumes in order but the server's group is not FIFO: "
                        "create it with fifo (reliable admin group create %s --fifo; "
                        "mqadmin updateSubGroup -o true)", group, group)
        if topic not in self._brokers:
            self.route(topic)
        request = service_pb2.ReceiveMessageRequest()
        self._resource(request.group, group)
        mq = request.message_queue
        self._resource(mq.topic, topic)
        mq.id = -1
        mq.permission = wire.READ_WRITE
        mq.broker.name = self._brokers.get(topic, "")
        mq.broker.endpoints.CopyFrom(self._access_point)
        request.filter_expression.type = wire.TAG
        request.filter_expression.expression = " || ".join(sorted(tags)) if tags else "*"
        request.batch_size = max_msgs
        wire.set_ms(request.invisible_duration, invisible_ms)
        request.auto_renew = auto_renew  # the server renews until ack / nack / termination
        poll_ms = max(long_poll_ms, 0)
        wire.set_ms(request.long_polling_timeout, poll_ms)
        # a server may poll longer than asked (the proxy's floor is 5 s): leave it room
        wait_s = max(poll_ms, wire.MIN_LONG_POLL_MS) / 1000 + 1.0
        stub = self._require()
        status: Any = None
        out: list[ReceivedMessage] = []
        try:
            for response in stub.ReceiveMessage(
                    request, timeout=self._timeout + wait_s,
                    metadata=self.metadata(identity.client_id)):
                kind = response.WhichOneof("content")
                if kind == "status":
                    status = response.status
                elif kind == "message":
                    out.append(wire.to_received(response.message, group))
        except grpc.RpcError as exc:
            raise TransportError(f"ReceiveMessage from {self.endpoint}: {exc.code().name}: "
                                 f"{exc.details()}") from None
        if status is not None:
            wire.check_status(status, "ReceiveMessage")
        return out

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
        self._unary("AckMessage", request, self._client_of(group))

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
    def _ack_results(messages: Sequence[ReceivedMessage], response: Any
                     ) -> list[BaseException | None]:
        if len(response.entries) != len(messages):
            return [_miscounted(response, "AckMessage", len(messages))] * len(messages)
        out: list[BaseException | None] = []
        for entry in response.entries:
            try:
                wire.check_status(entry.status if entry.HasField("status") else
                                  response.status, "AckMessage")
                out.append(None)
            except ReliableError as exc:
                out.append(exc)
        return out

    def ack_many(self, group: str, messages: Sequence[ReceivedMessage]
                 ) -> list[BaseException | None]:
        """Ack messages of one topic in one AckMessage (repeated entries): per message None
        or the error its entry reports; a failed request raises."""
        if not messages:
            return []
        request = self._ack_request(group, messages)
        stub = self._require()
        self.requests["AckMessage"] += 1
        try:
            response = stub.AckMessage(request, timeout=self._timeout,
                                       metadata=self.metadata(self._client_of(group)))
        except grpc.RpcError as exc:
            raise TransportError(f"AckMessage to {self.endpoint}: {exc.code().name}: "
                                 f"{exc.details()}") from None
        return self._ack_results(messages, response)

    def submit_ack(self, group: str, messages: Sequence[ReceivedMessage],
                   done: Callable[[list[BaseException | None] | BaseException], None]) -> None:
        """`ack_many` without waiting: `done` gets the per-message results (or the request's
        error) on gRPC's completion thread."""
        request = self._ack_request(group, messages)
        stub = self._require()
        self.requests["AckMessage"] += 1
        call = stub.AckMessage.future(request, timeout=self._timeout,
                                      metadata=self.metadata(self._client_of(group)))
        self._when_answered(call, "AckMessage", lambda r: self._ack_results(messages, r), done)

    def _when_answered(self, call: Any, method: str, read: Callable[[Any], Any],
                       done: Callable[[Any], None],
                       on_rpc_error: Callable[[], None] | None = None) -> None:
        """Hand a future call's outcome to `done` on gRPC's completion thread: `read` of the
        response, or the error of the whole request (a TransportError for the call itself;
        an answer that cannot be read fails the whole request too)."""
        def finished(f: Any) -> None:
            try:
                response = f.result()
            except grpc.RpcError as exc:
                if on_rpc_error is not None:
                    on_rpc_error()
                done(TransportError(f"{method} to {self.endpoint}: {exc.code().name}: "
                                    f"{exc.details()}"))
                return
            except Exception as exc:  # cancelled on close
                done(TransportError(f"{method} to {self.endpoint}: {exc!r}"))
                return
            try:
                results = read(response)
            except Exception as exc:
                done(exc)
                return
            done(results)

        call.add_done_callback(finished)

    def _change_request(self, group: str, message: ReceivedMessage, invisible_ms: int) -> Any:
        request = service_pb2.ChangeInvisibleDurationRequest()
        self._resource(request.group, group)
        self._resource(request.topic, message.topic)
        request.receipt_handle = self._handle(message)
        request.message_id = message.message_id
        wire.set_ms(request.invisible_duration, invisible_ms)
        return request

    def change_invisible_duration(self, group: str, message: ReceivedMessage,
                                  invisible_ms: int) -> str:
        request = self._change_request(group, message, invisible_ms)
        response = self._unary("ChangeInvisibleDuration", request, self._client_of(group))
        message.receipt_handle = str(response.receipt_handle)
        return message.receipt_handle

    def submit_change_invisible(self, group: str, message: ReceivedMessage, invisible_ms: int,
                                done: Callable[[str | BaseException], None]) -> None:
        """`change_invisible_duration` without waiting (the protocol's request carries one
        handle, so these are pipelined rather than batched): `done` gets the new handle
        (also stored on `message`) or the error, on gRPC's completion thread."""
        request = self._change_request(group, message, invisible_ms)
        stub = self._require()
        call = stub.ChangeInvisibleDuration.future(
            request, timeout=self._timeout, metadata=self.metadata(self._client_of(group)))

        def finished(f: Any) -> None:
            try:
                response = f.result()
                wire.check_status(response.status, "ChangeInvisibleDuration")
            except grpc.RpcError as exc:
                done(TransportError(f"ChangeInvisibleDuration to {self.endpoint}: "
                                    f"{exc.code().name}: {exc.details()}"))
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
        self._unary("ForwardMessageToDeadLetterQueue", request, self._client_of(group))

    def _settings_reply(self, group: str) -> Any:
        identity = self._consumers.get(group)
        stream = identity.stream if identity is not None else None
        return stream.reply if stream is not None else None

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
            if reply is not None and reply.backoff_policy.WhichOneof("strategy") == \
                    "customized_backoff":
                levels = [wire.ms_of(d) for d in reply.backoff_policy.customized_backoff.next]
                if levels:
                    return levels
        return list(wire.DEFAULT_DELAY_LEVELS_MS)

    def group_is_fifo(self, group: str) -> bool:
        """What the server's Settings say about the group (FIFO is the server's call)."""
        reply = self._settings_reply(group)
        return bool(reply is not None and reply.subscription.fifo)

    # --- group administration: our server's admin service (the protocol has no such calls)
    def _admin(self, method: str, params: dict[str, Any]) -> bool:
        """Call `reliable.admin.v1.Admin/<method>`; False (logged once per method) when the
        server does not offer it, e.g. an Apache RocketMQ proxy."""
        self._require()
        call = self._channel.unary_unary(
            f"/reliable.admin.v1.Admin/{method}",
            request_serializer=lambda v: json.dumps(v).encode(),
            response_deserializer=lambda b: json.loads(b.decode() or "{}"))
        try:
            reply = call(params, timeout=self._timeout, metadata=self.metadata(self._base_id))
        except grpc.RpcError as exc:
            if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                if method not in self._no_admin:
                    self._no_admin.add(method)
                    log.warning("%s does not offer %s (no reliable admin service): %s",
                                self.endpoint, method, _NO_ADMIN.get(method, ""))
                return False
            raise TransportError(f"{method} to {self.endpoint}: {exc.code().name}: "
                                 f"{exc.details()}") from None
        if not reply.get("ok"):
            raise BrokerCallError(FailureKind.BAD_REQUEST, f"{method}: {reply.get('message')}",
                                  code=str(reply.get("code")))
        return True

    def set_group_start(self, group: str, topic: str, where: ConsumeFrom,
                        timestamp_ms: int | None = None) -> bool:
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
        return self._admin("ParkMessageGroup", {"group": group, "topic": topic,
                                                "message_group": message_group})

    def retry_topic(self, group: str) -> str:
        return f"%RETRY%{group}"

    def dlq_topic(self, group: str) -> str:
        return f"%DLQ%{group}"
