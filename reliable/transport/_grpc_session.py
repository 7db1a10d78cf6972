"""The grpc transport's session: the channels (the access point's and one per broker group
a route names), the calls' metadata and status checks, topic routes, and the notice that a
client identity is gone.

The other collaborators of `reliable.transport.grpc.GrpcTransport` (the producer and
consumer sides, the Telemetry streams) call through it; it knows none of them. Whoever
must act when a route names a broker group's master not seen before subscribes with
`on_target_learned`.
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
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple, Protocol, TypeAlias, TypeVar, cast

import grpc

from broker.config import with_default_port
from broker.idle_poll import DEFAULT_MAX_US as DEFAULT_IDLE_POLL_US
from broker.idle_poll import check_max_us
from protocol.signing import authorization
from protocol.wire import WIRE_ENDPOINT_PATH
from reliable.errors import BrokerCallError, ConfigurationError, TransportError
from reliable.transport import _grpc_convert as convert
from reliable.transport._native_wire import GrpcMethod, NativeStub
from reliable.transport._native_wire import Metadata as WireMetadata
from reliable.transport._pb import definition_pb2, protocol_ext, service_pb2, service_pb2_grpc
from reliable.transport._wire_tls import client_context
from reliable.transport.base import QueueRef, TopicRoute

log = logging.getLogger("reliable.transport.grpc")

# gRPC's default reconnect backoff (1 s growing x1.6 to 120 s) kept sends failing for
# seconds after the broker was back; a broker restart is the usual outage, so retry the
# connection within about a second (attempts stay cheap: one TCP connect each).
# `min_reconnect_backoff_ms` is not a backoff in gRPC's core: it is the time one connection
# attempt may take (TCP connect and the HTTP/2 SETTINGS exchange). At 100 ms a busy host
# failed healthy connections ("timed out before receiving SETTINGS frame"); a refused
# connection still fails at once, and the next attempt follows the backoff above.
CONNECT_TIMEOUT_MS = 5_000
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]

ROUTE_TTL_S = 30.0

# how the unary calls travel (docs/wire.md): "native" (the server's native wire when it
# offers one, else gRPC) or "grpc"; the environment's RELIABLE_WIRE when not configured.
# Native by default: measured, it costs less CPU per message on both sides in every case
# (docs/performance.md#the-native-wire), and a server offers it only when its operator
# opens the port (`reliable broker start --wire-port`)
WIRES = ("grpc", "native")
DEFAULT_WIRE = "native"

# the generated stub; a `NativeStub` stands in for it when the unary calls go over the
# native wire (it answers every unary method, and hands the streams to the stub under it)
Stub = service_pb2_grpc.MessagingServiceStub
Metadata = tuple[tuple[str, str], ...]
# (grpc's classes are generic to the type checker alone: these aliases are strings)
BatchReceive: TypeAlias = (
    "grpc.UnaryUnaryMultiCallable[service_pb2.ReceiveMessageRequest, "
    "protocol_ext.ReceiveMessagesResponse]"
)
JsonCall: TypeAlias = "grpc.UnaryUnaryMultiCallable[bytes, object]"
Request = TypeVar("Request")
Response = TypeVar("Response", bound="_Answer")
Answer = TypeVar("Answer")
Outcome = TypeVar("Outcome")


class _Answer(Protocol):
    """A unary call's response: every one carries the protocol's status."""

    @property
    def status(self) -> definition_pb2.Status: ...


class _Dialed(NamedTuple):
    channel: grpc.Channel
    stub: Stub
    native: NativeStub | None  # the stub when its unary calls go over the native wire


def wire_of(value: str | None) -> str:
    chosen = (value or os.environ.get("RELIABLE_WIRE") or DEFAULT_WIRE).strip().lower()
    if chosen not in WIRES:
        raise ConfigurationError(f"wire {chosen!r}: choose one of {', '.join(WIRES)}")
    return chosen


class GrpcSession:
    """The channels, the calls and the routes that every collaborator of the transport uses."""

    _ids = itertools.count()

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
        self.endpoint = endpoint = with_default_port(endpoint)  # `host` means our port
        try:
            self._idle_poll_us = check_max_us(idle_poll_us)
        except ValueError as exc:
            raise ConfigurationError(f"idle_poll_us: {exc}") from None
        self.wire = "native" if wire_endpoint else wire_of(wire)
        self._wire_endpoint = (
            convert.parse_endpoint(wire_endpoint).addresses[0] if wire_endpoint else None
        )
        self.access_point = convert.parse_endpoint(endpoint)
        self._target = convert.channel_target(self.access_point)
        self._tls, self._ca_file = tls, ca_file
        self._access_key, self._secret_key = access_key, secret_key
        self.namespace = namespace
        self.timeout = request_timeout_s
        self.settings_timeout = settings_timeout_s
        self.base_id = (
            f"{socket.gethostname()}@{os.getpid()}@{next(self._ids)}@{uuid.uuid4().hex[:8]}"
        )
        self._rid = f"{uuid.uuid4().hex[:16]}-"
        self._rids = itertools.count(1)
        # one lock for the session and every collaborator's state that opens channels or
        # streams under it (reentrant: a collaborator holding it may dial a group's master)
        self.lock = threading.RLock()
        self._access: _Dialed | None = None  # the access point's channel, once started
        self._brokers: dict[str, str] = {}  # topic -> a broker name from its route
        # broker name -> the gRPC target its route queues name (their endpoints), and one
        # channel per target other than the access point's
        self._broker_targets: dict[str, str] = {}
        self._wire_ports: dict[str, int] = {}  # target -> its native wire port, from routes
        self._channels: dict[str, _Dialed] = {}
        self._routes: dict[str, tuple[float, TopicRoute]] = {}  # topic -> (fetched at, route)
        self._learned: list[Callable[[str], None]] = []  # told of a group master's target
        self._static_md: dict[str, Metadata] = {}  # client id -> fixed metadata
        self._md_second = -1
        self._md_date = ""
        self.requests = {"SendMessage": 0, "AckMessage": 0}  # requests made (observability)
        # the server's batch receive (`protocol.ext`): None until a call tells
        self.receive_messages: BatchReceive | None = None
        self.batch_receive: bool | None = None

    # --- lifecycle
    @property
    def stub(self) -> Stub | None:
        """The access point's stub (None before `start` and after `close`)."""
        return self._access.stub if self._access is not None else None

    def start(self) -> None:
        with self.lock:
            if self._access is not None:
                return
            channel = self._open(self._target)
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            receive: BatchReceive = channel.unary_unary(
                protocol_ext.RECEIVE_MESSAGES_PATH,
                request_serializer=service_pb2.ReceiveMessageRequest.SerializeToString,
                response_deserializer=protocol_ext.ReceiveMessagesResponse.FromString,
            )
            native = None
            if self.wire == "native":
                explicit = self._wire_endpoint
                native = self._native(
                    channel,
                    stub,
                    receive,
                    self._target,
                    (explicit.host, int(explicit.port)) if explicit is not None else None,
                )
                receive = cast(BatchReceive, native.receive_messages)
            self._access = self._dialed(channel, stub, native)
            self.receive_messages = receive

    @staticmethod
    def _dialed(channel: grpc.Channel, stub: Stub, native: NativeStub | None) -> _Dialed:
        return _Dialed(channel, cast(Stub, native) if native is not None else stub, native)

    def json_method(self, path: str, channel: grpc.Channel | None = None) -> JsonCall:
        """A call of our server's own services (not the protocol's): a request of raw bytes,
        a JSON answer; on the access point's channel unless another is given."""
        if channel is None:
            self.require()
            assert self._access is not None
            channel = self._access.channel
        return channel.unary_unary(
            path,
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: json.loads(raw.decode() or "{}"),
        )

    def _native(
        self,
        channel: grpc.Channel,
        stub: Stub,
        receive_messages: BatchReceive | None,
        target: str,
        address: tuple[str, int] | None = None,
        *,
        advertised: bool = False,
    ) -> NativeStub:
        """The stub that sends `target`'s unary calls over its native wire (docs/wire.md):
        at `address` if given, else at the port the server advertises on the host of
        `target` (its first address), over gRPC when it advertises none."""
        ask = self.json_method(WIRE_ENDPOINT_PATH, channel)

        def ask_port(metadata: WireMetadata | None, timeout: float | None) -> int | None:
            """The advertised port (0: none); None when the server would not say."""
            reply = ask(
                b"",
                timeout=min(timeout or self.timeout, self.timeout),
                metadata=metadata or self.metadata(self.base_id),
            )
            if not isinstance(reply, dict) or reply.get("error"):
                return None
            return int(reply.get("port") or 0)

        host = _host_of(target)
        if address is not None:
            host = address[0]
        return NativeStub(
            stub,
            cast("GrpcMethod | None", receive_messages),
            host=host,
            ask_port=ask_port,
            port=address[1] if address is not None else None,
            advertised=advertised,
            connect_timeout_s=self.timeout,
            idle_poll_us=self._idle_poll_us,
            tls=client_context(str(self._ca_file) if self._ca_file else None)
            if self._tls
            else None,
        )

    def _open(self, target: str) -> grpc.Channel:
        options = [
            ("grpc.enable_retries", 0),
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
            *RECONNECT_OPTIONS,
        ]
        if self._tls:
            roots = Path(self._ca_file).read_bytes() if self._ca_file else None
            return grpc.secure_channel(target, grpc.ssl_channel_credentials(roots), options)
        return grpc.insecure_channel(target, options)

    def stub_for(self, broker: str | None) -> tuple[Stub, str]:
        """The stub that reaches `broker` and its target: the endpoints its route queues
        name (a broker group of a cluster), else the access point's."""
        return self.stub_at(self._broker_targets.get(broker) if broker else None)

    def stub_at(self, target: str | None) -> tuple[Stub, str]:
        """The stub of a gRPC target (a broker group's endpoints) and the target; the
        access point's for None or the access point's own target."""
        if target is None or target == self._target:
            return self.require(), self.endpoint
        found = self._channels.get(target)
        if found is None:
            with self.lock:
                self.require()
                found = self._channels.get(target)
                if found is None:
                    channel = self._open(target)
                    stub = service_pb2_grpc.MessagingServiceStub(channel)
                    native = None
                    if self.wire == "native":
                        port = self._wire_ports.get(target)
                        address = (_host_of(target), port) if port else None
                        native = self._native(channel, stub, None, target, address, advertised=True)
                    found = self._channels[target] = self._dialed(channel, stub, native)
        return found.stub, target

    @property
    def started(self) -> bool:
        return self._access is not None

    def close(self) -> None:
        """Close every channel (the collaborators have ended their identities first)."""
        with self.lock:
            for dialed in [*self._channels.values(), *filter(None, [self._access])]:
                if dialed.native is not None:
                    dialed.native.close()
                dialed.channel.close()
            self._channels.clear()
            self._access = None
            self.receive_messages = None

    def notify_termination(
        self, client_id: str, group: str | None, targets: Iterable[str] = ()
    ) -> None:
        """Tell the access point's server, and each group master's `targets`, that the
        client identity is gone (failures are logged: the server forgets it anyway)."""
        request = service_pb2.NotifyClientTerminationRequest()
        if group:
            self.resource(request.group, group)
        for target in [None, *targets]:
            stub, where = self.stub_at(target)
            try:
                response = stub.NotifyClientTermination(
                    request, timeout=self.timeout, metadata=self.metadata(client_id)
                )
                convert.check_status(response.status, "NotifyClientTermination")
            except (grpc.RpcError, BrokerCallError) as exc:
                log.debug("termination notice for %s to %s failed: %s", client_id, where, exc)

    # --- the group masters the routes name (each client identity keeps a Telemetry
    # stream to each, as the official clients do)
    def group_targets(self) -> list[str]:
        """The targets of the broker groups' masters the routes named so far, other than
        the access point's."""
        with self.lock:
            return [t for t in dict.fromkeys(self._broker_targets.values()) if t != self._target]

    def on_target_learned(self, listener: Callable[[str], None]) -> None:
        """Call `listener` with each group master's target a route names for the first
        time (without the lock held)."""
        self._learned.append(listener)

    # --- calls
    def metadata(self, client_id: str) -> Metadata:
        second = int(time.time())
        if second != self._md_second:  # the date header changes once a second, not per call
            self._md_date = datetime.fromtimestamp(second, UTC).strftime("%Y%m%dT%H%M%SZ")
            self._md_second = second
        now = self._md_date
        static = self._static_md.get(client_id)
        if static is None:
            static = (
                ("x-mq-language", "PYTHON"),
                ("x-mq-protocol", "GRPC_V2"),
                ("x-mq-client-version", convert.VERSION),
                ("x-mq-client-id", client_id),
                ("x-mq-namespace", self.namespace),
            )
            if len(self._static_md) < 1024:
                self._static_md[client_id] = static
        # unique per call: this session's random prefix and a counter (a uuid4 per call
        # cost more than the rest of the metadata)
        md = (
            *static,
            ("x-mq-date-time", now),
            ("x-mq-request-id", f"{self._rid}{next(self._rids)}"),
        )
        if self._access_key:
            md += (("authorization", authorization(self._access_key, self._secret_key, now)),)
        return md

    def require(self) -> Stub:
        if self._access is None:
            raise ConfigurationError("the grpc transport is not started")
        return self._access.stub

    def unary(
        self,
        pick: Callable[[Stub], grpc.UnaryUnaryMultiCallable[Request, Response]],
        request: Request,
        client_id: str | None = None,
        timeout_s: float | None = None,
        broker: str | None = None,
    ) -> Response:
        """One call (`pick` names it on a stub: `lambda s: s.GetOffset`), to the access
        point or, given a broker group's name, to that group; its status checked."""
        method = type(request).__name__.removesuffix("Request")  # X takes an XRequest
        stub, target = self.stub_for(broker) if broker else (self.require(), self.endpoint)
        try:
            response = pick(stub)(
                request,
                timeout=timeout_s or self.timeout,
                metadata=self.metadata(client_id or self.base_id),
            )
        except grpc.RpcError as exc:
            raise convert.call_failure(method, target, exc) from None
        convert.check_status(response.status, method)
        return response

    def resource(self, target: definition_pb2.Resource, name: str) -> None:
        target.name, target.resource_namespace = name, self.namespace

    def when_answered(
        self,
        call: grpc.Future[Answer],
        method: str,
        read: Callable[[Answer], Outcome],
        done: Callable[[Outcome | BaseException], None],
        on_rpc_error: Callable[[], None] | None = None,
        target: str | None = None,
    ) -> None:
        """Hand a future call's outcome to `done` on gRPC's completion thread: `read` of the
        response, or the error of the whole request (a TransportError for the call itself;
        an answer that cannot be read fails the whole request too)."""
        where = target or self.endpoint

        def finished(f: grpc.Future[Answer]) -> None:
            try:
                response = f.result()
            except grpc.RpcError as exc:
                if on_rpc_error is not None:
                    on_rpc_error()
                done(convert.call_failure(method, where, exc))
                return
            except Exception as exc:  # cancelled on close
                done(TransportError(f"{method} to {where}: {exc!r}"))
                return
            try:
                results = read(response)
            except Exception as exc:
                done(exc)
                return
            done(results)

        call.add_done_callback(finished)

    # --- routes
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

    def cached_route(self, topic: str) -> TopicRoute | None:
        """The topic's route as last fetched, if any (never asks)."""
        cached = self._routes.get(topic)
        return cached[1] if cached is not None else None

    def broker_of(self, topic: str) -> str | None:
        """A broker group the topic's last route named (None: no route fetched yet)."""
        return self._brokers.get(topic)

    def known(self, broker: str | None) -> str | None:
        """`broker` if a route named its endpoints, else None (the access point serves it)."""
        return broker if broker in self._broker_targets else None

    def read_brokers(self, topic: str) -> list[str]:
        """The broker groups a topic is read from when they are several, each at its own
        endpoints (a cluster's groups); [] when the access point serves it all."""
        route = self.route(topic)
        brokers = list(dict.fromkeys(q.broker for q in route.read_queues))
        targets = {self._broker_targets.get(b, self._target) for b in brokers}
        return brokers if len(targets) > 1 else []

    def endpoints_of(self, broker: str | None) -> definition_pb2.Endpoints:
        """The protocol's Endpoints of a broker group (the access point's when unknown)."""
        target = self._broker_targets.get(broker) if broker else None
        if target is None:
            return self.access_point
        return convert.parse_endpoint(target.removeprefix("ipv4:").replace(",", ";"))

    def forget_route(self, topic: str) -> None:
        self._routes.pop(topic, None)

    def _query_route(self, topic: str) -> TopicRoute:
        request = service_pb2.QueryRouteRequest()
        self.resource(request.topic, topic)
        request.endpoints.CopyFrom(self.access_point)
        response = self._route_call(request)
        writes: list[QueueRef] = []
        reads: list[QueueRef] = []
        learned: list[str] = []
        for mq in response.message_queues:
            # a group whose master is down is served by its slave, READ only (it serves
            # receives and acks for it): read from it, never send to it
            if mq.broker.id != 0 and mq.permission != convert.READ:
                continue
            if mq.broker.endpoints.addresses:
                target = convert.channel_target(mq.broker.endpoints)
                wire_port = protocol_ext.wire_port_of(mq.broker)
                with self.lock:
                    if wire_port:  # where its native wire is: dialled without asking
                        self._wire_ports[target] = wire_port
                    if target != self._target and target not in self._broker_targets.values():
                        learned.append(target)
                    self._broker_targets[mq.broker.name] = target
            ref = QueueRef(topic, mq.broker.name, int(mq.id))
            if mq.permission in (convert.WRITE, convert.READ_WRITE):
                writes.append(ref)
            if mq.permission in (convert.READ, convert.READ_WRITE):
                reads.append(ref)
        if reads or writes:
            self._brokers[topic] = (reads or writes)[0].broker
        for target in dict.fromkeys(learned):
            for listener in self._learned:
                listener(target)
        return TopicRoute(topic, tuple(writes), tuple(reads))

    def _route_call(self, request: service_pb2.QueryRouteRequest) -> service_pb2.QueryRouteResponse:
        """QueryRoute at the access point, else at each group master a route named before.

        Every server of a cluster answers routes for every group, as the access point
        does: when the access point's server has just died (its channel not reconnected
        yet, or an access point naming that server alone), the next route, and with it
        every send's next attempt, comes from a live master at once. The access point's
        error is raised when no master answers either."""
        try:
            return self.unary(lambda s: s.QueryRoute, request)
        except TransportError as first:
            with self.lock:  # one group name per target other than the access point's
                masters = {t: b for b, t in self._broker_targets.items() if t != self._target}
            for broker in masters.values():
                try:
                    response = self.unary(lambda s: s.QueryRoute, request, broker=broker)
                except TransportError:
                    continue
                log.info("%s; the route came from group %s instead", first, broker)
                return response
            raise first


def _host_of(target: str) -> str:
    """The host of a gRPC target's first address ('h:p' or 'ipv4:h:p,h:p')."""
    return target.removeprefix("ipv4:").split(",")[0].rpartition(":")[0]
