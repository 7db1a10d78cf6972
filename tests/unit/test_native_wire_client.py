"""The native wire's client (`reliable.transport._native_wire`) against a scripted peer:
deadlines are honoured (DEADLINE_EXCEEDED, and the server is told with CANCEL), answers are
matched by id whatever their order, and a peer that goes away fails the calls in flight
with UNAVAILABLE. The real server is exercised in tests/e2e/grpc/test_wire.py."""

from __future__ import annotations

import json
import select
import socket
import threading
from collections.abc import Callable, Iterator

import grpc
import pytest

from protocol import wire as pw
from protocol.pb import service_pb2
from reliable.transport._native_wire import WireChannel, WireRpcError

SEND = pw.BY_NAME["SendMessage"]
MD = [("x-mq-client-id", "unit"), ("x-mq-namespace", "")]


def read_frame(sock: socket.socket) -> tuple[int, int, bytes]:
    """(request id, method, body) of the next frame."""
    f = pw.read_frame(sock)
    return f.request_id, f.method, f.body


@pytest.fixture
def peer() -> Iterator[Callable[[Callable[[socket.socket], None]], int]]:
    """A one-connection server running `script(conn)` after answering the hello."""
    listeners: list[socket.socket] = []

    def start(script: Callable[[socket.socket], None]) -> int:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)

        def serve() -> None:
            conn, _ = listener.accept()
            listener.close()  # one connection: a reconnect is refused
            with conn:
                request_id, method, _ = read_frame(conn)
                assert method == pw.HELLO
                conn.sendall(pw.frame(request_id, 0, 0, json.dumps({"version": 1}).encode()))
                script(conn)

        threading.Thread(target=serve, daemon=True).start()
        return int(listener.getsockname()[1])

    yield start
    for listener in listeners:
        listener.close()


def answer(conn: socket.socket, request_id: int, offset: int) -> None:
    reply = service_pb2.SendMessageResponse()
    reply.entries.add().offset = offset
    conn.sendall(pw.frame(request_id, 0, 0, reply.SerializeToString()))


def test_a_late_call_fails_with_deadline_exceeded_and_is_cancelled_at_the_server(
    peer: Callable[[Callable[[socket.socket], None]], int],
) -> None:
    seen: list[tuple[int, int]] = []
    cancelled = threading.Event()

    def script(conn: socket.socket) -> None:
        while True:
            request_id, method, _ = read_frame(conn)
            seen.append((request_id, method))
            if method == pw.CANCEL:
                cancelled.set()
                return

    channel = WireChannel("127.0.0.1", peer(script))
    try:
        with pytest.raises(WireRpcError) as info:
            channel.call(SEND, service_pb2.SendMessageRequest(), 0.2, MD)
        assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert cancelled.wait(5)
        assert [m for _, m in seen] == [SEND.code, pw.CANCEL]
        assert seen[0][0] == seen[1][0]  # the CANCEL names the late request
    finally:
        channel.close()


def test_answers_are_matched_by_id_in_any_order(
    peer: Callable[[Callable[[socket.socket], None]], int],
) -> None:
    def script(conn: socket.socket) -> None:
        ids = [read_frame(conn)[0] for _ in range(3)]
        for request_id in reversed(ids):  # answered last first
            answer(conn, request_id, 100 + ids.index(request_id))
        conn.recv(1)

    channel = WireChannel("127.0.0.1", peer(script))
    try:
        futures = [channel.submit(SEND, service_pb2.SendMessageRequest(), 5, MD) for _ in range(3)]
        assert [f.result(5).entries[0].offset for f in futures] == [100, 101, 102]
    finally:
        channel.close()


def test_a_peer_that_goes_away_fails_the_calls_in_flight_with_unavailable(
    peer: Callable[[Callable[[socket.socket], None]], int],
) -> None:
    def script(conn: socket.socket) -> None:
        read_frame(conn)
        read_frame(conn)  # two calls in flight, then the connection drops

    channel = WireChannel("127.0.0.1", peer(script))
    try:
        futures = [channel.submit(SEND, service_pb2.SendMessageRequest(), 5, MD) for _ in range(2)]
        for future in futures:
            with pytest.raises(WireRpcError) as info:
                future.result(5)
            assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        # the next call connects again: nobody listens any more, so it fails at once
        with pytest.raises(WireRpcError) as again:
            channel.call(SEND, service_pb2.SendMessageRequest(), 5, MD)
        assert again.value.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        channel.close()


