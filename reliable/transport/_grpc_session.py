"""The grpc transport's session: one channel to one endpoint, the calls' metadata and
status checks, topic routes and client identities' termination.

`_grpc_producer` and `_grpc_consumer` add the two sides; `reliable.transport.grpc` puts
them together as `GrpcTransport`.
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
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from broker.config import with_default_port
from broker.idle_poll import DEFAULT_MAX_US as DEFAULT_IDLE_POLL_US
from broker.idle_poll import check_max_us
from protocol.names import dlq_topic, retry_topic
from protocol.signing import authorization
from protocol.wire import WIRE_ENDPOINT_PATH
from reliable.errors import BrokerCallError, ConfigurationError, TransportError
from reliable.transport import _grpc_wire
from reliable.transport import _grpc_wire as wire
from reliable.transport._native_wire import NativeStub
from reliable.transport._pb import protocol_ext, service_pb2, service_pb2_grpc
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


def wire_of(value: str | None) -> str:
    chosen = (value or os.environ.get("RELIABLE_WIRE") or DEFAULT_WIRE).strip().lower()
    if chosen not in WIRES:
        raise ConfigurationError(f"wire {chosen!r}: choose one of {', '.join(WIRES)}")
    return chosen


class GrpcSession:
    """The channel, the calls and the routes that both sides of the transport use."""

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
            _grpc_wire.parse_endpoint(wire_endpoint).addresses[0] if wire_endpoint else None
        )
        self._access_point = _grpc_wire.parse_endpoint(endpoint)
        self._target = _grpc_wire.channel_target(self._access_point)
        self._tls, self._ca_file = tls, ca_file
        self._access_key, self._secret_key = access_key, secret_key
        self._namespace = namespace
        self._timeout = request_timeout_s
        self._settings_timeout = settings_timeout_s
        self._base_id = (
            f"{socket.gethostname()}@{os.getpid()}@{next(self._ids)}@{uuid.uuid4().hex[:8]}"
        )
        self._rid = f"{uuid.uuid4().hex[:16]}-"
        self._rids = itertools.count(1)
        self._lock = threading.RLock()
        self._channel: Any = None
        self.stub: Any = None
        self._brokers: dict[str, str] = {}  # topic -> a broker name from its route
        # broker name -> the gRPC target its route queues name (their endpoints), and one
        # stub per target other than the access point's
        self._broker_targets: dict[str, str] = {}
        self._wire_ports: dict[str, int] = {}  # target -> its native wire port, from routes
        self._channels: dict[str, tuple[Any, Any]] = {}
        self._routes: dict[str, tuple[float, TopicRoute]] = {}  # topic -> (fetched at, route)
        self._static_md: dict[str, list[tuple[str, str]]] = {}  # client id -> fixed metadata
        self._md_second = -1
        self._md_date = ""
        self.requests = {"SendMessage": 0, "AckMessage": 0}  # requests made (observability)
        # the server's batch receive (`protocol.ext`): None until a call tells
        self.receive_messages: Any = None
        self.batch_receive: bool | None = None

    # --- lifecycle
    def start(self) -> None:
        with self._lock:
            if self._channel is not None:
                return
            self._channel = self._open(self._target)
            self.stub = service_pb2_grpc.MessagingServiceStub(self._channel)
            self.receive_messages = self._channel.unary_unary(
                protocol_ext.RECEIVE_MESSAGES_PATH,
                request_serializer=service_pb2.ReceiveMessageRequest.SerializeToString,
                response_deserializer=protocol_ext.ReceiveMessagesResponse.FromString,
            )
            if self.wire == "native":
                explicit = self._wire_endpoint
                self.stub = self._native(
                    self._channel,
                    self.stub,
                    self.receive_messages,
                    self._target,
                    (explicit.host, int(explicit.port)) if explicit is not None else None,
                )
                self.receive_messages = self.stub.receive_messages

    def _native(
        self,
        channel: Any,
        stub: Any,
        receive_messages: Any,
        target: str,
        address: tuple[str, int] | None = None,
        *,
        advertised: bool = False,
    ) -> NativeStub:
        """The stub that sends `target`'s unary calls over its native wire (docs/wire.md):
        at `address` if given, else at the port the server advertises on the host of
        `target` (its first address), over gRPC when it advertises none."""
        ask = channel.unary_unary(
            WIRE_ENDPOINT_PATH,
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: json.loads(raw.decode() or "{}"),
        )

        def ask_port(metadata: Any, timeout: float | None) -> int | None:
            """The advertised port (0: none); None when the server would not say."""
            reply = ask(
                b"",
                timeout=min(timeout or self._timeout, self._timeout),
                metadata=metadata or self.metadata(self._base_id),
            )
            if not isinstance(reply, dict) or reply.get("error"):
                return None
            return int(reply.get("port") or 0)

        host = target.removeprefix("ipv4:").split(",")[0].rpartition(":")[0]
        if address is not None:
            host = address[0]
        return NativeStub(
            stub,
            receive_messages,
            host=host,
            ask_port=ask_port,
            port=address[1] if address is not None else None,
            advertised=advertised,
            connect_timeout_s=self._timeout,
            idle_poll_us=self._idle_poll_us,
            tls=client_context(str(self._ca_file) if self._ca_file else None)
            if self._tls
            else None,
        )

    def _open(self, target: str) -> Any:
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

    def stub_for(self, broker: str | None) -> tuple[Any, str]:
        """The stub that reaches `broker` and its target: the endpoints its route queues
        name (a broker group of a cluster), else the access point's."""
        return self.stub_at(self._broker_targets.get(broker) if broker else None)

    def stub_at(self, target: str | None) -> tuple[Any, str]:
        """The stub of a gRPC target (a broker group's endpoints) and the target; the
        access point's for None or the access point's own target."""
        if target is None or target == self._target:
            return self._require(), self.endpoint
        found = self._channels.get(target)
        if found is None:
            with self._lock:
                self._require()
                found = self._channels.get(target)
                if found is None:
                    channel = self._open(target)
                    stub: Any = service_pb2_grpc.MessagingServiceStub(channel)
                    if self.wire == "native":
                        port = self._wire_ports.get(target)
                        host = target.removeprefix("ipv4:").split(",")[0].rpartition(":")[0]
                        address = (host, port) if port else None
                        stub = self._native(channel, stub, None, target, address, advertised=True)
                    found = (channel, stub)
                    self._channels[target] = found
        return found[1], target

    def close(self) -> None:
        with self._lock:
            self._end_clients()
            for channel, stub in self._channels.values():
                if isinstance(stub, NativeStub):
                    stub.close()
                channel.close()
            self._channels.clear()
            if isinstance(self.stub, NativeStub):
                self.stub.close()
            if self._channel is not None:
                self._channel.close()
                self._channel = None
                self.stub = None
                self.receive_messages = None

    def _end_clients(self) -> None:
        """Tell the server this process's client identities are gone (the producer and
        consumer sides add theirs); called by `close` under the lock."""

    def _terminate(
        self,
        client_id: str,
        group: str | None,
        stream: wire.Telemetry | None,
        streams: dict[str, wire.Telemetry] | None = None,
    ) -> None:
        """Tell the access point's server, and each group's master that has one of this
        identity's `streams` (target -> stream), that the identity is gone."""
        request = service_pb2.NotifyClientTerminationRequest()
        if group:
            request.group.name, request.group.resource_namespace = group, self._namespace
        for target in [None, *(streams or {})]:
            stub, where = self.stub_at(target)
            try:
                response = stub.NotifyClientTermination(
                    request, timeout=self._timeout, metadata=self.metadata(client_id)
                )
                wire.check_status(response.status, "NotifyClientTermination")
            except (grpc.RpcError, BrokerCallError) as exc:
                log.debug("termination notice for %s to %s failed: %s", client_id, where, exc)
        for each in [stream, *(streams or {}).values()]:
            if each is not None:
                each.close()

    # --- Telemetry to every group's master (what the official clients do)
    def telemetry_host(self, target: str | None) -> wire.TelemetryHost:
        """What a Telemetry stream to `target` (None: the access point) calls through."""
        if target is None or target == self._target:
            return self
        return _TargetHost(self.stub_at(target)[0], self.metadata)

    def group_targets(self) -> list[str]:
        """The targets of the broker groups' masters the routes named so far, other than
        the access point's: each client identity keeps a Telemetry stream to each."""
        with self._lock:
            return [t for t in dict.fromkeys(self._broker_targets.values()) if t != self._target]

    def _target_learned(self, target: str) -> None:
        """A route named a group master's target not seen before: the sides open their
        identities' Telemetry streams to it (called without the lock held)."""

    # --- calls
    def metadata(self, client_id: str) -> list[tuple[str, str]]:
        second = int(time.time())
        if second != self._md_second:  # the date header changes once a second, not per call
            self._md_date = datetime.fromtimestamp(second, UTC).strftime("%Y%m%dT%H%M%SZ")
            self._md_second = second
        now = self._md_date
        static = self._static_md.get(client_id)
        if static is None:
            static = [
                ("x-mq-language", "PYTHON"),
                ("x-mq-protocol", "GRPC_V2"),
                ("x-mq-client-version", wire.VERSION),
                ("x-mq-client-id", client_id),
                ("x-mq-namespace", self._namespace),
            ]
            if len(self._static_md) < 1024:
                self._static_md[client_id] = static
        # unique per call: this session's random prefix and a counter (a uuid4 per call
        # cost more than the rest of the metadata)
        md = [
            *static,
            ("x-mq-date-time", now),
            ("x-mq-request-id", f"{self._rid}{next(self._rids)}"),
        ]
        if self._access_key:
            md.append(("authorization", authorization(self._access_key, self._secret_key, now)))
        return md

    def _require(self) -> Any:
        if self.stub is None:
            raise ConfigurationError("the grpc transport is not started")
        return self.stub

    def _unary(
        self,
        method: str,
        request: Any,
        client_id: str | None = None,
        timeout_s: float | None = None,
        broker: str | None = None,
    ) -> Any:
        """One call, to the access point or, given a broker group's name, to that group."""
        stub, target = self.stub_for(broker) if broker else (self._require(), self.endpoint)
        try:
            response = getattr(stub, method)(
                request,
                timeout=timeout_s or self._timeout,
                metadata=self.metadata(client_id or self._base_id),
            )
        except grpc.RpcError as exc:
            raise wire.call_failure(method, target, exc) from None
        wire.check_status(response.status, method)
        return response

    def _resource(self, target: Any, name: str) -> None:
        target.name, target.resource_namespace = name, self._namespace

    def _when_answered(
        self,
        call: Any,
        method: str,
        read: Callable[[Any], Any],
        done: Callable[[Any], None],
        on_rpc_error: Callable[[], None] | None = None,
        target: str | None = None,
    ) -> None:
        """Hand a future call's outcome to `done` on gRPC's completion thread: `read` of the
        response, or the error of the whole request (a TransportError for the call itself;
        an answer that cannot be read fails the whole request too)."""
        where = target or self.endpoint

        def finished(f: Any) -> None:
            try:
                response = f.result()
            except grpc.RpcError as exc:
                if on_rpc_error is not None:
                    on_rpc_error()
                done(wire.call_failure(method, where, exc))
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

    def read_brokers(self, topic: str) -> list[str]:
        """The broker groups a topic is read from when they are several, each at its own
        endpoints (a cluster's groups); [] when the access point serves it all."""
        route = self.route(topic)
        brokers = list(dict.fromkeys(q.broker for q in route.read_queues))
        targets = {self._broker_targets.get(b, self._target) for b in brokers}
        return brokers if len(targets) > 1 else []

    def endpoints_of(self, broker: str | None) -> Any:
        """The protocol's Endpoints of a broker group (the access point's when unknown)."""
        target = self._broker_targets.get(broker) if broker else None
        if target is None:
            return self._access_point
        return wire.parse_endpoint(target.removeprefix("ipv4:").replace(",", ";"))

    def _forget_route(self, topic: str) -> None:
        self._routes.pop(topic, None)

    def _query_route(self, topic: str) -> TopicRoute:
        request = service_pb2.QueryRouteRequest()
        self._resource(request.topic, topic)
        request.endpoints.CopyFrom(self._access_point)
        response = self._route_call(request)
        writes: list[QueueRef] = []
        reads: list[QueueRef] = []
        learned: list[str] = []
        for mq in response.message_queues:
            # a group whose master is down is served by its slave, READ only (it serves
            # receives and acks for it): read from it, never send to it
            if mq.broker.id != 0 and mq.permission != wire.READ:
                continue
            if mq.broker.endpoints.addresses:
                target = wire.channel_target(mq.broker.endpoints)
                wire_port = protocol_ext.wire_port_of(mq.broker)
                with self._lock:
                    if wire_port:  # where its native wire is: dialled without asking
                        self._wire_ports[target] = wire_port
                    if target != self._target and target not in self._broker_targets.values():
                        learned.append(target)
                    self._broker_targets[mq.broker.name] = target
            ref = QueueRef(topic, mq.broker.name, int(mq.id))
            if mq.permission in (wire.WRITE, wire.READ_WRITE):
                writes.append(ref)
            if mq.permission in (wire.READ, wire.READ_WRITE):
                reads.append(ref)
        if reads or writes:
            self._brokers[topic] = (reads or writes)[0].broker
        for target in dict.fromkeys(learned):
            self._target_learned(target)
        return TopicRoute(topic, tuple(writes), tuple(reads))

    def _route_call(self, request: Any) -> Any:
        """QueryRoute at the access point, else at each group master a route named before.

        Every server of a cluster answers routes for every group, as the access point
        does: when the access point's server has just died (its channel not reconnected
        yet, or an access point naming that server alone), the next route, and with it
        every send's next attempt, comes from a live master at once. The access point's
        error is raised when no master answers either."""
        try:
            return self._unary("QueryRoute", request)
        except TransportError as first:
            with self._lock:  # one group name per target other than the access point's
                masters = {t: b for b, t in self._broker_targets.items() if t != self._target}
            for broker in masters.values():
                try:
                    response = self._unary("QueryRoute", request, broker=broker)
                except TransportError:
                    continue
                log.info("%s; the route came from group %s instead", first, broker)
                return response
            raise first

    def retry_topic(self, group: str) -> str:
        return retry_topic(group)

    def dlq_topic(self, group: str) -> str:
        return dlq_topic(group)


class _TargetHost:
    """A Telemetry stream's view of one group master's channel."""

    def __init__(self, stub: Any, metadata: Callable[[str], list[tuple[str, str]]]) -> None:
        self.stub = stub
        self.metadata = metadata
