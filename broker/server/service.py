"""`apache.rocketmq.v2.MessagingService`: one method per RPC, each a thin adapter.

Every unary RPC goes through `_unary`: read the caller (client id, namespace, signature),
run the handler, and turn any exception into the response's `Status` with
`broker.server.status.status_of`. A response always carries a status.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from broker.protocol_stubs import service_pb2
from broker.server.clients import ClientHandlers
from broker.server.consuming import ConsumerHandlers
from broker.server.context import CallInfo, ServerContext
from broker.server.errors import NotImplementedByServer
from broker.server.offsets import OffsetHandlers
from broker.server.producing import ProducerHandlers
from broker.server.status import status_of

Handler = Callable[[Any, CallInfo], Awaitable[Any]]


class MessagingServicer:
    """Registered with `add_MessagingServiceServicer_to_server` (duck-typed, no base class)."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.clients = ClientHandlers(ctx)
        self.producing = ProducerHandlers(ctx, self.clients)
        self.consuming = ConsumerHandlers(ctx, self.clients)
        self.offsets = OffsetHandlers(ctx)

    async def _unary(self, context: Any, response_type: Any, handler: Handler,
                     request: Any) -> Any:
        try:
            call = self.ctx.call_info(context)
            return await handler(request, call)
        except Exception as exc:
            response = response_type()
            response.status.CopyFrom(status_of(exc))
            return response

    async def QueryRoute(self, request: Any, context: Any) -> Any:
        return await self._unary(context, service_pb2.QueryRouteResponse,
                                 self.clients.query_route, request)

    async def Heartbeat(self, request: Any, context: Any) -> Any:
        return await self._unary(context, service_pb2.HeartbeatResponse,
                                 self.clients.heartbeat, request)

    async def SendMessage(self, request: Any, context: Any) -> Any:
        return await self._unary(context, service_pb2.SendMessageResponse,
                                 self.producing.send, request)

    async def QueryAssignment(self, request: Any, context: Any) -> Any:
        return await self._unary(context, service_pb2.QueryAssignmentResponse,
                                 self.clients.query_assignment, request)

    async def ReceiveMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async for response in self.consuming.receive(request, context):
            yield response

    async def AckMessage(self, request: Any, context: Any) -> Any:
        return await self._unary(context, service_pb2.AckMessageResponse,
                                 self.consuming.ack, request)

    async def ForwardMessageToDeadLetterQueue(self, request: Any,
                                              context: Any) -> Any:
        return await self._unary(context, service_pb2.ForwardMessageToDeadLetterQueueResponse,
                                 self.consuming.forward_to_dlq, request)

    async def EndTransaction(self, request: Any, context: Any) -> Any:
        return await self._unary(context, service_pb2.EndTransactionResponse,
                                 self.producing.end_transaction, request)

    async def Telemetry(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        async for command in self.clients.telemetry(request_iterator, context):
            yield command

    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        async def handler(req: Any, call: CallInfo) -> Any:
            return await self.clients.notify_termination(req, call,
                                                         self.consuming.release_session)

        return await self._unary(context, service_pb2.NotifyClientTerminationResponse,
                                 handler, request)

    async def ChangeInvisibleDuration(self, request: Any, context: Any) -> Any:
        return await self._unary(context, service_pb2.ChangeInvisibleDurationResponse,
                                 self.consuming.change_invisible_duration, request)

    async def RecallMessage(self, request: Any, context: Any) -> Any:
        return await self._unary(context, service_pb2.RecallMessageResponse,
                                 self.producing.recall, request)

    async def GetOffset(self, request: Any, context: Any) -> Any:
        return await self._unary(context, service_pb2.GetOffsetResponse,
                                 self.offsets.get_offset, request)

    async def QueryOffset(self, request: Any, context: Any) -> Any:
        return await self._unary(context, service_pb2.QueryOffsetResponse,
                                 self.offsets.query_offset, request)

    # --- not offered: the Python client never calls these; answer in-band, never crash
    async def _not_offered(self, context: Any, response_type: Any, what: str) -> Any:
        response = response_type()
        response.status.CopyFrom(status_of(NotImplementedByServer(f"{what} is not offered")))
        return response

    async def UpdateOffset(self, request: Any, context: Any) -> Any:
        return await self._not_offered(context, service_pb2.UpdateOffsetResponse, "UpdateOffset")

    async def SyncLiteSubscription(self, request: Any, context: Any) -> Any:
        return await self._not_offered(context, service_pb2.SyncLiteSubscriptionResponse,
                                       "SyncLiteSubscription (lite topics)")

    async def PullMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        response = service_pb2.PullMessageResponse()
        response.status.CopyFrom(status_of(NotImplementedByServer("PullMessage is not offered")))
        yield response
