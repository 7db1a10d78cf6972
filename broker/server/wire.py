"""The native wire's listener (`protocol.wire`, docs/wire.md): framed TCP beside gRPC.

    wire = WireServer(ctx, servicer, max_frame=MAX_MESSAGE_BYTES)
    port = await wire.start("127.0.0.1", 0)     # on the server's event loop
    ...
    await wire.stop(grace_s)

It runs on the gRPC server's event loop. Each request frame becomes one call of the SAME
servicer method a gRPC call reaches (`MessagingServicer.SendMessage(request, context)`),
with a `WireContext` in place of grpc's: the connection's hello metadata plus the frame's
client id, its peer, its deadline, and cancellation when the connection closes. So the
caller's signature is checked per request by the same code, and every status is the same.

Many requests are in flight per connection, each answered when it finishes (out of order,
matched by request id). A connection with `MAX_INFLIGHT` requests running, or whose answers
the peer does not read, is not read until it catches up.

What is refused, and how (one log line per kind a minute, `broker.server.ratelimit`):
- a request before the hello, a hello that is not a JSON object of strings: an ERROR
  answer (UNAUTHENTICATED / INVALID_ARGUMENT), then the connection is closed;
- a hello whose signature does not hold: answered with the refusal's protocol `Status`
  (flags ERROR | STATUS), then closed; the client answers its calls with that status, as
  the gRPC call would have;
- a frame longer than `max_frame`: RESOURCE_EXHAUSTED, then closed (the stream cannot be
  resynchronised without reading it);
- an unknown method, a body too short for its client id, a request id already in flight:
  an ERROR answer (UNIMPLEMENTED / INVALID_ARGUMENT); the connection goes on;
- a body that is not the method's protobuf message: the servicer's own in-band
  BAD_REQUEST, exactly as over gRPC (`broker.server.decoding`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.server.context import ServerContext

if TYPE_CHECKING:
    from broker.server.servicer import MessagingServicer
from broker.server.decoding import parser
from broker.server.detached import resume
from broker.server.ratelimit import LogLimiter
from broker.server.status import status_of
from protocol import wire as pw

log = logging.getLogger(__name__)
_limited = LogLimiter(log)

MAX_INFLIGHT = 4096  # requests running on one connection before it is no longer read
FRAMES_PER_TURN = 64  # requests started per loop turn from one connection's bytes
STATUS = 0x2  # with ERROR: the body is a protocol Status (a refused hello)


class WireContext:
    """What the servicer's unary handlers use from a grpc.aio context."""

    __slots__ = ("_callbacks", "_cancelled", "_conn", "_deadline", "_metadata", "alone")
    native_wire = True  # `CallInfo.native_wire`

    def __init__(
        self,
        conn: WireConnection,
        metadata: tuple[tuple[str, str], ...],
        deadline: float | None,
        alone: bool = False,
    ) -> None:
        # `CallInfo.alone`: the only frame its connection's bytes held, read in a turn the
        # loop woke for that connection alone
        self.alone = alone
        self._conn = conn
        self._metadata = metadata
        self._deadline = deadline
        self._callbacks: list[Callable[[WireContext], None]] | None = None
        self._cancelled = False

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return self._conn.peer

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - self._conn.loop.time())

    def add_done_callback(self, callback: Callable[[WireContext], None]) -> None:
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append(callback)

    def cancelled(self) -> bool:
        return self._cancelled

    def _done(self, cancelled: bool) -> None:
        self._cancelled = cancelled
        if self._callbacks:
            for callback in self._callbacks:
                try:
                    callback(self)
                except Exception:
                    log.exception("a wire call's done callback failed")


