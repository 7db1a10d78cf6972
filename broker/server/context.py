"""What every handler shares: the broker, the configuration, the sessions, the thread pools.

The server runs on one asyncio event loop; the broker's API blocks, so each broker call
runs where it costs least (`run`: on the loop under async flush, in a thread pool under sync
flush); sends (`broker.server.producing`) and invisible-time calls (`run_durably`) run on
the loop in both modes and await the fsync on a future. Long polls park on the loop
(`broker.server.polling`), not in threads.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ParamSpec, Protocol, TypeVar

from broker.broker import Broker
from broker.errors import BrokerError
from broker.server import auth
from broker.server.answers import HeldAnswers
from broker.server.calls import CallContext
from broker.server.cluster import ClusterView
from broker.server.config import ServerConfig
from broker.server.direct import DirectDeliveries
from broker.server.errors import ClientIdRequired
from broker.server.loop_dispatch import LoopWake
from broker.server.overload import Overload
from broker.server.send_groups import MAX_GROUP_BYTES, SendGroups
from broker.server.sessions import ClientSession, SessionRegistry
from broker.store.config import FlushMode
from protocol.clock import wall_ms
from protocol.stats import Histogram

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CallInfo:
    """Who is calling: from the request metadata."""

    client_id: str
    namespace: str
    request_id: str
    metadata: dict[str, str]
    access_key: str = ""  # the verified credential ("" when authentication is off)
    native_wire: bool = False  # over the native wire (broker.server.wire), not gRPC
    # the only thing its loop turn woke for (`broker.server.loop_dispatch.LoopWake`)
    alone: bool = False
    # seconds left until the caller's deadline when the call was read (None: no deadline)
    time_remaining: float | None = None


def _settle(future: asyncio.Future[bool], ok: bool) -> None:
    if not future.done():
        future.set_result(ok)


def _time_remaining(context: CallContext) -> float | None:
    """The seconds a call has left before its deadline (None: no deadline, or a context
    that does not say)."""
    remaining = getattr(context, "time_remaining", None)
    if remaining is None:
        return None
    value = remaining()
    return None if value is None else float(value)


class SyncReplication(Protocol):
    """A SYNC_MASTER's gate (`broker.ha.HaMaster`): a send is answered once a slave has
    its bytes; `callback(None)` then, else with the error to answer (on any thread)."""

    def when_replicated(self, end: int, callback: Callable[[BrokerError | None], None]) -> None: ...


class ServerContext:
    def __init__(
        self, broker: Broker, config: ServerConfig, *, clock: Callable[[], int] | None = None
    ) -> None:
        self.broker = broker
        self.config = config
        self.clock = clock or wall_ms
        self.sessions = SessionRegistry()
        # messages sent to one client, waiting for its verdict (ReconsumeMessage client_id)
        self.direct = DirectDeliveries(self.sessions)
        self.started_ms = self.clock()
        # messages stored before this start may be resent by clients that lost our answer
        self.had_messages = broker.store.get_commitlog_max_offset() > 0
        self.bound_port = config.port
        self.wire_port = 0  # the native wire's bound port (0: not offered)
        self.pool = ThreadPoolExecutor(config.worker_threads, thread_name_prefix="grpc-call")
        # Under ASYNC_FLUSH a broker call never waits for the disk: it takes microseconds, far
        # less than handing it to a thread and back (which costs milliseconds of GIL handoffs
        # on a busy machine), so it runs on the loop. Under SYNC_FLUSH puts and acks wait for
        # the group commit's fsync: they go to the pool so the loop keeps serving.
        self.inline = broker.store.config.flush_mode is FlushMode.ASYNC_FLUSH
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closing = False  # set at shutdown: parked polls answer, streams end
        # broker groups: who serves each group (`broker.server.cluster`); None: no cluster
        self.cluster: ClusterView | None = None
        # gRPC answers held while the loop is busy (`broker.server.answers`); released by
        # the loop's selector, which installs it
        self.answers = HeldAnswers(config.answer_batch, config.answer_linger_ms)
        # sends of the loop's busy turns stored together (`broker.server.send_groups`); the
        # producer handlers set its store call, the loop's selector installs it
        self.send_groups = SendGroups(
            config.answer_batch,
            config.answer_linger_ms,
            max_bytes=min(MAX_GROUP_BYTES, broker.store.config.max_message_size // 2),
        )
        # what woke the loop for its turn (set by the loop's selector)
        self.wake = LoopWake()
        # sends refused for overload, calls abandoned by their clients (`broker.server.overload`)
        self.overload = Overload()
        # seconds from a SendMessage request to its answer, one observation per request
        self.send_seconds = Histogram()
        # SYNC_MASTER: sends are answered once a slave has them (None: no such wait)
        self.replication: SyncReplication | None = None
        # the admin service's HaStatus (broker.ha's `status`); None: no replication role
        self.ha_status: Callable[[], dict[str, object]] | None = None
        # the admin service's PromoteBroker (broker.ha's `HaNode.promote`); None: no slave
        self.ha_promote: Callable[..., dict[str, object]] | None = None
        # a slave's replication link to its master is up (broker.ha's `HaSlave.connected`);
        # None: no such link
        self.master_link: Callable[[], bool] | None = None
        # a master may serve receives (`HaNode.reads_ready`: its slaves reported what they
        # acknowledged while acting for it); None: always
        self.reads_ready: Callable[[], bool] | None = None

    def busy_turns(self) -> tuple[int, int, int]:
        """(answers held, sends stored in a group, groups stored) since the start: what the
        loop's busy turns batched (the metrics' `answers_held`, `grouped_sends`,
        `send_groups`)."""
        groups = self.send_groups
        return self.answers.held_total, groups.sends_joined, groups.groups_stored

    def overload_counts(self) -> tuple[int, int]:
        """(sends refused for overload, calls abandoned by their clients) since the start
        (the metrics' `refused_sends`, `abandoned_calls`; `broker.server.overload`)."""
        return self.overload.refused_sends, self.overload.abandoned_calls

    # --- broker calls
    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Call the broker: on the loop when its calls cannot block, else in the pool."""
        return await self.submit(functools.partial(fn, *args, **kwargs))

    def submit(self, call: Callable[[], T]) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        if not self.inline:
            return loop.run_in_executor(self.pool, call)
        future: asyncio.Future[T] = loop.create_future()
        try:
            future.set_result(call())
        except Exception as exc:
            future.set_exception(exc)
        return future

    async def run_durably(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """An invisible-time call (receive, ack, change of invisible duration) on the loop
        in both flush modes: under SYNC_FLUSH its state change is made at once and the
        wait for the fsync of its record is a future the group-commit thread resolves,
        not a parked thread; concurrent calls share fsyncs."""
        broker = self.broker
        if self.inline:
            return fn(*args, **kwargs)
        result, end = broker.deferring_durability(functools.partial(fn, *args, **kwargs))
        if end >= 0:
            loop = asyncio.get_running_loop()
            future: asyncio.Future[bool] = loop.create_future()

            def flushed(ok: bool) -> None:  # on the group-commit thread
                loop.call_soon_threadsafe(_settle, future, ok)

            if broker.when_durable(end, flushed):
                await asyncio.shield(future)
        return result

    async def run_in_pool(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """For calls that may take long whatever the flush mode (admin, scans)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    # --- callers
    def call_info(self, context: CallContext, *, require_client_id: bool = True) -> CallInfo:
        metadata = {
            k.lower(): v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)
        }
        client_id = metadata.get("x-mq-client-id", "").strip()
        if require_client_id and not client_id:
            raise ClientIdRequired("x-mq-client-id header is required")
        access_key = ""
        if self.config.auth:
            access_key = auth.verify(
                metadata,
                self.config.credentials,
                self.clock() / 1000,
                self.config.max_signature_skew_s,
            )
            self.sessions.check_owner(client_id, access_key)
        return CallInfo(
            client_id=client_id,
            namespace=metadata.get("x-mq-namespace", ""),
            request_id=metadata.get("x-mq-request-id", ""),
            metadata=metadata,
            access_key=access_key,
            native_wire=getattr(context, "native_wire", False),
            alone=getattr(context, "alone", False),
            time_remaining=_time_remaining(context),
        )

    def session(self, call: CallInfo) -> ClientSession:
        return self.sessions.touch(call.client_id, self.clock(), call.access_key)