def test_blocking_and_submitted_calls_on_one_connection_each_get_their_own_answer(
    peer: Callable[[Callable[[socket.socket], None]], int],
) -> None:
    """Whoever reads the connection (a blocking call waiting for its own answer, or the
    reader thread for submitted calls) resolves every answer it reads: with many threads
    calling at once, submitted calls beside them, and answers arriving out of order and
    cut into pieces, each call gets its own answer and none is left unread."""
    import random

    calls, threads_n, per_thread, submitted = 0, 6, 30, 60
    total = threads_n * per_thread + submitted

    def script(conn: socket.socket) -> None:
        rng = random.Random(7)
        waiting: list[tuple[int, int]] = []  # (request id, the number the call carries)
        answered = 0
        while answered < total:
            request_id, method, body = read_frame(conn)
            assert method == SEND.code
            (id_length,) = pw.CLIENT_ID.unpack_from(body)
            request = service_pb2.SendMessageRequest.FromString(body[2 + id_length :])
            waiting.append((request_id, int(request.messages[0].topic.name[1:])))
            # answered now and then, and whenever no other request comes meanwhile
            quiet = not select.select([conn], [], [], 0.02)[0]
            if quiet or rng.random() < 0.3 or answered + len(waiting) == total:
                rng.shuffle(waiting)  # out of order, in one write cut at random places
                data = b""
                for rid, number in waiting:
                    reply = service_pb2.SendMessageResponse()
                    reply.entries.add().offset = number
                    data += pw.frame(rid, 0, 0, reply.SerializeToString())
                answered += len(waiting)
                waiting = []
                while data:
                    cut = rng.randint(1, max(1, len(data) // 2))
                    conn.sendall(data[:cut])
                    data = data[cut:]
        conn.recv(1)

    def request(number: int) -> service_pb2.SendMessageRequest:
        req = service_pb2.SendMessageRequest()
        req.messages.add().topic.name = f"t{number}"
        return req

    channel = WireChannel("127.0.0.1", peer(script))
    got: dict[int, int] = {}
    errors: list[BaseException] = []

    def caller(first: int) -> None:
        try:
            for number in range(first, first + per_thread):
                got[number] = channel.call(SEND, request(number), 10, MD).entries[0].offset
        except BaseException as exc:  # reported below
            errors.append(exc)

    try:
        threads = [
            threading.Thread(target=caller, args=(t * per_thread,)) for t in range(threads_n)
        ]
        for t in threads:
            t.start()
        base = threads_n * per_thread
        futures = {
            base + k: channel.submit(SEND, request(base + k), 10, MD) for k in range(submitted)
        }
        for t in threads:
            t.join(30)
        for number, future in futures.items():
            got[number] = future.result(10).entries[0].offset
        calls = len(got)
        assert not errors
        assert got == {n: n for n in range(total)}
    finally:
        channel.close()
    assert calls == total


def test_a_blocking_call_whose_answer_comes_after_the_reading_call_stopped_still_gets_it(
    peer: Callable[[Callable[[socket.socket], None]], int],
) -> None:
    """Call A reads the connection for its own answer; call B, made meanwhile, waits for
    its answer without reading (A holds the read). A's answer comes, A stops reading, and
    only then B's: the reader thread takes over and B gets it."""
    first_in = threading.Event()
    b_sent = threading.Event()

    def script(conn: socket.socket) -> None:
        answer(conn, read_frame(conn)[0], 0)  # a first call: the connection is made
        a_id = read_frame(conn)[0]
        first_in.set()
        b_id = read_frame(conn)[0]
        b_sent.set()
        threading.Event().wait(0.2)  # B has found the read taken and waits
        answer(conn, a_id, 1)
        threading.Event().wait(0.3)  # A has its answer and has stopped reading
        answer(conn, b_id, 2)
        conn.recv(1)

    channel = WireChannel("127.0.0.1", peer(script))
    try:
        got: dict[str, int] = {}

        def call(name: str) -> None:
            got[name] = (
                channel.call(SEND, service_pb2.SendMessageRequest(), 5, MD).entries[0].offset
            )

        call("warm-up")  # the reader thread now waits for calls nobody reads
        conn = channel._conn
        assert conn is not None

        def settle(locked: bool) -> None:
            for _ in range(500):
                if conn.token.locked() is locked:
                    return
                threading.Event().wait(0.01)

        settle(False)  # nobody reads: the reader thread has let go after the warm-up
        threading.Event().wait(0.2)  # and waits for calls nobody reads
        a = threading.Thread(target=call, args=("a",))
        a.start()
        assert first_in.wait(5)
        settle(True)  # A holds the read (it took it right after its send)
        b = threading.Thread(target=call, args=("b",))
        b.start()
        assert b_sent.wait(5)
        a.join(5)
        b.join(5)
        assert got == {"warm-up": 0, "a": 1, "b": 2}
    finally:
        channel.close()


@pytest.mark.parametrize("idle_poll_us", [0, 5_000])
def test_a_blocking_call_polls_for_its_answer_only_with_a_window_and_gets_every_answer(
    peer: Callable[[Callable[[socket.socket], None]], int], idle_poll_us: int
) -> None:
    """A peer that answers within the bound widens the reading call's poll window (the
    answer is then met by a poll, not a sleep); with the bound 0 the call never polls.
    Either way each call gets its own answer."""

    def script(conn: socket.socket) -> None:
        for _ in range(100):
            request_id, _, _ = read_frame(conn)
            answer(conn, request_id, request_id * 10)
        conn.recv(1)

    channel = WireChannel("127.0.0.1", peer(script), idle_poll_us=idle_poll_us)
    windows, offsets = [], []
    try:
        for _ in range(100):
            reply = channel.call(SEND, service_pb2.SendMessageRequest(), 5, MD)
            conn = channel._conn
            assert conn is not None
            windows.append(conn.idle.limit_ns)
            offsets.append(reply.entries[0].offset)
    finally:
        channel.close()
    assert offsets == [10 * i for i in range(1, 101)]  # call i got the answer to request i
    if idle_poll_us:
        assert max(windows) > 0, "answers within the bound never widened the poll window"
    else:
        assert set(windows) == {0}


def test_a_bound_out_of_range_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="idle poll"):
        WireChannel("127.0.0.1", 1, idle_poll_us=-1)
