"""The grpc transport's producer side: SendMessage (one, a batch, or pipelined),
RecallMessage, EndTransaction and the orphaned-transaction checks a producer's Telemetry
streams receive, over the session (`_grpc_session`).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Sequence

import grpc

from broker.config import DEFAULT_DELAY_LEVELS_MS
from protocol import ext as protocol_ext
from protocol.clock import wall_ms
from protocol.limits import DEFAULT_MAX_BODY_SIZE
from reliable.errors import (
    BadRequest,
    BrokerCallError,
    FailureKind,
    ReliableError,
    TransportError,
)
from reliable.message import Message, SendReceipt, SendStatus, send_receipt
from reliable.transport import _grpc_convert as convert
from reliable.transport._grpc_session import GrpcSession
from reliable.transport._grpc_telemetry import Check, IdentityStreams, Telemetry
from reliable.transport._pb import definition_pb2, service_pb2
from reliable.transport.base import (
    QueueRef,
    TransactionChecker,
    TransactionRef,
    TransactionState,
)

log = logging.getLogger("reliable.transport.grpc")

# a send refused for one of these forgets the topic's route (a failed call does too)
_REROUTE = frozenset({FailureKind.TRY_ELSEWHERE, FailureKind.NOT_REPLICATED})
Results = list[SendReceipt | BaseException]
Done = Callable[[Results | BaseException], None]


class ProducerSide:
    """Sending and transactions over the session."""

    def __init__(self, session: GrpcSession, telemetry: Telemetry) -> None:
        self._session = session
        self._telemetry = telemetry
        self._published: set[str] = set()
        self._checkers: dict[str, TransactionChecker] = {}
        # the producer's identity's Telemetry streams, open while a checker is registered
        # (the servers send their orphaned-transaction checks on them)
        self._streams: IdentityStreams | None = None
        # message id of a half message an orphan check named -> the target that checked it
        self._checked_at: dict[str, str | None] = {}
        self._half_brokers: dict[str, str] = {}  # message id of a half message -> its broker
        self._capabilities: frozenset[str] | None = None  # the server's, once asked
        self._producer_id = f"{session.base_id}@producer"

    def end(self) -> None:
        """Tell the servers the producer's identity is gone (the transport closes)."""
        if self._streams is not None:
            self._telemetry.end(self._streams, None)
            self._streams = None

    def _fill(
        self, pm: definition_pb2.Message, m: Message, transactional: bool, born_ms: int
    ) -> None:
        """Write `m` into `pm`, a request's `messages.add()`: filled in place, since a
        message built apart and then appended would be copied, body and all."""
        topic = pm.topic
        topic.name, topic.resource_namespace = m.topic, self._session.namespace
        pm.body = bytes(m.body)
        if m.properties:
            pm.user_properties.update(m.properties)
        sp = pm.system_properties
        if m.tags:
            sp.tag = m.tags
        if m.keys:
            sp.keys.extend(m.keys)
        sp.message_id = m.message_id
        convert.set_ms(sp.born_timestamp, born_ms)
        sp.born_host = convert.local_ip()
        sp.body_encoding = convert.IDENTITY
        deliver_at = m.deliver_at_ms
        if deliver_at is None and m.delay_level:
            ladder = DEFAULT_DELAY_LEVELS_MS
            level = min(max(m.delay_level, 1), len(ladder))
            deliver_at = wall_ms() + ladder[level - 1]
        if transactional:
            if m.message_group or deliver_at is not None:
                raise BadRequest("a transactional message cannot be FIFO or delayed")
            sp.message_type = convert.TRANSACTION
        elif m.message_group:
            if deliver_at is not None:
                raise BadRequest("a FIFO message cannot be delayed")
            sp.message_type = convert.FIFO
            sp.message_group = m.message_group
        elif deliver_at is not None:
            sp.message_type = convert.DELAY
            convert.set_ms(sp.delivery_timestamp, deliver_at)
        else:
            sp.message_type = convert.NORMAL

    def _request(
        self, messages: Sequence[Message], transactional: bool
    ) -> service_pb2.SendMessageRequest:
        request = service_pb2.SendMessageRequest()
        add = request.messages.add
        born_ms = wall_ms()
        for m in messages:
            self._fill(add(), m, transactional, born_ms)
        for m in messages:
            if m.topic not in self._published:
                self._note_topic(m.topic)
        return request

    def _results(
        self,
        messages: Sequence[Message],
        response: service_pb2.SendMessageResponse,
        batch: bool = False,
    ) -> Results:
        """One result per message: its receipt, or the error its entry reports.

        `batch` (a `send_batch`): the Apache RocketMQ proxy stores the messages of one
        request as one MessageBatch, in one queue at consecutive offsets, and answers one
        entry for them all; each message keeps its own id."""
        if batch and len(response.entries) == 1 < len(messages):
            (entry,) = response.entries
            status = entry.status if entry.HasField("status") else response.status
            if status.code not in convert.SUCCESS_CODES:
                try:
                    convert.check_status(status, "SendMessage")
                except ReliableError as exc:
                    return [exc] * len(messages)
            first = int(entry.offset)
            return [
                send_receipt(m.message_id, m.topic, -1, first + i, SendStatus.SEND_OK, None)
                for i, m in enumerate(messages)
            ]
        if len(response.entries) != len(messages):
            return [convert.miscounted(response, "SendMessage", len(messages))] * len(messages)
        out: Results = []
        whole = response.status
        ok, sent = convert.SUCCESS_CODES, SendStatus.SEND_OK
        queue_of = protocol_ext.queue_id_of
        one_broker: dict[str, bool] = {}
        for m, entry in zip(messages, response.entries, strict=True):
            status = entry.status if entry.HasField("status") else whole
            if status.code not in ok:
                try:
                    convert.check_status(status, "SendMessage")
                except ReliableError as exc:
                    if isinstance(exc, BrokerCallError) and exc.kind in _REROUTE:
                        # a slave refusing writes, a master without its slave: a failover
                        # may be under way, so the next attempt asks for the route again
                        # and goes to the new master as soon as one serves
                        self._session.forget_route(m.topic)
                    out.append(exc)
                    continue
            # our server says which queue it chose (`protocol.ext`); a queue id names
            # one queue only where the topic's route has one broker
            queue_id = queue_of(entry)
            if queue_id >= 0:
                single = one_broker.get(m.topic)
                if single is None:
                    single = one_broker[m.topic] = self._one_broker(m.topic)
                if not single:
                    queue_id = -1
            out.append(
                send_receipt(
                    entry.message_id or m.message_id,
                    m.topic,
                    queue_id,
                    int(entry.offset),
                    sent,
                    None,
                    entry.transaction_id or None,
                    entry.recall_handle or None,
                )
            )
        return out

    def _one_broker(self, topic: str) -> bool:
        """Whether the topic's route (as last fetched) has its queues on one broker: then
        a queue id alone names the queue a message went to."""
        cached = self._session.cached_route(topic)
        return cached is not None and len(cached.brokers) == 1

    def group_resend_supported(self) -> bool:
        """Whether the server accepts a per-group resend: a send to `%RETRY%<group>`
        carrying `RETRY_TOPIC` (its `group-resend` capability, `protocol.ext`).
        Asked once; an Apache RocketMQ proxy does not know the call: False."""
        return protocol_ext.GROUP_RESEND in self.server_capabilities()

    def server_capabilities(self) -> frozenset[str]:
        """What the access point's server offers beyond the protocol, asked once (over
        gRPC: `reliable.v1.BatchMessaging/Capabilities`); none from a server that does not
        know the call. An unreachable server raises `TransportError` (asked again later)."""
        session = self._session
        with session.lock:
            known = self._capabilities
        if known is not None:
            return known
        ask = session.json_method(protocol_ext.CAPABILITIES_PATH)
        reply: object
        try:
            reply = ask(b"", timeout=session.timeout, metadata=session.metadata(self._producer_id))
        except grpc.RpcError as exc:
            if exc.code() is not grpc.StatusCode.UNIMPLEMENTED:
                raise TransportError(
                    f"Capabilities of {session.endpoint}: {exc.code().name}: {exc.details()}"
                ) from None
            reply = {}
        listed = reply.get("capabilities") if isinstance(reply, dict) else None
        if isinstance(reply, dict) and reply.get("error"):
            raise TransportError(f"Capabilities of {session.endpoint}: {reply['error']}")
        known = frozenset(str(c) for c in listed) if isinstance(listed, list) else frozenset()
        with session.lock:
            self._capabilities = known
        return known

    def _send(
        self,
        messages: Sequence[Message],
        queue: QueueRef,
        transactional: bool,
        timeout_s: float | None,
        batch: bool = False,
    ) -> list[SendReceipt]:
        session = self._session
        request = self._request(messages, transactional)
        stub, target = session.stub_for(queue.broker)
        session.requests["SendMessage"] += 1
        try:
            response = stub.SendMessage(
                request,
                timeout=timeout_s or session.timeout,
                metadata=session.metadata(self._producer_id),
            )
        except grpc.RpcError as exc:
            session.forget_route(messages[0].topic)
            raise convert.call_failure("SendMessage", target, exc) from None
        receipts = []
        for result in self._results(messages, response, batch):
            if isinstance(result, BaseException):
                raise result
            receipts.append(result)
        if transactional:
            with session.lock:  # EndTransaction goes where the half message is
                while len(self._half_brokers) >= 4096:
                    self._half_brokers.pop(next(iter(self._half_brokers)))
                for r in receipts:
                    self._half_brokers[r.message_id] = queue.broker
        return receipts

    def submit_send(
        self,
        messages: Sequence[Message],
        queue: QueueRef,
        *,
        producer_group: str | None,
        timeout_s: float | None,
        done: Done,
    ) -> None:
        """One SendMessage carrying `messages`, without waiting: `done` gets a result per
        message (or the request's error) on gRPC's completion thread. Many may be in
        flight on the one channel.

        Only a server that answers each message of a request (ours: `send-queue`) gets
        several in one request. The Apache RocketMQ proxy would store them as one
        MessageBatch (one queue, delivery times dropped) and answer once, so there each
        message leaves in its own request and `done` gets their results together."""
        if len(messages) > 1 and protocol_ext.SEND_QUEUE not in self.server_capabilities():
            self._submit_each(messages, queue, producer_group, timeout_s, done)
            return
        session = self._session
        request = self._request(messages, False)
        stub, target = session.stub_for(queue.broker)
        session.requests["SendMessage"] += 1
        call = stub.SendMessage.future(
            request,
            timeout=timeout_s or session.timeout,
            metadata=session.metadata(self._producer_id),
        )
        session.when_answered(
            call,
            "SendMessage",
            lambda r: self._results(messages, r),
            done,
            on_rpc_error=lambda: session.forget_route(messages[0].topic),
            target=target,
        )

    def _submit_each(
        self,
        messages: Sequence[Message],
        queue: QueueRef,
        producer_group: str | None,
        timeout_s: float | None,
        done: Done,
    ) -> None:
        results: list[SendReceipt | BaseException | None] = [None] * len(messages)
        left = [len(messages)]
        lock = threading.Lock()

        def one(i: int) -> Done:
            def finished(outcome: Results | BaseException) -> None:
                with lock:
                    results[i] = outcome if isinstance(outcome, BaseException) else outcome[0]
                    left[0] -= 1
                    last = left[0] == 0
                if last:
                    done([r for r in results if r is not None])

            return finished

        for i, m in enumerate(messages):
            self.submit_send(
                [m], queue, producer_group=producer_group, timeout_s=timeout_s, done=one(i)
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
        return self._send([message], queue, transactional, timeout_s)[0]

    def send_batch(
        self, messages: Sequence[Message], queue: QueueRef, *, producer_group: str | None = None
    ) -> list[SendReceipt]:
        if not messages:
            return []
        return self._send(list(messages), queue, False, None, batch=True)

    def recall(self, topic: str, recall_handle: str) -> str:
        request = service_pb2.RecallMessageRequest()
        self._session.resource(request.topic, topic)
        request.recall_handle = recall_handle
        answer = self._session.unary(lambda s: s.RecallMessage, request, self._producer_id)
        return str(answer.message_id)

    def _note_topic(self, topic: str) -> None:
        with self._session.lock:
            if topic in self._published:
                return
            self._published.add(topic)
            streams = self._streams
        if streams is not None:
            streams.resend_settings()

    def _producer_settings(self) -> definition_pb2.Settings:
        session = self._session
        settings = definition_pb2.Settings()
        settings.client_type = convert.PRODUCER
        settings.access_point.CopyFrom(session.access_point)
        settings.request_timeout.seconds = int(session.timeout)
        for topic in sorted(self._published):
            session.resource(settings.publishing.topics.add(), topic)
        settings.publishing.max_body_size = DEFAULT_MAX_BODY_SIZE
        settings.publishing.validate_message_type = True
        settings.user_agent.language = convert.PYTHON
        settings.user_agent.version = convert.VERSION
        settings.user_agent.hostname = socket.gethostname()
        return settings

    def end_transaction(
        self,
        producer_group: str,
        ref: TransactionRef,
        state: TransactionState,
        *,
        from_check: bool = False,
    ) -> None:
        if state is TransactionState.UNKNOWN and not from_check:
            return
        session = self._session
        request = service_pb2.EndTransactionRequest()
        session.resource(request.topic, ref.topic)
        request.message_id = ref.message_id
        request.transaction_id = ref.transaction_id or ""
        request.resolution = {
            TransactionState.COMMIT: convert.COMMIT,
            TransactionState.ROLLBACK: convert.ROLLBACK,
        }.get(state, convert.RESOLUTION_UNSPECIFIED)
        request.source = convert.SOURCE_SERVER_CHECK if from_check else convert.SOURCE_CLIENT
        with session.lock:
            broker = self._half_brokers.pop(ref.message_id, None)
            checked = ref.message_id in self._checked_at if from_check else False
            checked_at = self._checked_at.pop(ref.message_id, None) if checked else None
        # an orphan check is answered to the server that asked (the group holding it)
        stub, target = session.stub_at(checked_at) if checked else session.stub_for(broker)
        try:
            response = stub.EndTransaction(
                request, timeout=session.timeout, metadata=session.metadata(self._producer_id)
            )
        except grpc.RpcError as exc:
            raise convert.call_failure("EndTransaction", target, exc) from None
        convert.check_status(response.status, "EndTransaction")

    def set_transaction_checker(
        self, producer_group: str, checker: TransactionChecker | None
    ) -> None:
        with self._session.lock:
            if checker is None:
                self._checkers.pop(producer_group, None)
                return
            self._checkers[producer_group] = checker
            if self._streams is None:  # each server sends its checks on its stream
                self._streams = self._telemetry.open(
                    self._producer_id, self._producer_settings, self._on_check
                )

    def _on_check(self, command: Check, target: str | None = None) -> None:
        with self._session.lock:
            checkers = list(self._checkers.items())
        if not checkers:
            return
        producer_group, checker = checkers[0]
        received = convert.to_received(command.message, None)
        received.transaction_id = command.transaction_id
        with self._session.lock:
            while len(self._checked_at) >= 4096:
                self._checked_at.pop(next(iter(self._checked_at)))
            self._checked_at[received.message_id] = target

        def resolve() -> None:
            try:
                state = checker(received)
                self.end_transaction(
                    producer_group,
                    TransactionRef(
                        received.topic, received.message_id, command.transaction_id, None
                    ),
                    state,
                    from_check=True,
                )
            except Exception:
                log.exception("transaction check of %s failed", received.message_id)

        threading.Thread(target=resolve, name="transaction-check", daemon=True).start()
