"""`apache.rocketmq.v2.MessagingService`: one method per RPC, each a thin adapter.

The same server also registers `reliable.v1.BatchMessaging/ReceiveMessages`
(`protocol.ext`), the receive answered in one message that the framework prefers,
and `reliable.v1.BatchMessaging/Capabilities`, what it accepts beyond the protocol.

Every unary RPC goes through `_unary`: read the caller (client id, namespace, signature),
run the handler, and turn any exception into the response's `Status` with
`broker.server.status.status_of`. A response always carries a status.

`add_to_server` registers the service with request parsers that never raise: a body that is
not the method's message arrives as `Undecodable`, and the call is answered like any other
bad request, after the caller's signature is checked: `BAD_REQUEST` in-band, with at most
one log line per RPC a minute (gRPC's own parser failure would log a traceback per call,
before any authentication, and answer `UNKNOWN`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, Protocol, TypeVar

import grpc
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

from broker.server import convert
from broker.server.calls import CallContext, StreamContext
from broker.server.clients import ClientHandlers
from broker.server.consuming import ConsumerHandlers
from broker.server.context import CallInfo, ServerContext
from broker.server.decoding import Undecodable, parser
from broker.server.errors import Abandoned, NotImplementedByServer, ReadOnlySlave, ServerError
from broker.server.offsets import OffsetHandlers
from broker.server.producing import ProducerHandlers
from broker.server.status import status_of
from protocol import ext as protocol_ext
from protocol import wire as protocol_wire
from protocol.pb import definition_pb2, service_pb2

SERVICE = "apache.rocketmq.v2.MessagingService"
Handler = Callable[[Any, CallInfo], Awaitable[Any]]
Request = TypeVar("Request", bound=Message)
Response = TypeVar("Response", bound="_Answer")


class _Answer(Protocol):
    """A unary RPC's response: a protocol message that carries a status."""

    DESCRIPTOR: Descriptor

    def __init__(self) -> None: ...

    @property
    def status(self) -> definition_pb2.Status: ...


def add_to_server(servicer: MessagingServicer, server: grpc.aio.Server) -> None:
    """Register `servicer` on a `grpc.aio` server with never-raising request parsers."""
    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    handlers = {}
    for method in service_pb2.DESCRIPTOR.services_by_name["MessagingService"].methods:
        request = getattr(service_pb2, method.input_type.name)
        response = getattr(service_pb2, method.output_type.name)
        make = kinds[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=parser(request, method.name),
            response_serializer=response.SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    batch: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        protocol_ext.RECEIVE_MESSAGES: grpc.unary_unary_rpc_method_handler(
            servicer.ReceiveMessages,
            request_deserializer=parser(
                service_pb2.ReceiveMessageRequest, protocol_ext.RECEIVE_MESSAGES
            ),
            response_serializer=protocol_ext.ReceiveMessagesResponse.SerializeToString,
        ),
        protocol_ext.CAPABILITIES: grpc.unary_unary_rpc_method_handler(
            servicer.Capabilities,
            request_deserializer=lambda raw: raw,
            response_serializer=lambda value: json.dumps(value).encode(),
        ),
        protocol_wire.WIRE_ENDPOINT: grpc.unary_unary_rpc_method_handler(
            servicer.WireEndpoint,
            request_deserializer=lambda raw: raw,
            response_serializer=lambda value: json.dumps(value).encode(),
        ),
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(protocol_ext.SERVICE, batch),)
    )


async def _refuse_on_slave(request: object, call: CallInfo) -> NoReturn:
    raise ReadOnlySlave()


def _unless_acting(acting: Callable[[], bool], handler: Handler) -> Handler:
    """A slave's handler of a read (ack, change of invisible time, dead-letter): served
    while the slave acts for its dead master (`MessagingServicer.acting`), else refused."""

    async def guarded(request: Any, call: CallInfo) -> Any:
        if not acting():
            raise ReadOnlySlave()
        return await handler(request, call)

    return guarded