class WireConnection(asyncio.Protocol):
    _numbers = itertools.count(1)

    def __init__(self, server: WireServer) -> None:
        self.server = server
        self.loop = server.loop
        self.number = next(self._numbers)
        self.peer = "?"
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._hello: tuple[tuple[str, str], ...] | None = None
        self._tasks: dict[int, tuple[asyncio.Future[Any], WireContext]] = {}
        self._closed = False
        self._read_paused = False
        self._write_paused = False
        self._backlog = False  # whole frames left for the next turn (`_take_frames`)
        self._out: list[bytes] | None = None  # answers written at the end of the turn

    # --- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            family = "ipv6" if ":" in str(peer[0]) else "ipv4"
            self.peer = f"{family}:{peer[0]}:{peer[1]}"
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.server.connections.discard(self)
        running, self._tasks = list(self._tasks.values()), {}
        for future, _ in running:
            future.cancel()  # a parked long poll ends; its messages are let go

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if not self._backlog:
            self._take_frames()

    def _take_frames(self) -> None:
        """Start the whole frames in the buffer, `FRAMES_PER_TURN` at most: a connection
        that sent a burst does not keep the loop from answering (and from reading the
        others) until all of it is started; the rest is taken in the next turn, and the
        connection is not read meanwhile."""
        self._backlog = False
        buffer = self._buffer
        size = len(buffer)
        offset = 0
        unpack = pw.HEADER.unpack_from
        head = pw.HEADER_SIZE
        max_frame = self.server.max_frame
        taken = 0
        try:
            while size - offset >= head and not self._closed:
                length, request_id, method, _flags, timeout_ms = unpack(buffer, offset)
                if length > max_frame:
                    self._refuse_and_close(
                        "oversized",
                        request_id,
                        "RESOURCE_EXHAUSTED",
                        f"frame of {length} bytes is over the limit of {max_frame}",
                    )
                    return
                end = offset + head + length
                if end > size:
                    break
                if taken == FRAMES_PER_TURN:
                    self._backlog = True
                    self.loop.call_soon(self._take_frames)
                    break
                body = bytes(buffer[offset + head : end])
                alone = not taken and end == size and self.server.ctx.wake.alone
                offset = end
                taken += 1
                self._frame(request_id, method, timeout_ms, body, alone)
        finally:
            if offset:
                del buffer[:offset]
            self._update_reading()

    # --- frames
    def _frame(
        self, request_id: int, method: int, timeout_ms: int, body: bytes, alone: bool = False
    ) -> None:
        if method == pw.HELLO:
            self._on_hello(request_id, body)
            return
        if self._hello is None:
            self._refuse_and_close(
                "no-hello", request_id, "UNAUTHENTICATED", "the first frame must be a hello"
            )
            return
        if method == pw.CANCEL:
            running = self._tasks.pop(request_id, None)
            if running is not None:  # its answer, if any, is dropped by the caller
                running[0].cancel()
            return
        m = self.server.methods.get(method)
        if m is None:
            self._error(request_id, "UNIMPLEMENTED", f"unknown method {method}")
            _limited.log(
                logging.WARNING, "wire-method", "wire: unknown method %d from %s", method, self.peer
            )
            return
        if request_id in self._tasks:
            self._error(request_id, "INVALID_ARGUMENT", f"request id {request_id} is in flight")
            return
        if len(body) < 2:
            self._error(request_id, "INVALID_ARGUMENT", "request body has no client id")
            return
        (id_length,) = pw.CLIENT_ID.unpack_from(body)
        if 2 + id_length > len(body):
            self._error(request_id, "INVALID_ARGUMENT", "client id longer than the body")
            return
        try:
            client_id = body[2 : 2 + id_length].decode()
        except UnicodeDecodeError:
            self._error(request_id, "INVALID_ARGUMENT", "client id is not UTF-8")
            return
        _name, parse, handler = m
        request = parse(body[2 + id_length :])
        metadata = (
            *self._hello,
            ("x-mq-client-id", client_id),
            ("x-mq-request-id", f"w{self.number}-{request_id}"),
        )
        deadline = self.loop.time() + timeout_ms / 1000 if timeout_ms else None
        context = WireContext(self, metadata, deadline, alone)
        # started at once, in this loop turn: a call that never waits (most sends under
        # async flush, acks, queries) is answered without a task or another turn; one that
        # waits goes on in a task from where it stopped
        call = self._call(request_id, handler, request, context)
        try:
            waited = call.send(None)
        except (StopIteration, asyncio.CancelledError):  # answered, or abandoned unanswered
            return
        task = self.loop.create_task(resume(call, waited))
        self._tasks[request_id] = (task, context)
        if len(self._tasks) >= MAX_INFLIGHT:
            self._update_reading()

    async def _call(
        self, request_id: int, handler: Any, request: Any, context: WireContext
    ) -> None:
        """Run one call and answer it as soon as it returns (a task's done callback would
        answer one loop turn later)."""
        try:
            response = await handler(request, context)
        except asyncio.CancelledError:
            self._tasks.pop(request_id, None)
            context._done(cancelled=True)
            if not self._closed:
                self._error(request_id, "CANCELLED", "the call was cancelled")
            self._update_reading()
            raise
        except Exception:  # the servicer answers every error in-band: this is a bug
            self._tasks.pop(request_id, None)
            log.exception("wire: %s call failed", type(request).__name__)
            context._done(cancelled=False)
            self._error(request_id, "INTERNAL", "the server failed to answer")
            self._update_reading()
            return
        self._tasks.pop(request_id, None)
        if self._closed:  # the caller went away: it never gets the answer
            context._done(cancelled=True)
            return
        self._write(request_id, 0, response.SerializeToString())
        context._done(cancelled=False)
        if self._read_paused:
            self._update_reading()

    def _on_hello(self, request_id: int, body: bytes) -> None:
        try:
            raw = json.loads(body.decode())
            if not isinstance(raw, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
            ):
                raise ValueError("not a JSON object of strings")
        except (ValueError, UnicodeDecodeError) as exc:
            self._refuse_and_close("bad-hello", request_id, "INVALID_ARGUMENT", f"hello: {exc}")
            return
        metadata = tuple(
            (k.lower(), v)
            for k, v in raw.items()
            if k.lower() not in ("x-mq-client-id", "x-mq-request-id")
        )
        try:  # the same check every call gets; a refusal answers with its Status
            self.server.ctx.call_info(WireContext(self, metadata, None), require_client_id=False)
        except Exception as exc:
            _limited.log(
                logging.WARNING, "wire-hello", "wire: hello from %s refused: %s", self.peer, exc
            )
            self._write(request_id, pw.ERROR | STATUS, status_of(exc).SerializeToString())
            self._close()
            return
        self._hello = metadata
        reply = {"version": pw.VERSION, "max_frame": self.server.max_frame}
        self._write(request_id, 0, json.dumps(reply).encode())

    # --- writing
    def _write(self, request_id: int, flags: int, body: bytes) -> None:
        """Queue an answer: the answers of one loop turn leave in one write (`_flush`),
        where each written alone cost a system call."""
        if self._closed or self.transport is None:
            return
        framed = pw.frame(request_id, 0, flags, body)
        if self._out is None:
            self._out = [framed]
            self.loop.call_soon(self._flush)
        else:
            self._out.append(framed)

    def _flush(self) -> None:
        out, self._out = self._out, None
        if out and not self._closed and self.transport is not None:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def _error(self, request_id: int, code: str, details: str) -> None:
        self._write(request_id, pw.ERROR, f"{code}\n{details}".encode())

    def _refuse_and_close(self, kind: str, request_id: int, code: str, details: str) -> None:
        _limited.log(
            logging.WARNING,
            f"wire-{kind}",
            "wire: closing the connection from %s: %s",
            self.peer,
            details,
        )
        self._error(request_id, code, details)
        self._close()

    def _close(self) -> None:
        if self.transport is not None and not self._closed:
            self._flush()  # a refusal's answer before the close
            self._closed = True
            self.transport.close()  # flushes what was written, then connection_lost

    def _update_reading(self) -> None:
        transport = self.transport
        if transport is None or self._closed:
            return
        pause = self._write_paused or self._backlog or len(self._tasks) >= MAX_INFLIGHT
        if pause and not self._read_paused:
            self._read_paused = True
            transport.pause_reading()
        elif not pause and self._read_paused:
            self._read_paused = False
            transport.resume_reading()


