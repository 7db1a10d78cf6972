"""Routes, assignments, client liveness and the Telemetry stream (Settings, orphan checks).

- QueryRoute answers with our own endpoint (the one the client dialled), one queue per
  topic queue, and the message types the topic accepts. With a cluster file
  (`broker.server.cluster`) it names every broker group's queues (the same queue numbers as
  this broker's topic), each at the endpoint of the server that serves the group:
  READ_WRITE at its master, READ only at a slave while no master of the group is up (the
  slave then serves receives for it, `broker.acting`; its queues carry broker id 0, the
  only one the official clients read from, and the slave's endpoint).
- QueryAssignment gives a push consumer one assignment per broker (queue id -1): the broker
  pops from every queue, as the Apache proxy does; with a cluster file, one per group that
  is up, at its master or, while no master of the group is up, at its slave.
- Telemetry echoes the client's Settings merged with server policy: `publishing` always
  present (else the producer's max body size becomes 0), consumers' retry ladder sent as
  `customized_backoff` (the only form the Python push consumer honours), `metric` off.
- Orphaned half messages are pushed to a producer that publishes their topic.
- A `verify_message_result` answers a direct delivery (`broker.server.direct`).
- Each stream's replies wait in a queue of `max_telemetry_queue` commands; a client that
  lets it fill (it sends Settings but never reads) has its stream ended with
  `RESOURCE_EXHAUSTED`, so an unread stream costs a bounded amount of memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from broker.errors import TopicNotFound
from broker.server import convert
from broker.server.calls import StreamContext
from broker.server.cluster import Server
from broker.server.context import CallInfo, ServerContext
from broker.server.decoding import Undecodable
from broker.server.errors import BadRequest, ConsumerGroupNotFound, Forbidden
from broker.server.ratelimit import LogLimiter
from broker.server.sessions import ClientKind, ClientSession, TelemetryStream
from broker.server.status import ok, status_of
from broker.server.transactions import orphan_command
from broker.server.validation import accepted_types, check_group, check_topic, parse_filter
from broker.store.message import MessageExt
from broker.subscription import SubscriptionGroupConfig
from broker.topic import PERM_READ, PERM_WRITE, TopicConfig
from protocol import ext as protocol_ext
from protocol.pb import definition_pb2, service_pb2

log = logging.getLogger(__name__)
_limited = LogLimiter(log)

_pb = definition_pb2
PERMISSION = {
    (False, False): _pb.NONE,
    (True, False): _pb.READ,
    (False, True): _pb.WRITE,
    (True, True): _pb.READ_WRITE,
}
CUT_OFF_STATUS_WAIT_S = 2.0
MESSAGE_TYPE = {t: _pb.MessageType.Value(t) for t in ("NORMAL", "FIFO", "DELAY", "TRANSACTION")}
_VERIFY_ANSWERS = frozenset({"verify_message_result", "verify_message_command"})


class ClientHandlers:
    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self._checked_topics: set[str] = set()

    # --- topics and groups
    def topic_config(self, topic: str) -> TopicConfig:
        """The topic's config, auto-created when allowed (in memory; creation writes a file)."""
        broker = self.ctx.broker
        broker.route(topic)
        cfg = broker.get_topic(topic)
        if cfg is None:
            raise TopicNotFound(topic)
        return cfg

    def group_config(self, group: str) -> SubscriptionGroupConfig:
        broker = self.ctx.broker
        cfg = broker.get_group(group)
        if cfg is None:
            if not self.ctx.config.auto_create_group:
                raise ConsumerGroupNotFound(f"consumer group {group!r} does not exist")
            cfg = broker.create_group(group)
        return cfg

    def endpoints(self, requested: definition_pb2.Endpoints | None) -> definition_pb2.Endpoints:
        out = definition_pb2.Endpoints()
        if requested is not None and len(requested.addresses) > 0:
            for address in requested.addresses:
                if not 0 < address.port <= 65535 or not address.host:
                    raise BadRequest(
                        f"endpoint {address.host[:64]!r}:{address.port} is not "
                        "a host and a port in 1..65535"
                    )
            out.CopyFrom(requested)
            return out
        host = self.ctx.config.advertised_host or self.ctx.config.host
        try:
            ip = ipaddress.ip_address(host)
            out.scheme = _pb.IPv4 if ip.version == 4 else _pb.IPv6
        except ValueError:
            out.scheme = _pb.DOMAIN_NAME
        address = out.addresses.add()
        address.host = host
        address.port = self.ctx.bound_port
        return out

    def message_queue(
        self,
        topic: str,
        namespace: str,
        queue_id: int,
        perm: definition_pb2.Permission.ValueType,
        endpoints: definition_pb2.Endpoints,
        topic_type: str,
        broker: tuple[str, int] | None = None,
    ) -> definition_pb2.MessageQueue:
        mq = definition_pb2.MessageQueue()
        mq.topic.name = topic
        mq.topic.resource_namespace = namespace
        mq.id = queue_id
        mq.permission = perm
        mq.broker.name, mq.broker.id = broker or (self.ctx.config.broker_name, 0)
        mq.broker.endpoints.CopyFrom(endpoints)
        if self.ctx.wire_port and (
            broker is None or broker == (self.ctx.config.broker_name, self.ctx.config.broker_id)
        ):  # where this server's native wire is (`protocol.ext`)
            mq.broker.MergeFromString(protocol_ext.wire_port_field(self.ctx.wire_port))
        mq.accept_message_types.extend(MESSAGE_TYPE[t] for t in accepted_types(topic_type))
        return mq

    def servers(
        self, requested: definition_pb2.Endpoints | None
    ) -> list[tuple[Server, definition_pb2.Endpoints]]:
        """Who serves each broker group, with its endpoints: this broker alone (at the
        endpoint the client dialled), or with a cluster file the server of every group
        that is up (`broker.server.cluster`)."""
        cluster = self.ctx.cluster
        if cluster is None:
            me = Server(self.ctx.config.broker_name, 0, "", 0, True)
            return [(me, self.endpoints(requested))]
        out = []
        for group in cluster.config.groups:
            server = cluster.serving(group)
            if server is not None:
                out.append((server, _endpoints_of(server.host, server.port)))
        return out

    # --- RPCs
    async def query_route(
        self, request: service_pb2.QueryRouteRequest, call: CallInfo
    ) -> service_pb2.QueryRouteResponse:
        topic = check_topic(request.topic.name)
        cfg = self.topic_config(topic)
        servers = self.servers(request.endpoints)
        response = service_pb2.QueryRouteResponse()
        # queue by queue, group by group: the official client takes the next queue of the
        # route on a failed send, which is then another group's
        for queue_id in range(max(cfg.read_queue_nums, cfg.write_queue_nums)):
            readable = queue_id < cfg.read_queue_nums and bool(cfg.perm & PERM_READ)
            writeable = queue_id < cfg.write_queue_nums and bool(cfg.perm & PERM_WRITE)
            for server, endpoints in servers:
                perm = (readable, writeable and server.writable)
                if perm == (False, False):
                    continue
                response.message_queues.append(
                    self.message_queue(
                        topic,
                        request.topic.resource_namespace,
                        queue_id,
                        PERMISSION[perm],
                        endpoints,
                        cfg.message_type.value,
                        (server.group, 0),
                    )
                )
        response.status.CopyFrom(ok())
        return response

    async def query_assignment(
        self, request: service_pb2.QueryAssignmentRequest, call: CallInfo
    ) -> service_pb2.QueryAssignmentResponse:
        topic = check_topic(request.topic.name)
        group = check_group(request.group.name)
        cfg = self.topic_config(topic)
        self.group_config(group)
        if not cfg.perm & PERM_READ:
            raise Forbidden(f"topic {topic!r} is not readable")
        response = service_pb2.QueryAssignmentResponse()
        # one assignment per group that is up: at its master, or at the slave that serves
        # its receives while no master of the group is (READ only)
        for server, endpoints in self.servers(request.endpoints):
            assignment = response.assignments.add()
            assignment.message_queue.CopyFrom(
                self.message_queue(
                    topic,
                    request.topic.resource_namespace,
                    -1,
                    PERMISSION[(True, server.writable)],
                    endpoints,
                    cfg.message_type.value,
                    (server.group, 0),
                )
            )
        response.status.CopyFrom(ok())
        return response

    async def heartbeat(
        self, request: service_pb2.HeartbeatRequest, call: CallInfo
    ) -> service_pb2.HeartbeatResponse:
        kind = ClientKind.of(request.client_type)
        session = self.ctx.session(call)
        if session.kind is ClientKind.UNSPECIFIED:
            session.kind = kind
        if request.HasField("group") and request.group.name:
            group = check_group(request.group.name)
            session.group = group
            if session.kind.consumer:
                self.ctx.broker.heartbeat(call.client_id, group, dict(session.subscriptions))
        response = service_pb2.HeartbeatResponse()
        response.status.CopyFrom(ok())
        return response

    async def notify_termination(
        self,
        request: service_pb2.NotifyClientTerminationRequest,
        call: CallInfo,
        release: Callable[[ClientSession], Awaitable[None]],
    ) -> service_pb2.NotifyClientTerminationResponse:
        session = self.ctx.sessions.remove(call.client_id)
        if session is not None:
            await release(session)
            group = session.group or (request.group.name if request.HasField("group") else "")
            if group:
                await self.ctx.run(self.ctx.broker.unregister, call.client_id, group)
        response = service_pb2.NotifyClientTerminationResponse()
        response.status.CopyFrom(ok())
        return response

    # --- Telemetry
    async def telemetry(
        self,
        requests: AsyncIterator[service_pb2.TelemetryCommand | Undecodable],
        context: StreamContext,
    ) -> AsyncIterator[service_pb2.TelemetryCommand]:
        try:
            call = self.ctx.call_info(context)
            session = self.ctx.session(call)
        except Exception as exc:
            reply = service_pb2.TelemetryCommand()
            reply.status.CopyFrom(status_of(exc))
            yield reply
            return
        stream = TelemetryStream(self.ctx.config.max_telemetry_queue, asyncio.current_task())
        session.stream_opened(stream)
        outbox = stream.queue
        reader = asyncio.ensure_future(
            self._read_commands(requests, session, call, stream, context)
        )
        getter: asyncio.Future[service_pb2.TelemetryCommand | None] | None = None
        try:
            while True:
                getter = asyncio.ensure_future(outbox.get())
                done, _ = await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    command = getter.result()
                    if command is None:  # the server is stopping: end the stream cleanly
                        break
                    yield command
                    continue
                getter.cancel()
                while not outbox.empty() and not stream.cut:
                    command = outbox.get_nowait()
                    if command is None:
                        break
                    yield command
                break
        finally:
            self._stream_closed(session, stream)
            # a client that goes away cancels this call while it waits: end both helper
            # tasks here, or the loop destroys them pending ("Task was destroyed but it is
            # pending!" at every disconnect)
            pending = [t for t in (reader, getter) if t is not None and not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                with contextlib.suppress(Exception):
                    await asyncio.wait(pending, timeout=1.0)

    def _stream_closed(self, session: ClientSession, stream: TelemetryStream) -> None:
        if stream.closed:
            return
        stream.closed = True
        self.ctx.direct.stream_closed(stream)
        session.stream_closed(stream)
        session.last_seen_ms = session.disconnected_ms = self.ctx.clock()

    async def _cut_off(
        self, session: ClientSession, stream: TelemetryStream, context: StreamContext
    ) -> None:
        """End a stream whose client does not read it: final status, then cancel the call."""
        stream.cut = True
        self._stream_closed(session, stream)
        try:  # the status waits behind the unread replies: a client that reads again sees it
            await asyncio.wait_for(
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"more than {stream.queue.maxsize} telemetry replies were left unread",
                ),
                CUT_OFF_STATUS_WAIT_S,
            )
        except (grpc.aio.AbortError, TimeoutError):
            pass  # AbortError is how abort() ends
        except Exception as exc:  # the call ended meanwhile
            log.debug("telemetry stream of %s: final status not sent: %s", session.client_id, exc)
        stream.cut_off()

    async def _read_commands(
        self,
        requests: AsyncIterator[service_pb2.TelemetryCommand | Undecodable],
        session: ClientSession,
        call: CallInfo,
        stream: TelemetryStream,
        context: StreamContext,
    ) -> None:
        try:
            async for command in requests:
                session.last_seen_ms = self.ctx.clock()
                reply = service_pb2.TelemetryCommand()
                if isinstance(command, Undecodable):
                    reply.status.CopyFrom(status_of(command.refuse(context)))
                elif command.WhichOneof("command") in _VERIFY_ANSWERS:
                    # a direct delivery's verdict (some clients echo the command instead)
                    answered = getattr(command, str(command.WhichOneof("command")))
                    self.ctx.direct.answer(call.client_id, answered.nonce, command.status)
                    continue
                elif command.WhichOneof("command") != "settings":
                    continue  # thread stack traces: nothing to do
                else:
                    try:
                        reply.settings.CopyFrom(
                            await self._apply_settings(session, command.settings, call)
                        )
                        reply.status.CopyFrom(ok())
                    except Exception as exc:
                        reply.status.CopyFrom(status_of(exc))
                if not stream.push(reply):  # its replies are not read: stop serving it
                    _limited.log(
                        logging.WARNING,
                        "telemetry unread",
                        "telemetry stream of %s ended: %d replies are waiting unread",
                        call.client_id[:64],
                        stream.queue.qsize(),
                    )
                    await self._cut_off(session, stream, context)
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the client vanished or sent garbage: end the stream
            log.debug("telemetry stream of %s ended: %s", call.client_id, exc)

    async def _apply_settings(
        self, session: ClientSession, settings: definition_pb2.Settings, call: CallInfo
    ) -> definition_pb2.Settings:
        kind = ClientKind.of(settings.client_type)
        if settings.HasField("request_timeout"):  # echoed back: never a malformed duration
            convert.duration_ms(settings.request_timeout, "request timeout")
        pub_sub = settings.WhichOneof("pub_sub")
        if pub_sub is None:
            raise BadRequest("settings carry neither publishing nor subscription")
        if (pub_sub == "publishing") != (kind is ClientKind.PRODUCER):
            raise BadRequest(f"client type {kind.name} does not match {pub_sub} settings")
        reply = definition_pb2.Settings()
        reply.CopyFrom(settings)
        reply.metric.Clear()
        reply.metric.on = False
        if pub_sub == "publishing":
            topics = frozenset(check_topic(t.name) for t in settings.publishing.topics)
            session.kind, session.publishing, session.settings = kind, topics, settings
            for topic in topics - self._checked_topics:
                self.watch_transactions(topic)
            reply.publishing.max_body_size = self.ctx.config.max_body_size
            reply.publishing.validate_message_type = True
            policy = reply.backoff_policy
            policy.Clear()
            policy.max_attempts = self.ctx.config.producer_max_attempts
            convert.set_duration_ms(policy.exponential_backoff.initial, 10)
            convert.set_duration_ms(policy.exponential_backoff.max, 1000)
            policy.exponential_backoff.multiplier = 2.0
            return reply
        sub = settings.subscription
        group = check_group(sub.group.name)
        subscriptions: dict[str, frozenset[str] | None] = {}
        for entry in sub.subscriptions:
            subscriptions[check_topic(entry.topic.name)] = parse_filter(
                entry.expression.type, entry.expression.expression
            )
        cfg = self.group_config(group)
        session.kind, session.group, session.settings = kind, group, settings
        session.subscriptions = subscriptions
        self.ctx.broker.heartbeat(call.client_id, group, dict(subscriptions))
        reply.subscription.fifo = cfg.fifo
        reply.subscription.receive_batch_size = self.ctx.config.max_receive_batch
        config = self.ctx.config
        polling = config.max_long_polling_ms
        if kind is ClientKind.SIMPLE_CONSUMER and sub.HasField("long_polling_timeout"):
            polling = max(
                config.min_long_polling_ms,
                min(
                    convert.duration_ms(sub.long_polling_timeout, "long polling timeout"),
                    config.max_long_polling_ms,
                ),
            )
        convert.set_duration_ms(reply.subscription.long_polling_timeout, polling)
        policy = reply.backoff_policy
        policy.Clear()
        policy.max_attempts = cfg.max_delivery_attempts
        for delay_ms in self.ctx.broker.config.delay_levels_ms:
            convert.set_duration_ms(policy.customized_backoff.next.add(), delay_ms)
        return reply

    # --- orphaned transactions
    def watch_transactions(self, topic: str) -> None:
        """Ask the topic's publishers about its orphaned transactions from now on.

        Only a topic that exists can hold half messages, so only such a topic gets a
        checker: Settings naming topics that do not exist register nothing (a client
        declaring ever new names would otherwise grow this set and the broker's checker
        registry without bound), and a transactional send registers its topic once the
        topic exists (auto-created by that send). Both stay bounded by the topics."""
        if topic in self._checked_topics or self.ctx.broker.get_topic(topic) is None:
            return
        self.ctx.broker.register_transaction_checker(topic, self._checker(topic))
        self._checked_topics.add(topic)

    def _checker(self, topic: str) -> Callable[[MessageExt], None]:
        loop = asyncio.get_running_loop()

        def check(ext: MessageExt) -> None:  # called on a broker thread
            loop.call_soon_threadsafe(self._push_check, topic, ext)

        return check

    def _push_check(self, topic: str, ext: MessageExt) -> None:
        for session in self.ctx.sessions.publishers_of(topic):
            if session.push(orphan_command(ext)):
                return
        log.debug("no producer of %s is connected to resolve a half message", topic)


def _endpoints_of(host: str, port: int) -> definition_pb2.Endpoints:
    out = definition_pb2.Endpoints()
    try:
        out.scheme = _pb.IPv4 if ipaddress.ip_address(host).version == 4 else _pb.IPv6
    except ValueError:
        out.scheme = _pb.DOMAIN_NAME
    address = out.addresses.add()
    address.host, address.port = host, port
    return out
