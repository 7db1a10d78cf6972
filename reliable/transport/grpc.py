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

`GrpcTransport` is a facade over collaborators with one job each, which it builds and
wires together: `_grpc_session` (the channels, calls and routes; every other one calls
through it), `_grpc_telemetry` (each client identity's Telemetry streams), `_grpc_producer`
(sends and transactions), `_grpc_consumer` (consumer identities, receives, offsets, what a
group's Settings say), `_grpc_acks` (acks, invisible-time changes, dead-lettering) and
`_grpc_admin` (group administration through our server's admin service);
`_grpc_convert` holds the protocol conversions they share and `_native_wire` the unary
calls over the native wire.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from broker.idle_poll import DEFAULT_MAX_US as DEFAULT_IDLE_POLL_US
from protocol.names import dlq_topic, retry_topic
from reliable.message import Message, ReceivedMessage, SendReceipt
from reliable.transport._grpc_acks import AckDone, AckResults, Acks
from reliable.transport._grpc_admin import GroupAdminCalls
from reliable.transport._grpc_consumer import ConsumerSide
from reliable.transport._grpc_producer import Done, ProducerSide
from reliable.transport._grpc_session import (
    RECONNECT_OPTIONS,
    ROUTE_TTL_S,
    GrpcSession,
    Metadata,
    Stub,
)
from reliable.transport._grpc_telemetry import Telemetry
from reliable.transport.base import (
    Capability,
    ConsumeFrom,
    DirectListener,
    QueueRef,
    TopicRoute,
    TransactionChecker,
    TransactionRef,
    TransactionState,
)

__all__ = ["RECONNECT_OPTIONS", "ROUTE_TTL_S", "GrpcTransport"]


class GrpcTransport:
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
        self._session = session = GrpcSession(
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
        telemetry = Telemetry(session)
        self._producer = ProducerSide(session, telemetry)
        self._consumer = ConsumerSide(session, telemetry)
        self._acks = Acks(session, self._consumer)
        self._admin = GroupAdminCalls(session)

    # --- what the session is (read by tools and tests)
    @property
    def endpoint(self) -> str:
        """The access point, `host:port` (a bare host means the default port)."""
        return self._session.endpoint

    @property
    def wire(self) -> str:
        """How the unary calls travel: "native" (where the server offers it) or "grpc"."""
        return self._session.wire

    @property
    def stub(self) -> Stub | None:
        """The access point's stub (a `NativeStub` over the native wire); None until started."""
        return self._session.stub

    @property
    def requests(self) -> dict[str, int]:
        """SendMessage and AckMessage requests made so far."""
        return self._session.requests

    @property
    def batch_receive(self) -> bool | None:
        """Whether the server offers the batch receive (None: not asked yet)."""
        return self._session.batch_receive

    def metadata(self, client_id: str) -> Metadata:
        """The metadata of a call made under `client_id` (signed, when keys are set)."""
        return self._session.metadata(client_id)

    # --- lifecycle
    def start(self) -> None:
        self._session.start()

    def close(self) -> None:
        """Tell the servers this process's client identities are gone, then close."""
        with self._session.lock:
            self._consumer.end()
            self._producer.end()
            self._session.close()

    # --- producing
    def route(self, topic: str) -> TopicRoute:
        return self._session.route(topic)

    def send(
        self,
        message: Message,
        queue: QueueRef,
        *,
        producer_group: str | None = None,
        transactional: bool = False,
        timeout_s: float | None = None,
    ) -> SendReceipt:
        return self._producer.send(
            message,
            queue,
            producer_group=producer_group,
            transactional=transactional,
            timeout_s=timeout_s,
        )

    def send_batch(
        self, messages: Sequence[Message], queue: QueueRef, *, producer_group: str | None = None
    ) -> list[SendReceipt]:
        return self._producer.send_batch(messages, queue, producer_group=producer_group)

    def submit_send(
        self,
        messages: Sequence[Message],
        queue: QueueRef,
        *,
        producer_group: str | None,
        timeout_s: float | None,
        done: Done,
    ) -> None:
        """Pipelined sends: `ProducerSide.submit_send`."""
        self._producer.submit_send(
            messages, queue, producer_group=producer_group, timeout_s=timeout_s, done=done
        )

    def recall(self, topic: str, recall_handle: str) -> str:
        return self._producer.recall(topic, recall_handle)

    def end_transaction(
        self,
        producer_group: str,
        ref: TransactionRef,
        state: TransactionState,
        *,
        from_check: bool = False,
    ) -> None:
        self._producer.end_transaction(producer_group, ref, state, from_check=from_check)

    def set_transaction_checker(
        self, producer_group: str, checker: TransactionChecker | None
    ) -> None:
        self._producer.set_transaction_checker(producer_group, checker)

    def group_resend_supported(self) -> bool:
        """Whether the server takes a per-group resend (`ProducerSide`)."""
        return self._producer.group_resend_supported()

    def server_capabilities(self) -> frozenset[str]:
        """What the server offers beyond the protocol (`protocol.ext`), asked once."""
        return self._producer.server_capabilities()

    # --- consumer identities and receiving
    def heartbeat(
        self, client_id: str, group: str, subscriptions: Mapping[str, Collection[str] | None]
    ) -> None:
        self._consumer.heartbeat(client_id, group, subscriptions)

    def unregister(self, client_id: str, group: str) -> None:
        self._consumer.unregister(client_id, group)

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
        return self._consumer.receive(
            group,
            topic,
            max_msgs,
            invisible_ms,
            tags,
            long_poll_ms=long_poll_ms,
            fifo=fifo,
            auto_renew=auto_renew,
        )

    def group_is_fifo(self, group: str) -> bool | None:
        return self._consumer.group_is_fifo(group)

    def max_delivery_attempts(self, group: str) -> int:
        return self._consumer.max_delivery_attempts(group)

    def delay_levels_ms(self, group: str | None = None) -> list[int]:
        return self._consumer.delay_levels_ms(group)

    def consumer_client_id(self, group: str) -> str:
        return self._consumer.consumer_client_id(group)

    def set_direct_listener(self, group: str, listener: DirectListener | None) -> None:
        self._consumer.set_direct_listener(group, listener)

    # --- offsets (what the resend worker's watermark reads)
    def query_offset(self, group: str, queue: QueueRef) -> int:
        return self._consumer.query_offset(group, queue)

    def min_offset(self, queue: QueueRef) -> int:
        return self._consumer.min_offset(queue)

    def max_offset(self, queue: QueueRef) -> int:
        return self._consumer.max_offset(queue)

    # --- what becomes of a received message
    def ack(self, group: str, message: ReceivedMessage) -> None:
        self._acks.ack(group, message)

    def ack_many(self, group: str, messages: Sequence[ReceivedMessage]) -> AckResults:
        return self._acks.ack_many(group, messages)

    def submit_ack(self, group: str, messages: Sequence[ReceivedMessage], done: AckDone) -> None:
        self._acks.submit_ack(group, messages, done)

    def change_invisible_duration(
        self, group: str, message: ReceivedMessage, invisible_ms: int
    ) -> str:
        return self._acks.change_invisible_duration(group, message, invisible_ms)

    def submit_change_invisible(
        self,
        group: str,
        message: ReceivedMessage,
        invisible_ms: int,
        done: Callable[[str | BaseException], None],
    ) -> None:
        self._acks.submit_change_invisible(group, message, invisible_ms, done)

    def forward_to_dlq(self, group: str, message: ReceivedMessage) -> None:
        self._acks.forward_to_dlq(group, message)

    def retry_topic(self, group: str) -> str:
        return retry_topic(group)

    def dlq_topic(self, group: str) -> str:
        return dlq_topic(group)

    # --- group administration (`Capability.GROUP_ADMIN`)
    def set_group_start(
        self, group: str, topic: str, where: ConsumeFrom, timestamp_ms: int | None = None
    ) -> bool:
        return self._admin.set_group_start(group, topic, where, timestamp_ms)

    def make_group_fifo(self, group: str) -> bool:
        return self._admin.make_group_fifo(group)

    def park_message_group(self, group: str, topic: str, message_group: str) -> bool:
        return self._admin.park_message_group(group, topic, message_group)
