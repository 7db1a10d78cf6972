"""The grpc transport's native wire (docs/wire.md): its unary calls over one framed TCP
connection to the server's wire port, instead of gRPC.

`NativeStub` stands where the grpc stub stood: `stub.SendMessage(request, timeout=,
metadata=)` blocks, `stub.SendMessage.future(...)` returns a future whose `result()`
raises a `grpc.RpcError` (with `code()` and `details()`) like grpc's, so the session's
callers and their error handling are unchanged. Streaming calls (ReceiveMessage,
Telemetry) and anything else go to the grpc stub underneath.

The wire port is asked of the server once (`reliable.v1.BatchMessaging/WireEndpoint` over
gRPC) unless the caller names it; a server that offers none (or an Apache RocketMQ proxy,
which answers UNIMPLEMENTED) is reached over gRPC from then on.

With TLS (a transport with `tls=True`, docs/wire.md "TLS") the connection is TLS, the
server's certificate verified as the gRPC channel verifies it, through memory BIOs
(`reliable.transport._wire_tls`): the socket stays plain, so polling it stays exact.

One connection per endpoint: a lock serialises writes (TCP_NODELAY, one `sendall` a
frame); one thread at a time reads (a blocking `call` for its own answer when nobody else
reads, else the connection's reader thread) and resolves every answer it reads by request
id (in any order); a sweeper thread fails calls past their deadline (DEADLINE_EXCEEDED)
and tells the server (CANCEL). A connection that fails fails every call in flight on it
with UNAVAILABLE (the session turns it into a TransportError, which the producer's retry
policy retries); the next call connects again.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import logging
import queue
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, TypeAlias, cast

import grpc
from google.protobuf.message import Message

from broker.idle_poll import DEFAULT_MAX_US as DEFAULT_IDLE_POLL_US
from broker.idle_poll import IdlePoll, check_max_us
from protocol import wire as pw
from reliable.transport._pb import definition_pb2
from reliable.transport._wire_tls import TlsStream

if TYPE_CHECKING:
    from protocol._stubs.service_pb2_grpc import MessagingServiceStub

log = logging.getLogger("reliable.transport.grpc")

Metadata = tuple[tuple[str, str | bytes], ...]  # grpc's
Answer = Future[Message]
# a unary method over grpc (grpc's classes are generic to the type checker alone)
GrpcMethod: TypeAlias = "grpc.UnaryUnaryMultiCallable[Message, Message]"
# (metadata, timeout) -> the port the server advertises (0: none; None: it would not say)
AskPort = Callable[[Metadata | None, float | None], int | None]

STATUS = 0x2  # with ERROR: the body is a protocol Status (the server refused the hello)
SWEEP_S = 0.05  # deadlines are enforced to this precision
HELLO_EVERY_S = 600.0  # a fresh signature well inside the server's freshness window
# a connection idle this long is checked for the server's close before a call uses it
IDLE_CHECK_S = 0.1
_DROP = ("x-mq-client-id", "x-mq-request-id")
# answers to the port question that leave it open (asked again by the next call)
_NOT_YET = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
)


class WireRpcError(grpc.RpcError):
    """A failed call over the native wire, shaped as grpc's errors are."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def _code(name: str) -> grpc.StatusCode:
    try:
        return grpc.StatusCode[name]
    except KeyError:
        return grpc.StatusCode.UNKNOWN


