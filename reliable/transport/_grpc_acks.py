"""The grpc transport's acknowledgements: what a consumer does with a message it received.
AckMessage (one, many, pipelined), ChangeInvisibleDuration (waited for or pipelined) and
ForwardMessageToDeadLetterQueue, each to the broker group the message came from (a
cluster's groups), under the client identity of the consumer side's group.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import grpc

from reliable.errors import BadRequest, ReceiptHandleError, ReliableError, TransportError
from reliable.message import ReceivedMessage
from reliable.transport import _grpc_convert as convert
from reliable.transport._grpc_consumer import ConsumerSide, group_of
from reliable.transport._grpc_session import GrpcSession, Request, Response, Stub
from reliable.transport._pb import service_pb2

AckResults = list[BaseException | None]  # per message: None, or the error its entry reports
AckDone = Callable[[AckResults | BaseException], None]


class Acks:
    """Acks, invisible-time changes and dead-lettering over the session."""

    def __init__(self, session: GrpcSession, consumer: ConsumerSide) -> None:
        self._session = session
        self._consumer = consumer

    def _unary(
        self,
        pick: Callable[[Stub], grpc.UnaryUnaryMultiCallable[Request, Response]],
        request: Request,
        group: str,
        message: ReceivedMessage,
    ) -> Response:
        """A call about `message`, under the group's client id, to the broker group the
        message came from."""
        client_id = self._consumer.client_of(group)
        return self._session.unary(pick, request, client_id, broker=group_of(message))

    @staticmethod
    def _handle(message: ReceivedMessage) -> str:
        if not message.receipt_handle:
            raise ReceiptHandleError("", "the message carries no receipt handle")
        return message.receipt_handle

    def ack(self, group: str, message: ReceivedMessage) -> None:
        request = service_pb2.AckMessageRequest()
        self._session.resource(request.group, group)
        self._session.resource(request.topic, message.topic)
        entry = request.entries.add()
        entry.message_id, entry.receipt_handle = message.message_id, self._handle(message)
        self._unary(lambda s: s.AckMessage, request, group, message)

    def _ack_request(
        self, group: str, messages: Sequence[ReceivedMessage]
    ) -> service_pb2.AckMessageRequest:
        request = service_pb2.AckMessageRequest()
        self._session.resource(request.group, group)
        self._session.resource(request.topic, messages[0].topic)
        for m in messages:
            if m.topic != messages[0].topic:
                raise BadRequest("one AckMessage acks messages of one topic")
            entry = request.entries.add()
            entry.message_id, entry.receipt_handle = m.message_id, self._handle(m)
        return request

    @staticmethod
    def _ack_results(
        messages: Sequence[ReceivedMessage], response: service_pb2.AckMessageResponse
    ) -> AckResults:
        if len(response.entries) != len(messages):
            return [convert.miscounted(response, "AckMessage", len(messages))] * len(messages)
        out: AckResults = []
        for entry in response.entries:
            try:
                convert.check_status(
                    entry.status if entry.HasField("status") else response.status, "AckMessage"
                )
                out.append(None)
            except ReliableError as exc:
                out.append(exc)
        return out

    def ack_many(self, group: str, messages: Sequence[ReceivedMessage]) -> AckResults:
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
    ) -> AckResults:
        request = self._ack_request(group, messages)
        stub, target = self._session.stub_for(broker)
        self._session.requests["AckMessage"] += 1
        try:
            response = stub.AckMessage(
                request,
                timeout=self._session.timeout,
                metadata=self._session.metadata(self._consumer.client_of(group)),
            )
        except grpc.RpcError as exc:
            raise convert.call_failure("AckMessage", target, exc) from None
        return self._ack_results(messages, response)

    def submit_ack(
        self,
        group: str,
        messages: Sequence[ReceivedMessage],
        done: AckDone,
    ) -> None:
        """`ack_many` without waiting: `done` gets the per-message results (or the request's
        error) on gRPC's completion thread."""
        parts = _by_group(messages)
        if len(parts) > 1:  # a cluster's groups: one AckMessage to each, results merged
            self._submit_acks_split(group, messages, parts, done)
            return
        broker = next(iter(parts))
        request = self._ack_request(group, messages)
        stub, target = self._session.stub_for(broker)
        self._session.requests["AckMessage"] += 1
        call = stub.AckMessage.future(
            request,
            timeout=self._session.timeout,
            metadata=self._session.metadata(self._consumer.client_of(group)),
        )
        self._session.when_answered(
            call, "AckMessage", lambda r: self._ack_results(messages, r), done, target=target
        )

    def _submit_acks_split(
        self,
        group: str,
        messages: Sequence[ReceivedMessage],
        parts: dict[str | None, list[tuple[int, ReceivedMessage]]],
        done: AckDone,
    ) -> None:
        results: AckResults = [None] * len(messages)
        pending = [len(parts)]
        lock = threading.Lock()

        def one(indexed: list[tuple[int, ReceivedMessage]]) -> AckDone:
            def finished(outcome: AckResults | BaseException) -> None:
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

    def _change_request(
        self, group: str, message: ReceivedMessage, invisible_ms: int
    ) -> service_pb2.ChangeInvisibleDurationRequest:
        request = service_pb2.ChangeInvisibleDurationRequest()
        self._session.resource(request.group, group)
        self._session.resource(request.topic, message.topic)
        request.receipt_handle = self._handle(message)
        request.message_id = message.message_id
        convert.set_ms(request.invisible_duration, invisible_ms)
        return request

    def change_invisible_duration(
        self, group: str, message: ReceivedMessage, invisible_ms: int
    ) -> str:
        request = self._change_request(group, message, invisible_ms)
        response = self._unary(lambda s: s.ChangeInvisibleDuration, request, group, message)
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
        broker = group_of(message)
        stub, target = self._session.stub_for(broker)
        call = stub.ChangeInvisibleDuration.future(
            request,
            timeout=self._session.timeout,
            metadata=self._session.metadata(self._consumer.client_of(group)),
        )

        def finished(f: grpc.Future[service_pb2.ChangeInvisibleDurationResponse]) -> None:
            try:
                response = f.result()
                convert.check_status(response.status, "ChangeInvisibleDuration")
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
        self._session.resource(request.group, group)
        self._session.resource(request.topic, message.topic)
        request.receipt_handle = self._handle(message)
        request.message_id = message.message_id
        request.delivery_attempt = message.delivery_attempt
        request.max_delivery_attempts = self._consumer.max_delivery_attempts(group)
        self._unary(lambda s: s.ForwardMessageToDeadLetterQueue, request, group, message)


def _by_group(
    messages: Sequence[ReceivedMessage],
) -> dict[str | None, list[tuple[int, ReceivedMessage]]]:
    parts: dict[str | None, list[tuple[int, ReceivedMessage]]] = {}
    for i, m in enumerate(messages):
        parts.setdefault(group_of(m), []).append((i, m))
    return parts
