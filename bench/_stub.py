"""A MessagingService that does no work: the cap a RocketMQ 5 client reaches on this machine.

`python -m bench._stub [--port 0]` serves `apache.rocketmq.v2.MessagingService` on loopback
and prints `serving on 127.0.0.1:<port>` once bound. Every RPC answers OK at once, with the
fields the official client reads (docs in /docs/performance.md, protocol in the server docs):

- QueryRoute: four read-write master queues of the asked topic, at the endpoints the client
  dialled, accepting every message type;
- Telemetry: the client's own Settings echoed with status OK (a producer needs its
  `publishing` block back, else its max body size becomes 0);
- SendMessage: one OK entry per message, echoing the client's message id;
- ReceiveMessage: status OK, `batch_size` canned 1 KiB messages (built once, with the MD5
  digest the client checks, as the real server sends), then the delivery timestamp;
- ReceiveMessages (the server's batch receive, `protocol.ext`, which the framework
  prefers): the same canned batch in one response; `--without-batch-receive` leaves it out,
  as an Apache RocketMQ proxy does (the framework then falls back to ReceiveMessage);
- AckMessage, ChangeInvisibleDuration, Heartbeat, NotifyClientTermination, EndTransaction:
  OK (AckMessage with one OK entry per entry).

Nothing is stored, so a client's figure against this server is the most it can do here:
the bench reports the real server's figure as a percentage of it. It runs as its own
process, as the real server does, so the client does not share its interpreter.

`--work-us N` makes it spend N microseconds of CPU on the event loop in each SendMessage
and AckMessage before it answers: how far a client's figure falls for each microsecond a
server spends per call (`python -m bench grpc --stub-work-us N`; docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from protocol import ext as protocol_ext
from protocol.pb import definition_pb2, service_pb2, service_pb2_grpc

BODY = b"x" * 1024
MAX_BATCH = 1024
_OK = definition_pb2.Code.Value("OK")
_READ_WRITE = definition_pb2.Permission.Value("READ_WRITE")
_TYPES = [definition_pb2.MessageType.Value(n) for n in ("NORMAL", "FIFO", "DELAY", "TRANSACTION")]


def _ok(response: Any) -> Any:
    response.status.code = _OK
    response.status.message = "OK"
    return response


class StubMessagingService:
    """Registered with `add_MessagingServiceServicer_to_server` (duck-typed)."""

    def __init__(self, body: bytes = BODY, work_us: float = 0.0) -> None:
        self._body = body
        self._work_s = work_us / 1e6
        self._offsets = itertools.count()
        self._canned: dict[tuple[str, str], list[Any]] = {}
        self.sent = 0  # messages answered: a test can tell the stub was really called
        self.acked = 0

    def _work(self) -> None:
        """Spend `work_us` of CPU here, as a server's own work per call would."""
        if self._work_s > 0:
            until = time.perf_counter() + self._work_s
            while time.perf_counter() < until:
                pass

    # --- routes and sessions
    async def QueryRoute(self, request: Any, context: Any) -> Any:
        response = _ok(service_pb2.QueryRouteResponse())
        for queue_id in range(4):
            mq = response.message_queues.add()
            mq.topic.CopyFrom(request.topic)
            mq.id = queue_id
            mq.permission = _READ_WRITE
            mq.broker.name = "stub"
            mq.broker.id = 0
            mq.broker.endpoints.CopyFrom(request.endpoints)
            mq.accept_message_types.extend(_TYPES)
        return response

    async def Heartbeat(self, request: Any, context: Any) -> Any:
        return _ok(service_pb2.HeartbeatResponse())

    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        return _ok(service_pb2.NotifyClientTerminationResponse())

    async def Telemetry(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        async for command in request_iterator:
            if command.HasField("settings"):
                reply = _ok(service_pb2.TelemetryCommand())
                reply.settings.CopyFrom(command.settings)
                yield reply

    # --- producing
    async def SendMessage(self, request: Any, context: Any) -> Any:
        self._work()
        response = _ok(service_pb2.SendMessageResponse())
        for message in request.messages:
            entry = response.entries.add()
            entry.status.code = _OK
            entry.message_id = message.system_properties.message_id
            entry.offset = next(self._offsets)
        self.sent += len(request.messages)
        return response

    async def EndTransaction(self, request: Any, context: Any) -> Any:
        return _ok(service_pb2.EndTransactionResponse())

    # --- consuming
    def _batch(self, topic: Any, size: int) -> list[Any]:
        key = (topic.resource_namespace, topic.name)
        canned = self._canned.get(key)
        if canned is None or len(canned) < size:
            canned = [self._message(topic, i) for i in range(max(size, 32))]
            self._canned[key] = canned
        return canned[:size]

    def _message(self, topic: Any, i: int) -> Any:
        response = service_pb2.ReceiveMessageResponse()
        pm = response.message
        pm.topic.CopyFrom(topic)
        pm.body = self._body
        sp = pm.system_properties
        sp.message_id = f"01STUB{i:028X}"
        sp.receipt_handle = f"stub-{i}"
        sp.body_digest.type = definition_pb2.DigestType.Value("MD5")
        sp.body_digest.checksum = hashlib.md5(self._body).hexdigest().upper()
        sp.body_encoding = definition_pb2.Encoding.Value("IDENTITY")
        sp.message_type = _TYPES[0]
        sp.born_host = "127.0.0.1"
        sp.born_timestamp.GetCurrentTime()
        sp.store_timestamp.GetCurrentTime()
        sp.queue_id = 0
        sp.queue_offset = i
        sp.delivery_attempt = 1
        return response

    async def ReceiveMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        size = max(1, min(int(request.batch_size) or 32, MAX_BATCH))
        yield _ok(service_pb2.ReceiveMessageResponse())
        for response in self._batch(request.message_queue.topic, size):
            yield response
        done = service_pb2.ReceiveMessageResponse()
        done.delivery_timestamp.GetCurrentTime()
        yield done

    async def ReceiveMessages(self, request: Any, context: Any) -> Any:
        size = max(1, min(int(request.batch_size) or 32, MAX_BATCH))
        response = _ok(protocol_ext.ReceiveMessagesResponse())
        response.messages.extend(r.message for r in self._batch(request.message_queue.topic, size))
        response.delivery_timestamp.GetCurrentTime()
        return response

    async def AckMessage(self, request: Any, context: Any) -> Any:
        self._work()
        response = _ok(service_pb2.AckMessageResponse())
        for entry in request.entries:
            result = response.entries.add()
            result.message_id = entry.message_id
            result.receipt_handle = entry.receipt_handle
            result.status.code = _OK
        self.acked += len(request.entries)
        return response

    async def ChangeInvisibleDuration(self, request: Any, context: Any) -> Any:
        response = _ok(service_pb2.ChangeInvisibleDurationResponse())
        response.receipt_handle = request.receipt_handle
        return response

    # --- the rest: OK and empty (the bench never calls them; the servicer must have them)
    async def QueryAssignment(self, request: Any, context: Any) -> Any:
        return _ok(service_pb2.QueryAssignmentResponse())

    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: Any) -> Any:
        return _ok(service_pb2.ForwardMessageToDeadLetterQueueResponse())

    async def RecallMessage(self, request: Any, context: Any) -> Any:
        return _ok(service_pb2.RecallMessageResponse())

    async def UpdateOffset(self, request: Any, context: Any) -> Any:
        return _ok(service_pb2.UpdateOffsetResponse())

    async def GetOffset(self, request: Any, context: Any) -> Any:
        return _ok(service_pb2.GetOffsetResponse())

    async def QueryOffset(self, request: Any, context: Any) -> Any:
        return _ok(service_pb2.QueryOffsetResponse())

    async def SyncLiteSubscription(self, request: Any, context: Any) -> Any:
        return _ok(service_pb2.SyncLiteSubscriptionResponse())

    async def PullMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        yield _ok(service_pb2.PullMessageResponse())


