"""The gRPC server's lifecycle: bind, serve on an asyncio loop in its own thread, stop.

    server = MessagingServer(broker, ServerConfig(port=8081))
    server.start()          # returns once the port is bound (ServerStartError if it is not)
    ...
    server.stop()           # graceful: in-flight calls get `grace_s` to finish

Four services share the port: `apache.rocketmq.v2.MessagingService`, its batch-receive
extension `reliable.v1.BatchMessaging` (`protocol.ext`), the standard gRPC health
service (`broker.server.health`) and the JSON admin service `reliable.admin.v1.Admin` (see
`broker.server.admin`). The broker is the caller's:
the server neither starts nor shuts it down.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
from collections.abc import Callable

import grpc

from broker.broker import Broker
from broker.idle_poll import check_max_us
from broker.server.admin import admin_handler
from broker.server.cluster import ClusterView
from broker.server.config import ServerConfig
from broker.server.context import ServerContext
from broker.server.errors import ServerStartError
from broker.server.health import BrokerHealth, store_writable
from broker.server.loop_dispatch import LoopDispatch, LoopSelector
from broker.server.overload import CoreLogFilter
from broker.server.polling import ArrivalHook
from broker.server.servicer import MessagingServicer, add_to_server
from broker.server.wire import WireServer

log = logging.getLogger(__name__)

UPKEEP_INTERVAL_S = 1.0
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # one request; bigger ones fail in gRPC, not here


class MessagingServer:
    def __init__(
        self,
        broker: Broker,
        config: ServerConfig | None = None,
        *,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.config = config or ServerConfig()
        self.ctx = ServerContext(broker, self.config, clock=clock)
        self.servicer = MessagingServicer(self.ctx)
        self.health = BrokerHealth(broker)
        self.health.is_master = lambda: not self.servicer.read_only
        if self.config.cluster is not None:
            self.ctx.cluster = ClusterView(
                self.config.cluster,
                (self.config.broker_name, self.config.broker_id),
                lambda: not self.servicer.read_only and store_writable(broker),
                probe_interval_ms=self.config.cluster_probe_ms,
                probe_timeout_ms=self.config.cluster_probe_ms,
            )
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._stopped = threading.Event()
        self._error: BaseException | None = None
        self._grace_s = 2.0
        self.wire: WireServer | None = None

    @property
    def port(self) -> int:
        return self.ctx.bound_port

    @property
    def wire_port(self) -> int:
        """The native wire's port (docs/wire.md); 0 when it is off."""
        return self.ctx.wire_port

    @property
    def address(self) -> str:
        return f"{self.config.advertised_host or self.config.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> None:
        if self._thread is not None:
            raise ServerStartError("server already started")
        try:
            check_max_us(self.config.idle_poll_us)
        except ValueError as exc:
            raise ServerStartError(str(exc)) from None
        self._thread = threading.Thread(target=self._run, name="grpc-server", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout_s):
            raise ServerStartError(f"server did not start within {timeout_s} s")
        if self._error is not None:
            raise ServerStartError(str(self._error)) from self._error

    def stop(self, grace_s: float = 2.0) -> None:
        """Stop accepting calls, give in-flight ones `grace_s`, then end the loop."""
        if self._thread is None:
            return
        self._grace_s = grace_s
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        self._thread.join(grace_s + 10)
        self.ctx.shutdown()
        self._thread = None

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the server has stopped."""
        return self._stopped.wait(timeout_s)

    # --- the loop thread
    def _run(self) -> None:
        # the loop dispatches the records it appends just before it waits, and polls
        # before it sleeps (`broker.server.loop_dispatch`, `broker.idle_poll`); while it is
        # busy it stores sends in groups and holds answers (`broker.server.send_groups`,
        # `broker.server.answers`)
        dispatch = LoopDispatch(self.ctx.broker.store)
        answers, groups = self.ctx.answers, self.ctx.send_groups
        loop = asyncio.SelectorEventLoop(
            LoopSelector(self.config.idle_poll_us, dispatch, answers, groups, self.ctx.wake)
        )
        self._loop = loop
        dispatch.install()
        answers.install()
        groups.install()
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to start(), or logged after it
            if not self._started.is_set():
                self._error = exc
            else:
                log.exception("gRPC server loop failed")
        finally:
            groups.uninstall()
            answers.uninstall()
            self._cancel_leftovers(loop)
            dispatch.uninstall()
            self._started.set()
            self._stopped.set()
            loop.close()

    @staticmethod
    def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
        """Cancel calls still running after the grace period, and wait for them to unwind."""
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))

    def _credentials(self) -> grpc.ServerCredentials:
        cert, key = self.config.tls_cert, self.config.tls_key
        assert cert is not None and key is not None
        return grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])

    def _wire_tls(self) -> ssl.SSLContext | None:
        """The native wire's TLS, with the gRPC port's certificate and key (None: plaintext)."""
        if not self.config.tls:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(self.config.tls_cert), str(self.config.tls_key))
        return context

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        self.ctx.loop = asyncio.get_running_loop()
        waiters = self.servicer.consuming.waiters
        self.ctx.broker.store.add_dispatcher(
            ArrivalHook(self.ctx.loop, waiters.wake, wanted=waiters.parked)
        )
        config = self.config
        server = grpc.aio.server(
            # what gRPC takes in at once: each call beyond the calls running is refused
            # with RESOURCE_EXHAUSTED before a handler runs; a connection's streams beyond
            # its limit wait on the client's side; calls received but not read yet are
            # queued by gRPC's core up to its pending limit (left at its default, 1,000,
            # the core cancels calls at random past it: a silent CANCELLED)
            maximum_concurrent_rpcs=config.max_concurrent_rpcs or None,
            options=[
                ("grpc.max_concurrent_streams", config.max_concurrent_streams),
                ("grpc.server.max_pending_requests", config.max_pending_calls),
                ("grpc.server.max_pending_requests_hard_limit", 2 * config.max_pending_calls),
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", -1),
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.http2.max_pings_without_data", 0),
                ("grpc.keepalive_permit_without_calls", 1),
            ],
        )
        # gRPC's traceback per answer to a call its client left: a count, a line a minute
        core_log = CoreLogFilter(self.ctx.overload)
        core_log.install()
        add_to_server(self.servicer, server)
        server.add_generic_rpc_handlers((admin_handler(self.ctx),))
        self.health.add_to(server)
        await self.health.update()
        target = f"{self.config.host}:{self.config.port}"
        if self.config.tls:
            port = server.add_secure_port(target, self._credentials())
        else:
            port = server.add_insecure_port(target)
        if port == 0:
            raise ServerStartError(f"cannot bind {target}")
        self.ctx.bound_port = port
        if self.config.wire_port is not None:
            self.wire = WireServer(self.ctx, self.servicer, max_frame=MAX_MESSAGE_BYTES)
            try:
                self.ctx.wire_port = await self.wire.start(
                    self.config.host, self.config.wire_port, tls=self._wire_tls()
                )
            except OSError as exc:
                raise ServerStartError(
                    f"cannot bind the wire port {self.config.host}:{self.config.wire_port}: {exc}"
                ) from exc
        await server.start()
        log.info(
            "serving RocketMQ 5 gRPC on %s:%d (%s)",
            self.config.host,
            port,
            "TLS" if self.config.tls else "plaintext",
        )
        if self.wire is not None:
            log.info("serving the native wire on %s:%d", self.config.host, self.ctx.wire_port)
        self._started.set()
        upkeep = asyncio.ensure_future(self._upkeep())
        probes = (
            asyncio.ensure_future(self.ctx.cluster.probe_loop())
            if self.ctx.cluster is not None
            else None
        )
        try:
            await self._stop.wait()
        finally:
            core_log.uninstall()
            upkeep.cancel()
            if probes is not None:
                probes.cancel()
            await self.health.shutdown()
            # answer parked receives and end telemetry streams before the grace runs out
            self.ctx.closing = True
            self.servicer.consuming.waiters.wake_all()
            for session in self.ctx.sessions:
                session.end_streams()
            if self.wire is not None:
                await asyncio.gather(self.wire.stop(self._grace_s), server.stop(self._grace_s))
            else:
                await server.stop(self._grace_s)

    async def _upkeep(self) -> None:
        while True:
            await asyncio.sleep(UPKEEP_INTERVAL_S)
            try:
                await self.health.update()
                await self.servicer.consuming.upkeep()
            except Exception:
                log.exception("server upkeep pass failed")