class _Callbacks:
    """The thread that runs the done callbacks of a channel's futures, in the order the
    answers came: never the reader thread, so a callback may make a blocking call on the
    same channel (its answer is read meanwhile), as with grpc's callback thread."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[Answer], object], Answer] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def post(self, fn: Callable[[Answer], object], future: Answer) -> None:
        self._queue.put((fn, future))

    def stop(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, future = item
            try:
                fn(future)
            except Exception:
                log.exception("a native wire call's callback failed")


class WireFuture(Future[Message]):
    """A call's future: its done callbacks run on the channel's callback thread."""

    def __init__(self, callbacks: _Callbacks) -> None:
        super().__init__()
        self._callbacks = callbacks

    def add_done_callback(self, fn: Callable[[Answer], object]) -> None:
        post = self._callbacks.post
        super().add_done_callback(lambda f: post(fn, f))


class _Connection:
    """One TCP connection and the calls in flight on it.

    One thread at a time reads it: whoever holds `token` (a blocking `call` waiting for its
    own answer, or the connection's reader thread). What it reads goes into `buffer` and
    every whole answer there resolves its call, whoever made it."""

    def __init__(
        self,
        sock: socket.socket,
        lock: threading.Lock,
        idle_poll_us: int,
        tls: TlsStream | None = None,
    ) -> None:
        self.sock = sock  # polled, and closed; read and written through `tls` if any
        self.tls = tls
        self.sendall = tls.sendall if tls is not None else sock.sendall
        self.pending: dict[int, tuple[Answer, pw.Method]] = {}
        self.ids = itertools.count(1)
        self.hello_at = self.used_at = time.monotonic()
        self.broken = False
        self.buffer = bytearray()
        self.token = threading.Lock()
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)
        self.idle = IdlePoll(idle_poll_us)  # of the thread that reads (holds `token`)
        # the reader thread waits on it (under the channel's lock) for calls nobody reads
        self.unread = threading.Condition(lock)


class WireChannel:
    """The native wire to one server: `call` and `submit` one unary call."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connect_timeout_s: float = 3.0,
        idle_poll_us: int = DEFAULT_IDLE_POLL_US,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.address = (host, port)
        self._tls = tls
        self._idle_poll_us = check_max_us(idle_poll_us)
        self.target = f"{host}:{port}"
        self._connect_timeout = connect_timeout_s
        self._lock = threading.Lock()
        self._conn: _Connection | None = None
        self._deadlines: list[tuple[float, int, int, _Connection]] = []
        self._tick = itertools.count()
        self._wake = threading.Condition(self._lock)
        self._sweeper: threading.Thread | None = None
        self._callbacks: _Callbacks | None = None
        self._closed = False
        self.unreachable = False  # the last connection attempt failed

    # --- calls
    def call(
        self, method: pw.Method, request: Message, timeout: float | None, metadata: Metadata | None
    ) -> Message:
        """One call, waited for. Its caller reads its answer itself when no other thread
        is reading the connection: no hop through the reader thread and back, whose two
        thread wakes cost more than the rest of a one-at-a-time call's client work."""
        future, conn = self._submit(method, request, timeout, metadata, reads=True)
        give_up = None if timeout is None else time.monotonic() + timeout + 1.0
        if conn is not None and conn.token.acquire(blocking=False):
            try:
                self._read_for(conn, future, give_up)
            finally:
                conn.token.release()
                self._hand_over(conn)
        try:
            if give_up is None:
                return future.result()
            return future.result(max(give_up - time.monotonic(), 0.0))
        except FutureTimeout:  # the sweeper should have answered first
            future.cancel()
            raise WireRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded") from None

    def submit(
        self, method: pw.Method, request: Message, timeout: float | None, metadata: Metadata | None
    ) -> Answer:
        """One call, not waited for: its answer is read by the connection's reader thread
        (or by a `call` reading meanwhile)."""
        return self._submit(method, request, timeout, metadata, reads=False)[0]

    def _submit(
        self,
        method: pw.Method,
        request: Message,
        timeout: float | None,
        metadata: Metadata | None,
        reads: bool,
    ) -> tuple[Answer, _Connection | None]:
        """`submit`; with `reads` the caller reads the answer itself if it can, so the
        reader thread is not woken for it (the connection is returned for that)."""
        payload = request.SerializeToString()
        client_id = ""
        for key, value in metadata or ():
            if key == "x-mq-client-id":
                client_id = value if isinstance(value, str) else value.decode()
                break
        timeout_ms = int(timeout * 1000) if timeout else 0
        with self._lock:
            if self._closed:
                raise WireRpcError(grpc.StatusCode.CANCELLED, "the channel was closed")
            callbacks = self._callbacks
            if callbacks is None:
                callbacks = self._callbacks = _Callbacks(f"wire-callbacks-{self.target}")
            future = WireFuture(callbacks)
            conn = self._conn
            now = time.monotonic()
            if conn is not None and not conn.broken and now - conn.used_at > IDLE_CHECK_S:
                self._drop_if_closed(conn)
            if conn is None or conn.broken:
                conn = self._connect(metadata, method, future)
                if conn is None:  # the hello was refused: the future holds the answer
                    return future, None
            elif now - conn.hello_at > HELLO_EVERY_S:
                self._send(conn, pw.frame(0, pw.HELLO, 0, _hello(metadata)))
                conn.hello_at = time.monotonic()
            conn.used_at = now
            request_id = next(conn.ids) & 0xFFFFFFFF or next(conn.ids)
            conn.pending[request_id] = (future, method)
            data = pw.frame(
                request_id,
                method.code,
                0,
                pw.request_body(client_id.encode(), payload),
                timeout_ms,
            )
            if timeout:
                tick = next(self._tick)
                heapq.heappush(
                    self._deadlines, (time.monotonic() + timeout, tick, request_id, conn)
                )
                if self._sweeper is None:
                    self._sweeper = threading.Thread(
                        target=self._sweep, name="wire-deadlines", daemon=True
                    )
                    self._sweeper.start()
                elif self._deadlines[0][1] == tick:  # sooner than the sweeper waits for
                    self._wake.notify()
            self._send(conn, data)
            if not reads:
                conn.unread.notify()
        return future, conn

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
            callbacks, self._callbacks = self._callbacks, None
            self._wake.notify()
        if conn is not None:
            self._fail(conn, grpc.StatusCode.CANCELLED, "the channel was closed")
        if callbacks is not None:
            callbacks.stop()

    # --- the connection
    def _drop_if_closed(self, conn: _Connection) -> None:
        """Under the lock: forget a connection left idle that the server closed meanwhile
        (it restarted): the call about to be made connects again instead of failing on
        it. With nothing in flight, anything readable is the stream's end or a reset."""
        if conn.pending or not conn.poller.poll(0):
            return
        try:
            if conn.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        conn.broken = True
        self._conn = None
        with contextlib.suppress(OSError):
            conn.sock.close()

    def _connect(
        self, metadata: Metadata | None, method: pw.Method, future: Answer
    ) -> _Connection | None:
        """Under the lock: connect and say hello. None when the server refused the hello
        (`future` then holds `method`'s response with the refusal's status)."""
        if self._closed:
            raise WireRpcError(grpc.StatusCode.CANCELLED, "the channel was closed")
        try:
            sock = socket.create_connection(self.address, timeout=self._connect_timeout)
            self.unreachable = False
        except OSError as exc:
            self.unreachable = True
            raise WireRpcError(
                grpc.StatusCode.UNAVAILABLE, f"cannot connect to {self.target}: {exc}"
            ) from None
        stream: TlsStream | None = None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                stream = TlsStream(sock, self._tls, server_hostname=self.address[0])
                stream.handshake()
            io: TlsStream | socket.socket = stream if stream is not None else sock
            io.sendall(pw.frame(0, pw.HELLO, 0, _hello(metadata)))
            _, _, flags, body = pw.read_frame(io)
        except (OSError, ValueError) as exc:
            sock.close()
            raise WireRpcError(
                grpc.StatusCode.UNAVAILABLE, f"hello to {self.target} failed: {exc}"
            ) from None
        if flags & pw.ERROR:
            sock.close()
            if flags & STATUS:
                status = definition_pb2.Status.FromString(body)
                future.set_result(method.response(status=status))
                return None
            code, _, details = body.decode(errors="replace").partition("\n")
            raise WireRpcError(_code(code), f"hello to {self.target}: {details}")
        sock.settimeout(None)
        conn = _Connection(sock, self._lock, self._idle_poll_us, stream)
        self._conn = conn
        threading.Thread(
            target=self._read, args=(conn,), name=f"wire-reader-{self.target}", daemon=True
        ).start()
        return conn

    def _send(self, conn: _Connection, data: bytes) -> None:
        try:
            conn.sendall(data)
        except OSError as exc:
            conn.broken = True
            if self._conn is conn:
                self._conn = None
            threading.Thread(
                target=self._fail,
                args=(conn, grpc.StatusCode.UNAVAILABLE, f"{self.target}: {exc}"),
                daemon=True,
            ).start()

    def _read(self, conn: _Connection) -> None:
        """The reader thread: reads while calls wait that no caller reads for itself
        (`submit`'s, or those a reading `call` left when its own answer came)."""
        while True:
            with self._lock:
                while not conn.broken and not conn.pending:
                    conn.unread.wait()
                if conn.broken:
                    return
            with conn.token:  # taken over from a reading call as soon as it lets go
                while conn.pending and not conn.broken:
                    if not self._read_once(conn):
                        return

    def _read_for(self, conn: _Connection, future: Answer, give_up: float | None) -> None:
        """Holding the read token: read until `future` is answered, the connection fails,
        or `give_up` passes (polled in steps of SWEEP_S: the sweeper fails a late call
        meanwhile)."""
        poll = conn.poller.poll
        wait = conn.idle.wait
        step_ms = SWEEP_S * 1000
        while not future.done() and not conn.broken:
            if not wait(lambda: poll(0), lambda: poll(step_ms)):
                if give_up is not None and time.monotonic() >= give_up:
                    return
                continue
            if not self._read_once(conn):
                return

    def _hand_over(self, conn: _Connection) -> None:
        """After a call stopped reading: the reader thread reads for the calls left."""
        with self._lock:
            if conn.pending and not conn.broken:
                conn.unread.notify()

    def _read_once(self, conn: _Connection) -> bool:
        """Holding the read token: one recv, and every whole answer read resolves its
        call. False once the connection has failed (every call on it failed)."""
        try:
            if conn.tls is None:
                data: bytes | None = conn.sock.recv(1 << 18)
            else:
                data = conn.tls.recv_some()
                if data is None:  # a TLS record still partial: read again when readable
                    return True
        except OSError as exc:
            self._fail(conn, grpc.StatusCode.UNAVAILABLE, f"{self.target}: {exc}")
            return False
        if not data:
            reason = "the server closed the connection"
            self._fail(conn, grpc.StatusCode.UNAVAILABLE, f"{self.target}: {reason}")
            return False
        buffer, pending = conn.buffer, conn.pending
        buffer += data
        unpack = pw.HEADER.unpack_from
        head = pw.HEADER_SIZE
        size, offset = len(buffer), 0
        while size - offset >= head:
            length, request_id, _, flags, _ = unpack(buffer, offset)
            end = offset + head + length
            if end > size:
                break
            body = bytes(buffer[offset + head : end])
            offset = end
            entry = pending.pop(request_id, None)
            if entry is not None:
                _resolve(entry[0], entry[1], flags, body)
        if offset:
            del buffer[:offset]
        return True

    def _fail(self, conn: _Connection, code: grpc.StatusCode, details: str) -> None:
        with self._lock:
            conn.broken = True
            if self._conn is conn:
                self._conn = None
            entries = list(conn.pending.values())
            conn.pending.clear()
            conn.unread.notify_all()
        with contextlib.suppress(OSError):
            conn.sock.close()
        for future, _ in entries:
            if not future.done():
                future.set_exception(WireRpcError(code, details))

    def _sweep(self) -> None:
        """Fail calls past their deadline, and tell the server to drop them."""
        deadlines = self._deadlines
        while True:
            expired: list[tuple[int, _Connection, Answer]] = []
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                while deadlines and deadlines[0][0] <= now:
                    _, _, request_id, conn = heapq.heappop(deadlines)
                    entry = conn.pending.pop(request_id, None)
                    if entry is not None:
                        expired.append((request_id, conn, entry[0]))
                        if not conn.broken:
                            self._send(conn, pw.frame(request_id, pw.CANCEL, 0, b""))
                if not expired:
                    # at most 20 wakes a second, however many calls are in flight
                    wait = max(deadlines[0][0] - now, SWEEP_S) if deadlines else None
                    self._wake.wait(wait)
                    continue
            for _, _, future in expired:
                if not future.done():
                    future.set_exception(
                        WireRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")
                    )


def _hello(metadata: Metadata | None) -> bytes:
    return json.dumps({k: v for k, v in metadata or () if k not in _DROP}).encode()


def _resolve(future: Answer, method: pw.Method, flags: int, body: bytes) -> None:
    if future.done():
        return
    if not flags & pw.ERROR:
        try:
            response = method.response.FromString(body)
        except Exception as exc:
            future.set_exception(
                WireRpcError(grpc.StatusCode.INTERNAL, f"unreadable {method.name} answer: {exc}")
            )
            return
        future.set_result(response)
    elif flags & STATUS:
        future.set_result(method.response(status=definition_pb2.Status.FromString(body)))
    else:
        code, _, details = body.decode(errors="replace").partition("\n")
        future.set_exception(WireRpcError(_code(code), details))


class _Method:
    """One unary method of the stub: over the wire once it is known to be offered, else
    over grpc."""

    __slots__ = ("_method", "_native", "future")

    def __init__(self, native: NativeStub, method: pw.Method) -> None:
        self._native, self._method = native, method
        self.future = self._future

    def __call__(
        self, request: Message, timeout: float | None = None, metadata: Metadata | None = None
    ) -> Message:
        channel = self._native.channel(metadata, timeout)
        if channel is None:
            return self._native.fallback(self._method.name)(
                request, timeout=timeout, metadata=metadata
            )
        return channel.call(self._method, request, timeout, metadata)

    def _future(
        self, request: Message, timeout: float | None = None, metadata: Metadata | None = None
    ) -> Answer | grpc.Future[Message]:
        channel = self._native.channel(metadata, timeout)
        if channel is None:
            return self._native.fallback(self._method.name).future(
                request, timeout=timeout, metadata=metadata
            )
        try:
            return channel.submit(self._method, request, timeout, metadata)
        except WireRpcError as exc:  # could not connect: a failed future, as grpc's
            failed: Answer = Future()
            failed.set_exception(exc)
            return failed


class NativeStub:
    """The grpc stub's unary methods over the native wire (`ReceiveMessages` too, as
    `receive_messages`); everything else is the grpc stub's."""

    def __init__(
        self,
        grpc_stub: MessagingServiceStub,
        receive_messages: GrpcMethod | None,
        *,
        host: str,
        ask_port: AskPort,
        port: int | None = None,
        connect_timeout_s: float = 3.0,
        idle_poll_us: int = DEFAULT_IDLE_POLL_US,
        tls: ssl.SSLContext | None = None,
        advertised: bool = False,
    ) -> None:
        """`port`: where the wire is, named by the caller (never asked again), or with
        `advertised` the server's own word from a route (asked again if it stops answering,
        as a server restarted on another free port does)."""
        self._grpc = grpc_stub
        self._tls = tls
        self._idle_poll_us = idle_poll_us
        self._grpc_receive = receive_messages
        self._host = host
        self._ask_port = ask_port  # (metadata, timeout) -> the advertised port; 0: none
        self._port = port
        self._connect_timeout = connect_timeout_s
        self._channel: WireChannel | None = None
        self._lock = threading.Lock()
        self._decided = port is not None
        # the port is the server's answer (asked, or from its route), not the caller's
        self._asked = port is None or advertised
        for m in pw.METHODS:
            setattr(self, m.name, _Method(self, m))
        self.receive_messages = _Method(self, pw.BY_NAME["ReceiveMessages"])
        if port:
            self._channel = WireChannel(
                host,
                port,
                connect_timeout_s=connect_timeout_s,
                idle_poll_us=idle_poll_us,
                tls=tls,
            )

    def __getattr__(self, name: str) -> object:  # ReceiveMessage, Telemetry
        return getattr(self._grpc, name)

    @property
    def native(self) -> bool | None:
        """True: calls go over the wire; False: over grpc; None: not known yet."""
        return (self._channel is not None) if self._decided else None

    def fallback(self, name: str) -> GrpcMethod:
        receive = self._grpc_receive
        if name == pw.BY_NAME["ReceiveMessages"].name and receive is not None:
            return receive
        return cast(GrpcMethod, getattr(self._grpc, name))

    def channel(self, metadata: Metadata | None, timeout: float | None) -> WireChannel | None:
        if self._decided:
            channel = self._channel
            if channel is None or not channel.unreachable or not self._asked:
                return channel
            # the advertised port no longer answers (a server restarted on another
            # port?): ask again, and meanwhile this call goes over grpc
            with self._lock:
                if self._channel is channel:
                    self._decided, self._channel = False, None
                    channel.close()
        with self._lock:
            if not self._decided:
                try:
                    asked = self._ask_port(metadata, timeout)
                except grpc.RpcError as exc:
                    if exc.code() in _NOT_YET:
                        return None  # not known yet (server down?): this call over grpc
                    asked = 0  # an Apache RocketMQ proxy (UNIMPLEMENTED): no such service
                if asked is None:
                    return None  # not told (e.g. the signature was refused): over grpc
                port = int(asked)
                if port:
                    self._channel = WireChannel(
                        self._host,
                        port,
                        connect_timeout_s=self._connect_timeout,
                        idle_poll_us=self._idle_poll_us,
                        tls=self._tls,
                    )
                    log.info(
                        "%s: unary calls over the native wire %s:%d", self._host, self._host, port
                    )
                else:
                    log.info("%s offers no native wire: calls go over gRPC", self._host)
                self._decided = True
        return self._channel

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