async def serve(
    port: int = 0,
    host: str = "127.0.0.1",
    ready: Any = None,
    *,
    batch_receive: bool = True,
    work_us: float = 0.0,
) -> None:
    """Serve until cancelled; `ready(port)` is called once the port is bound."""
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
        ]
    )
    service = StubMessagingService(work_us=work_us)
    service_pb2_grpc.add_MessagingServiceServicer_to_server(service, server)
    if batch_receive:
        handler = grpc.unary_unary_rpc_method_handler(
            service.ReceiveMessages,
            request_deserializer=service_pb2.ReceiveMessageRequest.FromString,
            response_serializer=protocol_ext.ReceiveMessagesResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    protocol_ext.SERVICE, {protocol_ext.RECEIVE_MESSAGES: handler}
                ),
            )
        )
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    await server.start()
    if ready is not None:
        ready(bound)
    try:
        await server.wait_for_termination()
    finally:
        await server.stop(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench._stub", description="A RocketMQ 5 gRPC server that does no work."
    )
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--without-batch-receive",
        action="store_true",
        help="offer only the protocol's ReceiveMessage, as an Apache RocketMQ proxy does",
    )
    parser.add_argument(
        "--work-us",
        type=float,
        default=0.0,
        metavar="N",
        help="CPU microseconds spent on each SendMessage and AckMessage before answering "
        "(default 0: no work)",
    )
    args = parser.parse_args(argv)
    if args.work_us < 0:
        parser.error("--work-us: must be at least 0")

    def ready(port: int) -> None:
        print(f"serving on 127.0.0.1:{port}", flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            serve(
                args.port,
                ready=ready,
                batch_receive=not args.without_batch_receive,
                work_us=args.work_us,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
