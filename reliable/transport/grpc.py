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
- QueryRoute goes to the configured endpoint (the access point): one `host:port`, or
  several IPv4 ones separated by ';' (gRPC's pick-first takes the first that answers). A
  send goes to the endpoints the route names for its queue's broker group (one channel per
  group: the broker groups of `reliable broker start --cluster`, docs/ha.md; a RocketMQ
  cluster's proxies usually name the access point itself); EndTransaction to the group
  that holds the half message. When a topic's readable queues are at several groups'
  endpoints, receives ask each group in turn and a message is acked, changed or
  dead-lettered at the group it came from (`ReceivedMessage.source`); the Telemetry
  streams use the access point.
- The protocol does not report the queue a message was stored in (`SendResultEntry` has
  no queue, the message id is the client's own, and the proxy ignores a queue the client
  names): `SendReceipt.queue_id` is -1; `queue_offset` is the offset the server reports.
- Offsets: `query_offset(group, queue)` (GetOffset) and `min_offset` / `max_offset`
  (QueryOffset) are what `outbox.adapters.TransportOffsets` needs for the resend worker's
  watermark; they are not a pull capability.
- A delay level is sent as an absolute delivery time (the protocol has no delay levels),
  computed from RocketMQ's default level table (`broker.config`).
- Each consumer group gets its own client identity and Telemetry stream (as each official
  client does); a producer opens one when it registers a transaction checker, so the
  server's orphaned-transaction checks reach it.
- Direct delivery (`Capability.DIRECT_CONSUME`): a `verify_message_command` on a
  consumer's stream runs the push consumer's listener on that one message and answers
  `verify_message_result` with OK or FAILED_TO_CONSUME_MESSAGE (NOT_IMPLEMENTED when no
  push consumer of the group runs here); nothing is acknowledged or retried.

- The native wire (docs/wire.md): with `wire="native"` (or `RELIABLE_WIRE=native`) the
  unary calls (sends, acks, the batch receive, routes, heartbeats, offsets...) travel over
  one framed TCP connection per endpoint to the port our server advertises
  (`reliable broker start --wire-port P`; or `wire_endpoint="host:port"`), answered by the
  same server code as over gRPC; ReceiveMessage streams, Telemetry and the admin service
  stay on gRPC. A server that offers no wire port (an Apache RocketMQ proxy) is reached
  over gRPC. Plaintext only: with `tls=True` every call goes over gRPC. A call waited for
  polls its connection for its answer for up to `idle_poll_us` (default 200 µs, adaptive,
  0: never) before it sleeps: on a virtual machine whose idle CPUs halt at once, an answer
  that comes within it costs no halt and wake (`broker.idle_poll`, docs/performance.md).

The transport is three modules, one job each: `_grpc_session` (the channel, calls, routes),
`_grpc_producer` (sends and transactions) and `_grpc_consumer` (receives, acks, offsets,
group settings); `_grpc_wire` holds the protocol conversions and the Telemetry stream.
"""

from __future__ import annotations

from pathlib import Path

from broker.idle_poll import DEFAULT_MAX_US as DEFAULT_IDLE_POLL_US
from reliable.transport._grpc_consumer import ConsumerSide
from reliable.transport._grpc_producer import ProducerSide
from reliable.transport._grpc_session import RECONNECT_OPTIONS, ROUTE_TTL_S
from reliable.transport.base import Capability

__all__ = ["RECONNECT_OPTIONS", "ROUTE_TTL_S", "GrpcTransport"]


class GrpcTransport(ProducerSide, ConsumerSide):
    """A `Transport` over a RocketMQ 5 gRPC endpoint."""

    name = "grpc"
    capabilities = frozenset(
        {
            Capability.BROKER_SIDE_FIFO,
            Capability.SERVER_LEASES,
            Capability.GROUP_ADMIN,
            Capability.DIRECT_CONSUME,
        }
    )

    def __init__(
        self,
        *,
        endpoint: str,
        tls: bool = False,
        ca_file: str | Path | None = None,
        access_key: str = "",
        secret_key: str = "",
        namespace: str = "",
        request_timeout_s: float = 3.0,
        settings_timeout_s: float = 5.0,
        wire: str | None = None,
        wire_endpoint: str | None = None,
        idle_poll_us: int = DEFAULT_IDLE_POLL_US,
    ) -> None:
        super().__init__(
            endpoint=endpoint,
            tls=tls,
            ca_file=ca_file,
            access_key=access_key,
            secret_key=secret_key,
            namespace=namespace,
            request_timeout_s=request_timeout_s,
            settings_timeout_s=settings_timeout_s,
            wire=wire,
            wire_endpoint=wire_endpoint,
            idle_poll_us=idle_poll_us,
        )