class MessagingServicer:
    """Registered with `add_to_server` (duck-typed, no base class)."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.clients = ClientHandlers(ctx)
        self.producing = ProducerHandlers(ctx, self.clients)
        self.consuming = ConsumerHandlers(ctx, self.clients)
        self.offsets = OffsetHandlers(ctx)
        self._answers = ctx.answers
        # a slave's writes are refused by handlers chosen here, once: a master's calls
        # take no extra step
        self._send: Handler = self.producing.send
        self._end_transaction: Handler = self.producing.end_transaction
        self._recall: Handler = self.producing.recall
        self._ack: Handler = self.consuming.ack
        self._forward: Handler = self.consuming.forward_to_dlq
        self._change_invisible: Handler = self.consuming.change_invisible_duration
        self._read_only = ctx.config.read_only
        if self._read_only:
            self._send = self._end_transaction = self._recall = _refuse_on_slave
            # reads are served while the slave acts for its dead master (broker.acting)
            self._ack = _unless_acting(self.acting, self.consuming.ack)
            self._forward = _unless_acting(self.acting, self.consuming.forward_to_dlq)
            self._change_invisible = _unless_acting(
                self.acting, self.consuming.change_invisible_duration
            )
        ctx.broker.acting_gate = self.acting

    @property
    def read_only(self) -> bool:
        return self._read_only

    def acting(self) -> bool:
        """This slave serves receives and acks for its group (docs/ha.md "Reading from a
        slave"): its replication link to its master is down, the cluster's probes find no
        master of the group up, and it is the slave the routes name for the group."""
        if not self._read_only:
            return False
        cluster, link = self.ctx.cluster, self.ctx.master_link
        if cluster is None or link is None or link():
            return False
        group = cluster.config.group(cluster.me[0])
        server = cluster.serving(group) if group is not None else None
        return server is not None and not server.writable and server.broker_id == cluster.me[1]

    def make_writable(self) -> None:
        """A promoted slave (docs/ha.md): from now on its calls write like a master's."""
        self._send = self.producing.send
        self._end_transaction = self.producing.end_transaction
        self._recall = self.producing.recall
        self._ack = self.consuming.ack
        self._forward = self.consuming.forward_to_dlq
        self._change_invisible = self.consuming.change_invisible_duration
        self._read_only = False
        # producers resend what the old master stored and never answered; a copy that
        # reached this store by replication is found by its unique key, as after a restart:
        # the de-duplication's recovery window starts now (docs/server.md, docs/ha.md)
        self.ctx.had_messages = True
        self.ctx.started_ms = self.ctx.clock()

    async def _unary(
        self,
        context: CallContext,
        response_type: type[Response],
        handler: Callable[[Request, CallInfo], Awaitable[Response]],
        request: Request | Undecodable,
    ) -> Response:
        try:
            call = self.ctx.call_info(context)
            if isinstance(request, Undecodable):
                raise request.refuse(context)
            response = await handler(request, call)
        except Abandoned:
            self._abandon(response_type)
        except asyncio.CancelledError:  # gRPC ended the call: its client left (or we stop)
            if not self.ctx.closing:
                self.ctx.overload.abandoned(response_type.DESCRIPTOR.name.removesuffix("Response"))
            raise
        except Exception as exc:
            response = response_type()
            response.status.CopyFrom(status_of(exc))
        # a gRPC answer made while the loop is busy leaves with the others of its turn
        # (`broker.server.answers`); the native wire's leave at once
        if not getattr(context, "native_wire", False):
            held = self._answers.hold()
            if held is not None:
                await held
            remaining = getattr(context, "time_remaining", None)
            if remaining is not None and remaining() == 0:  # past its deadline: nobody
                self._abandon(response_type)  # takes the answer
        return response

    def _abandon(self, response_type: type[_Answer]) -> NoReturn:
        """A call whose client left (its deadline passed) before its answer: counted and
        not answered (`broker.server.overload`); gRPC has ended the call already."""
        self.ctx.overload.abandoned(response_type.DESCRIPTOR.name.removesuffix("Response"))
        raise asyncio.CancelledError()

    async def QueryRoute(
        self, request: service_pb2.QueryRouteRequest | Undecodable, context: CallContext
    ) -> service_pb2.QueryRouteResponse:
        return await self._unary(
            context, service_pb2.QueryRouteResponse, self.clients.query_route, request
        )

    async def Heartbeat(
        self, request: service_pb2.HeartbeatRequest | Undecodable, context: CallContext
    ) -> service_pb2.HeartbeatResponse:
        return await self._unary(
            context, service_pb2.HeartbeatResponse, self.clients.heartbeat, request
        )

    async def SendMessage(
        self, request: service_pb2.SendMessageRequest | Undecodable, context: CallContext
    ) -> service_pb2.SendMessageResponse:
        return await self._unary(context, service_pb2.SendMessageResponse, self._send, request)

    async def QueryAssignment(
        self, request: service_pb2.QueryAssignmentRequest | Undecodable, context: CallContext
    ) -> service_pb2.QueryAssignmentResponse:
        return await self._unary(
            context, service_pb2.QueryAssignmentResponse, self.clients.query_assignment, request
        )

    async def ReceiveMessage(
        self, request: service_pb2.ReceiveMessageRequest | Undecodable, context: CallContext
    ) -> AsyncIterator[service_pb2.ReceiveMessageResponse]:
        if isinstance(request, Undecodable):
            try:
                self.ctx.call_info(context)
                raise request.refuse(context)
            except Exception as exc:
                for response in self._refused_receive(exc):
                    yield response
            return
        if self._read_only and not self.acting():
            for response in self._refused_receive(ReadOnlySlave()):
                yield response
            return
        answered = False
        try:
            async for response in self.consuming.receive(request, context):
                answered = True
                yield response
        except ServerError as exc:
            # e.g. the client id was claimed by another access key while the call was parked
            if answered:
                raise
            for response in self._refused_receive(exc):
                yield response

    async def ReceiveMessages(
        self, request: service_pb2.ReceiveMessageRequest | Undecodable, context: CallContext
    ) -> protocol_ext.ReceiveMessagesResponse:
        """The extension's receive (`protocol.ext`): the batch in one response."""
        try:
            if isinstance(request, Undecodable):
                self.ctx.call_info(context)
                raise request.refuse(context)
            if self._read_only and not self.acting():
                raise ReadOnlySlave()
            return await self.consuming.receive_batch(request, context)
        except Exception as exc:
            response = protocol_ext.ReceiveMessagesResponse()
            response.status.CopyFrom(status_of(exc))
            convert.set_timestamp_ms(response.delivery_timestamp, self.ctx.clock())
            return response

    async def WireEndpoint(self, request: bytes, context: CallContext) -> dict[str, int | str]:
        """The native wire's port (`protocol.wire`), to a caller whose signature
        holds: `{"port": P}`, 0 when the server offers none."""
        try:
            self.ctx.call_info(context, require_client_id=False)
        except Exception as exc:
            return {"port": 0, "error": status_of(exc).message}
        return {"port": self.ctx.wire_port}

    async def Capabilities(
        self, request: bytes, context: CallContext
    ) -> dict[str, list[str] | str]:
        """What this server accepts beyond the protocol (`protocol.ext`), to a
        caller whose signature holds: `{"capabilities": [...]}`."""
        try:
            self.ctx.call_info(context, require_client_id=False)
        except Exception as exc:
            return {"capabilities": [], "error": status_of(exc).message}
        offered = [protocol_ext.SEND_QUEUE]
        if self.ctx.config.group_resend:
            offered.append(protocol_ext.GROUP_RESEND)
        return {"capabilities": offered}

    def _refused_receive(self, exc: Exception) -> list[service_pb2.ReceiveMessageResponse]:
        """A refused receive, shaped as the protocol wants: a status, then a timestamp."""
        last = service_pb2.ReceiveMessageResponse()
        convert.set_timestamp_ms(last.delivery_timestamp, self.ctx.clock())
        return [service_pb2.ReceiveMessageResponse(status=status_of(exc)), last]

    async def AckMessage(
        self, request: service_pb2.AckMessageRequest | Undecodable, context: CallContext
    ) -> service_pb2.AckMessageResponse:
        return await self._unary(context, service_pb2.AckMessageResponse, self._ack, request)

    async def ForwardMessageToDeadLetterQueue(
        self,
        request: service_pb2.ForwardMessageToDeadLetterQueueRequest | Undecodable,
        context: CallContext,
    ) -> service_pb2.ForwardMessageToDeadLetterQueueResponse:
        return await self._unary(
            context, service_pb2.ForwardMessageToDeadLetterQueueResponse, self._forward, request
        )

    async def EndTransaction(
        self, request: service_pb2.EndTransactionRequest | Undecodable, context: CallContext
    ) -> service_pb2.EndTransactionResponse:
        return await self._unary(
            context, service_pb2.EndTransactionResponse, self._end_transaction, request
        )

    async def Telemetry(
        self,
        request_iterator: AsyncIterator[service_pb2.TelemetryCommand | Undecodable],
        context: StreamContext,
    ) -> AsyncIterator[service_pb2.TelemetryCommand]:
        async for command in self.clients.telemetry(request_iterator, context):
            yield command

    async def NotifyClientTermination(
        self,
        request: service_pb2.NotifyClientTerminationRequest | Undecodable,
        context: CallContext,
    ) -> service_pb2.NotifyClientTerminationResponse:
        async def handler(
            req: service_pb2.NotifyClientTerminationRequest, call: CallInfo
        ) -> service_pb2.NotifyClientTerminationResponse:
            return await self.clients.notify_termination(req, call, self.consuming.release_session)

        return await self._unary(
            context, service_pb2.NotifyClientTerminationResponse, handler, request
        )

    async def ChangeInvisibleDuration(
        self,
        request: service_pb2.ChangeInvisibleDurationRequest | Undecodable,
        context: CallContext,
    ) -> service_pb2.ChangeInvisibleDurationResponse:
        return await self._unary(
            context, service_pb2.ChangeInvisibleDurationResponse, self._change_invisible, request
        )

    async def RecallMessage(
        self, request: service_pb2.RecallMessageRequest | Undecodable, context: CallContext
    ) -> service_pb2.RecallMessageResponse:
        return await self._unary(context, service_pb2.RecallMessageResponse, self._recall, request)

    async def GetOffset(
        self, request: service_pb2.GetOffsetRequest | Undecodable, context: CallContext
    ) -> service_pb2.GetOffsetResponse:
        return await self._unary(
            context, service_pb2.GetOffsetResponse, self.offsets.get_offset, request
        )

    async def QueryOffset(
        self, request: service_pb2.QueryOffsetRequest | Undecodable, context: CallContext
    ) -> service_pb2.QueryOffsetResponse:
        return await self._unary(
            context, service_pb2.QueryOffsetResponse, self.offsets.query_offset, request
        )

    # --- not offered: the Python client never calls these; answer in-band, never crash,
    # and only to a caller whose signature holds, like every other RPC
    @staticmethod
    def _not_offered(what: str) -> Handler:
        async def handler(request: object, call: CallInfo) -> NoReturn:
            raise NotImplementedByServer(f"{what} is not offered")

        return handler

    async def UpdateOffset(
        self, request: service_pb2.UpdateOffsetRequest | Undecodable, context: CallContext
    ) -> service_pb2.UpdateOffsetResponse:
        return await self._unary(
            context, service_pb2.UpdateOffsetResponse, self._not_offered("UpdateOffset"), request
        )

    async def SyncLiteSubscription(
        self, request: service_pb2.SyncLiteSubscriptionRequest | Undecodable, context: CallContext
    ) -> service_pb2.SyncLiteSubscriptionResponse:
        return await self._unary(
            context,
            service_pb2.SyncLiteSubscriptionResponse,
            self._not_offered("SyncLiteSubscription (lite topics)"),
            request,
        )

    async def PullMessage(
        self, request: service_pb2.PullMessageRequest | Undecodable, context: CallContext
    ) -> AsyncIterator[service_pb2.PullMessageResponse]:
        yield await self._unary(
            context, service_pb2.PullMessageResponse, self._not_offered("PullMessage"), request
        )