class WireServer:
    def __init__(self, ctx: ServerContext, servicer: MessagingServicer, *, max_frame: int) -> None:
        self.ctx = ctx
        self.max_frame = max_frame
        self.connections: set[WireConnection] = set()
        self.loop: asyncio.AbstractEventLoop = asyncio.get_running_loop()  # made on it
        self._server: asyncio.Server | None = None
        # code -> (name, never-raising parser, servicer method)
        self.methods: dict[int, tuple[str, Callable[[bytes], Any], Any]] = {
            m.code: (m.name, parser(m.request, m.name), getattr(servicer, m.name))
            for m in pw.METHODS
        }

    async def start(self, host: str, port: int, *, tls: ssl.SSLContext | None = None) -> int:
        """Listen on `host:port` (0: any free port); the port bound. With `tls`, every
        connection is TLS (the gRPC port's certificate), handshaken before its HELLO."""
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(
            lambda: WireConnection(self), host, port, reuse_address=True, ssl=tls
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, grace_s: float) -> None:
        """Stop accepting; give running calls `grace_s`, then close every connection."""
        if self._server is not None:
            self._server.close()
        running = [f for c in self.connections for f, _ in c._tasks.values()]
        if running:
            await asyncio.wait(running, timeout=grace_s)
        for conn in list(self.connections):
            conn._close()
