"""The native wire's client (`reliable.transport._native_wire`) against a scripted peer:
deadlines are honoured (DEADLINE_EXCEEDED, and the server is told with CANCEL), answers are
matched by id whatever their order, and a peer that goes away fails the calls in flight
with UNAVAILABLE. The real server is exercised in tests/e2e/grpc/test_wire.py."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator

import grpc
import pytest

from broker import protocol_wire as pw
from broker.protocol_pb import service_pb2
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
