"""The native wire (docs/wire.md) against real server processes: the transport finds it
(or falls back to gRPC), a bad signature is refused as over gRPC, bad and random frames
get clear answers while the server keeps serving, and a server SIGKILLed mid-flight fails
the calls in flight with TransportError and loses nothing it acknowledged.

The behaviours routed over the wire are covered by test_pipelining.py and
test_batched_rpcs.py, which run over both wires.
"""

from __future__ import annotations

import json
import random
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

import reliable
from bench._tls import self_signed
from broker.broker import Broker
from broker.server.codes import Code
from broker.server.config import ServerConfig
from broker.server.errors import ServerStartError
from broker.server.server import MessagingServer
from broker.store.config import StoreConfig
from protocol import ext as protocol_ext
from protocol import wire as pw
from protocol.pb import definition_pb2, service_pb2, service_pb2_grpc
from reliable import Message, Producer, TransportError
from reliable.transport._native_wire import WireChannel, WireRpcError
from reliable.transport._wire_tls import client_context
from tests.e2e.grpc.conftest import FAST
from tests.e2e.grpc.server_process import ServerProcess, cli
from tests.e2e.grpc.test_malformed import receive_request
from tests.e2e.helpers import wait_until

HELLO = json.dumps({"x-mq-namespace": "", "x-mq-language": "PYTHON"}).encode()


def connect(port: int, hello: bool = True) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    if hello:
        sock.sendall(pw.frame(0, pw.HELLO, 0, HELLO))
        _, flags, body = read_frame(sock)
        assert flags == 0 and json.loads(body)["version"] == pw.VERSION
    return sock


def read_frame(sock: socket.socket) -> tuple[int, int, bytes]:
    """(request id, flags, body) of the next frame; ConnectionError at a clean close."""
    f = pw.read_frame(sock)
    return f.request_id, f.flags, f.body


def closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def request(request_id: int, method: str, message: Any, client_id: bytes = b"wire-test") -> bytes:
    code = pw.BY_NAME[method].code
    return pw.frame(request_id, code, 0, pw.request_body(client_id, message.SerializeToString()))


def send_request(topic: str, body: bytes) -> Any:
    req = service_pb2.SendMessageRequest()
    m = req.messages.add()
    m.topic.name, m.body = topic, body
    m.system_properties.message_id = f"WIRE{random.getrandbits(64):016X}"
    m.system_properties.message_type = 1
    m.system_properties.body_encoding = 1
    m.system_properties.born_host = "127.0.0.1"
    m.system_properties.born_timestamp.GetCurrentTime()
    return req


def serves(port: int) -> bool:
    """A send over a fresh wire connection is stored."""
    with connect(port) as sock:
        sock.sendall(request(7, "SendMessage", send_request("wire-alive", b"ok")))
        request_id, flags, body = read_frame(sock)
    reply = service_pb2.SendMessageResponse.FromString(body)
    return request_id == 7 and flags == 0 and reply.status.code == Code.OK


def test_the_transport_uses_the_advertised_wire_and_grpc_without_one(
    server: ServerProcess, tmp_path: Path
) -> None:
    with Producer("grpc", endpoint=server.endpoint, wire="native") as producer:
        assert producer.send(Message("wire-found", b"a")).message_id
        assert producer._transport.stub.native is True  # type: ignore[attr-defined]
    # the route says where the wire is too, in a field the official clients ignore
    with grpc.insecure_channel(server.endpoint) as channel:
        route = service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(
            service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name="wire-found")),
            timeout=10,
            metadata=(("x-mq-client-id", "wire-route-test"),),
        )
    assert route.message_queues
    assert {protocol_ext.wire_port_of(mq.broker) for mq in route.message_queues} == {
        server.wire_port
    }
    # a server with its wire off (in-process here): the same calls over gRPC
    broker = Broker(StoreConfig(store_dir=tmp_path, mapped_file_size_commitlog=8 << 20))
    broker.start()
    plain = MessagingServer(broker, ServerConfig(port=0, wire_port=None))
    plain.start()
    try:
        with Producer("grpc", endpoint=f"127.0.0.1:{plain.port}", wire="native") as producer:
            assert producer.send(Message("wire-none", b"b")).message_id
            assert producer._transport.stub.native is False  # type: ignore[attr-defined]
    finally:
        plain.stop()
        broker.shutdown()


def test_a_bad_signature_is_refused_over_the_wire_as_over_grpc(
    tmp_path: Path, make_server: Callable[..., ServerProcess]
) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"app-key": "app-secret"}))
    server = make_server("--credentials-file", str(keys), "--wire-port", "0")
    wire_endpoint = f"127.0.0.1:{server.wire_port}"
    for ak, sk in (("app-key", "wrong"), ("", "")):
        t = reliable.connect(
            "grpc",
            endpoint=server.endpoint,
            wire_endpoint=wire_endpoint,
            access_key=ak,
            secret_key=sk,
        )
        t.start()
        try:
            with pytest.raises(reliable.BrokerCallError) as info:
                t.route("t-auth")
            assert info.value.code == "UNAUTHORIZED"
        finally:
            t.close()
    # an unsigned hello on a raw connection: the refusal's status, then the close
    with socket.create_connection(("127.0.0.1", server.wire_port), timeout=10) as sock:
        sock.sendall(pw.frame(0, pw.HELLO, 0, HELLO))
        _, flags, body = read_frame(sock)
        assert flags & pw.ERROR
        assert definition_pb2.Status.FromString(body).code == Code.UNAUTHORIZED
        assert closed(sock)
    with Producer(
        "grpc",
        endpoint=server.endpoint,
        wire="native",
        access_key="app-key",
        secret_key="app-secret",
    ) as producer:
        assert producer.send(Message("t-auth", b"signed")).message_id
        assert producer._transport.stub.native is True  # type: ignore[attr-defined]


def test_bad_frames_get_a_clear_answer_and_the_server_keeps_serving(server: ServerProcess) -> None:
    port = server.wire_port
    # a request before the hello: UNAUTHENTICATED, then closed
    with connect(port, hello=False) as sock:
        sock.sendall(request(1, "SendMessage", send_request("wire-bad", b"x")))
        assert read_frame(sock) == (
            1,
            pw.ERROR,
            b"UNAUTHENTICATED\nthe first frame must be a hello",
        )
        assert closed(sock)
    # a hello that is not JSON: INVALID_ARGUMENT, then closed
    with connect(port, hello=False) as sock:
        sock.sendall(pw.frame(0, pw.HELLO, 0, b"\xff{"))
        _, flags, body = read_frame(sock)
        assert flags == pw.ERROR and body.startswith(b"INVALID_ARGUMENT\n")
        assert closed(sock)
    with connect(port) as sock:
        # an unknown method, a body too short for its client id, a client id longer than
        # the body: each answered, the connection goes on
        sock.sendall(pw.frame(2, 999, 0, pw.request_body(b"c", b"")))
        assert read_frame(sock) == (2, pw.ERROR, b"UNIMPLEMENTED\nunknown method 999")
        sock.sendall(pw.frame(3, pw.BY_NAME["SendMessage"].code, 0, b"\x00"))
        assert read_frame(sock)[2].startswith(b"INVALID_ARGUMENT\n")
        sock.sendall(pw.frame(4, pw.BY_NAME["SendMessage"].code, 0, struct.pack("!H", 500)))
        assert read_frame(sock)[2].startswith(b"INVALID_ARGUMENT\n")
        # a body that is not the method's message: the servicer's in-band BAD_REQUEST
        code = pw.BY_NAME["SendMessage"].code
        sock.sendall(pw.frame(5, code, 0, pw.request_body(b"c", b"\xff\xff\xff\xff")))
        request_id, flags, body = read_frame(sock)
        assert (request_id, flags) == (5, 0)
        assert service_pb2.SendMessageResponse.FromString(body).status.code == Code.BAD_REQUEST
        sock.sendall(request(6, "SendMessage", send_request("wire-bad", b"still")))
        request_id, flags, body = read_frame(sock)
        assert (request_id, flags) == (6, 0)
        assert service_pb2.SendMessageResponse.FromString(body).status.code == Code.OK
    # a frame over the server's limit: RESOURCE_EXHAUSTED, then closed
    with connect(port) as sock:
        sock.sendall(pw.HEADER.pack(0xFFFFFFF0, 8, 3, 0, 0))
        request_id, flags, body = read_frame(sock)
        assert (request_id, flags) == (8, pw.ERROR) and body.startswith(b"RESOURCE_EXHAUSTED\n")
        assert closed(sock)
    assert serves(port)
    assert server.alive()


def received(body: bytes) -> list[bytes]:
    reply = pw.BY_NAME["ReceiveMessages"].response.FromString(body)
    assert reply.status.code in (Code.OK, Code.MESSAGE_NOT_FOUND)
    return [m.body for m in reply.messages]


def test_a_waiting_call_goes_on_while_others_are_answered_and_can_be_cancelled(
    server: ServerProcess,
) -> None:
    """A call that never waits is answered in the turn its frame is read; one that waits
    (a long poll) goes on later, from where it stopped: others are answered meanwhile, an
    arrival wakes it with the message, and a CANCEL ends it (answered CANCELLED)."""
    topic, group = "wire-waiting", "wire-waiting-g"
    with connect(server.wire_port) as sock:
        sock.sendall(request(1, "SendMessage", send_request(topic, b"first")))
        assert read_frame(sock)[:2] == (1, 0)
        sock.sendall(request(2, "ReceiveMessages", receive_request(group, topic, poll_s=10)))
        request_id, flags, body = read_frame(sock)
        assert (request_id, flags) == (2, 0) and received(body) == [b"first"]
        # a long poll on the emptied queue waits; a send on the same connection is
        # answered meanwhile, and the poll, cancelled, ends as CANCELLED
        sock.sendall(request(3, "ReceiveMessages", receive_request(group, topic, poll_s=20)))
        sock.sendall(request(4, "SendMessage", send_request("wire-waiting-other", b"x")))
        assert read_frame(sock)[:2] == (4, 0)
        sock.sendall(pw.frame(3, pw.CANCEL, 0, b""))
        assert read_frame(sock) == (3, pw.ERROR, b"CANCELLED\nthe call was cancelled")
        # a second poll is woken by an arrival, with it
        sock.sendall(request(5, "ReceiveMessages", receive_request(group, topic, poll_s=20)))
        sock.sendall(request(6, "SendMessage", send_request(topic, b"second")))
        answers = {}
        for _ in range(2):
            request_id, flags, body = read_frame(sock)
            assert flags == 0, (request_id, body)
            answers[request_id] = body
        assert sorted(answers) == [5, 6]
        assert received(answers[5]) == [b"second"]
        assert service_pb2.SendMessageResponse.FromString(answers[6]).status.code == Code.OK
        sock.settimeout(1.5)  # and nothing more comes
        with pytest.raises(TimeoutError):
            read_frame(sock)
    assert server.alive()


def test_random_frames_never_break_the_server(server: ServerProcess) -> None:
    port = server.wire_port
    rng = random.Random(20261124)
    codes = [0, pw.CANCEL, 999, *(m.code for m in pw.METHODS)]
    for _ in range(25):
        with connect(port, hello=rng.random() < 0.8) as sock:
            sock.settimeout(0.3)
            data = bytearray()
            for request_id in range(rng.randint(1, 12)):
                kind = rng.random()
                if kind < 0.15:  # raw bytes
                    data += rng.randbytes(rng.randint(1, 64))
                    continue
                body = rng.randbytes(rng.randint(0, 200))
                if kind < 0.6:  # a client id, then random protobuf bytes
                    body = pw.request_body(b"fuzz", body)
                data += pw.frame(request_id + 1, rng.choice(codes), rng.randint(0, 3), body)
            sock.sendall(bytes(data))
            try:  # read what comes back until it closes or goes quiet
                while sock.recv(65536):
                    pass
            except (TimeoutError, ConnectionError):
                pass
    assert server.alive()
    assert serves(port)
    text = "".join(server.output)
    assert "Traceback" not in text, text[-3000:]


def test_a_sigkill_mid_flight_fails_pending_calls_and_loses_nothing_acknowledged(
    tmp_path: Path, client_home: Path
) -> None:
    server = ServerProcess(
        tmp_path / "store", client_home, *FAST, "--flush", "sync", "--wire-port", "0"
    ).start()
    topic, n = "wire-kill", 800
    results: dict[bytes, object] = {}
    lock = threading.Lock()
    acked = threading.Event()
    t = reliable.connect("grpc", endpoint=server.endpoint, wire="native", request_timeout_s=20)
    t.start()
    servers = [server]
    try:
        t.send(Message(topic, b"first"), t.route(topic).write_queues[0])
        assert t.stub.native is True  # type: ignore[attr-defined]
        queue = t.route(topic).write_queues[0]

        def done(body: bytes) -> Callable[[Any], None]:
            def finished(result: Any) -> None:
                with lock:
                    results[body] = result
                    if sum(1 for r in results.values() if isinstance(r, list)) >= 30:
                        acked.set()

            return finished

        for i in range(n):
            body = f"k-{i}".encode()
            t.submit_send(
                [Message(topic, body)], queue, producer_group=None, timeout_s=None, done=done(body)
            )
        assert acked.wait(60)
        server.kill()  # SIGKILL with calls in flight
        wait_until(lambda: len(results) == n, timeout=30, what="every call answered or failed")
        failed = [r for r in results.values() if not isinstance(r, list)]
        assert failed, "the kill came after every call was answered: nothing in flight"
        assert all(isinstance(r, TransportError) for r in failed), failed[:3]
        with pytest.raises(TransportError):  # the next call fails fast, as over gRPC
            t.send(Message(topic, b"after"), queue)
        # back on the same gRPC port, its wire on another port: the transport finds it
        again = ServerProcess(
            tmp_path / "store", client_home, *FAST, "--wire-port", "0", port=server.port
        ).start()
        servers.append(again)
        assert again.wire_port

        def resent() -> bool:
            try:
                t.send(Message(topic, b"after"), queue)
            except TransportError:
                return False
            return t.stub.native is True  # type: ignore[attr-defined]

        wait_until(resent, timeout=30, what="a send over the wire after the restart")
        t.close()
        # every acknowledged message is there
        stored = {b for b, r in results.items() if isinstance(r, list)}
        got: set[bytes] = set()
        with reliable.SimpleConsumer(
            "wire-kill-g",
            {topic: "*"},
            transport="grpc",
            endpoint=again.endpoint,
            await_duration_s=1,
            invisible_duration_s=30,
        ) as consumer:

            def everything() -> bool:
                for m in consumer.receive(32):
                    got.add(m.body)
                    consumer.ack(m)
                return stored <= got

            wait_until(everything, timeout=60, what="every acknowledged message")
    finally:
        t.close()
        for proc in servers:
            proc.kill()


def test_over_tls_the_wire_is_tls_with_the_grpc_certificate(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A TLS server opens its wire with the gRPC port's certificate: a transport with
    `tls=True` and the CA sends and receives over it (verified as its gRPC channel is);
    a plaintext connection, and a client trusting another certificate, get nothing."""
    cert, key = self_signed(tmp_path / "tls")
    other, _ = self_signed(tmp_path / "other")
    server = make_server("--wire-port", "0", "--tls-cert", str(cert), "--tls-key", str(key))
    assert server.wire_port
    options: dict[str, Any] = {"tls": True, "ca_file": str(cert), "wire": "native"}
    with Producer("grpc", endpoint=server.endpoint, **options) as producer:
        sent = [producer.send(Message("wire-tls", b"sealed-%d" % i)) for i in range(50)]
        assert producer._transport.stub.native is True  # type: ignore[attr-defined]
        futures = [producer.send_async(Message("wire-tls", b"async-%d" % i)) for i in range(200)]
        sent += [f.result(30) for f in futures]
    got: set[bytes] = set()
    with reliable.SimpleConsumer(
        "g-wire-tls",
        {"wire-tls": "*"},
        transport="grpc",
        endpoint=server.endpoint,
        await_duration_s=1.0,
        **options,
    ) as consumer:
        assert consumer._transport.stub.native is True  # type: ignore[attr-defined]

        def everything() -> bool:
            for m in consumer.receive(64):
                got.add(m.body)
                consumer.ack(m)
            return len(got) >= len(sent)

        wait_until(everything, timeout=60, what="every message sent over TLS")
    assert len(got) == len(sent) == 250
    # a plaintext HELLO on the TLS port is never answered as a frame
    with socket.create_connection(("127.0.0.1", server.wire_port), timeout=10) as sock:
        sock.sendall(pw.frame(0, pw.HELLO, 0, HELLO))
        with pytest.raises((ConnectionError, OSError, ValueError)):
            read_frame(sock)
    # a client that does not trust the server's certificate sends nothing over the wire
    channel = WireChannel("127.0.0.1", server.wire_port, tls=client_context(str(other)))
    try:
        with pytest.raises(WireRpcError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify"):
            channel.call(pw.BY_NAME["SendMessage"], send_request("wire-tls", b"no"), 10, ())
    finally:
        channel.close()


@pytest.mark.parametrize("server_us, client_us", [(0, 0), (200, 200), (0, 5_000)])
def test_idle_polling_on_either_side_serves_every_call(
    tmp_path: Path, server_us: int, client_us: int
) -> None:
    """The server's loop polls its selector (or not) and the client polls for its answer
    (or not): every send one at a time is stored and received once, in order."""
    broker = Broker(StoreConfig(store_dir=tmp_path, mapped_file_size_commitlog=8 << 20))
    broker.start()
    served = MessagingServer(broker, ServerConfig(port=0, wire_port=0, idle_poll_us=server_us))
    served.start()
    try:
        selector = served._loop._selector  # type: ignore[union-attr]
        assert selector.idle.max_ns == server_us * 1000
        endpoint = f"127.0.0.1:{served.port}"
        with Producer("grpc", endpoint=endpoint, wire="native", idle_poll_us=client_us) as producer:
            sent = [producer.send(Message("idle-poll", b"%d" % i)).message_id for i in range(200)]
            assert producer._transport.stub.native is True  # type: ignore[attr-defined]
        t = reliable.connect("grpc", endpoint=endpoint, wire="native", idle_poll_us=client_us)
        t.start()
        try:
            with reliable.SimpleConsumer(
                "idle-poll-g", {"idle-poll": "*"}, transport=t, await_duration_s=1
            ) as consumer:
                bodies: list[bytes] = []
                ids: list[str] = []
                while len(bodies) < 200:
                    batch = consumer.receive(max_messages=32)
                    assert batch, f"only {len(bodies)} of 200 received"
                    for m in batch:
                        bodies.append(m.body)
                        ids.append(m.message_id)
                        consumer.ack(m)
        finally:
            t.close()
        assert sorted(ids) == sorted(sent)
        assert sorted(bodies, key=int) == [b"%d" % i for i in range(200)]
    finally:
        served.stop()
        broker.shutdown()


def test_an_idle_poll_bound_out_of_range_is_refused_everywhere(tmp_path: Path) -> None:
    """By the client at construction, by the server at start, by the CLI before it opens
    the store."""
    from reliable.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="idle_poll_us"):
        reliable.connect("grpc", endpoint="127.0.0.1:1", idle_poll_us=-1)
    broker = Broker(StoreConfig(store_dir=tmp_path / "own", mapped_file_size_commitlog=8 << 20))
    try:
        with pytest.raises(ServerStartError, match="idle poll"):
            MessagingServer(broker, ServerConfig(port=0, idle_poll_us=200_000)).start()
    finally:
        broker.shutdown()
    done = cli(
        "broker", "start", "--store", str(tmp_path / "store"), "--port", "0", "--idle-poll-us", "-1"
    )
    assert done.returncode == 2, done.stderr
    assert "--idle-poll-us" in done.stderr
    assert not (tmp_path / "store").exists()


def test_a_lone_durable_send_is_fsynced_and_answered_in_the_turn_that_read_it(
    tmp_path: Path,
) -> None:
    """Under sync flush, a send over the wire that was all its loop turn woke for (one
    client, one call at a time) is fsynced on the loop and answered in that turn: the
    loop then selects twice a send (the wait that reads it, the poll that writes its
    answer), as under async flush, where a turn given to calls that might come with it and
    the turns of a resumed call made it four. Two sends in one write are not alone: they
    share one fsync."""
    from broker.store.config import FlushMode
    from broker.store.flush import GroupCommitService

    broker = Broker(
        StoreConfig(
            store_dir=tmp_path,
            mapped_file_size_commitlog=8 << 20,
            flush_mode=FlushMode.SYNC_FLUSH,
        )
    )
    broker.start()
    served = MessagingServer(broker, ServerConfig(port=0, wire_port=0, idle_poll_us=0))
    served.start()
    flusher = broker.store.commitlog.flush_service
    assert isinstance(flusher, GroupCommitService)
    loop = served._loop
    assert loop is not None
    selector: Any = loop._selector  # type: ignore[attr-defined]
    selects = [0]
    select = selector.select

    def counted(timeout: float | None = None) -> Any:
        selects[0] += 1
        return select(timeout)

    try:
        endpoint = f"127.0.0.1:{served.port}"
        with Producer("grpc", endpoint=endpoint, wire="native", idle_poll_us=0) as producer:
            for i in range(20):  # route, topic, connection: out of the count
                producer.send(Message("lone-durable", b"warm %d" % i))
            assert producer._transport.stub.native is True  # type: ignore[attr-defined]
            selector.select = counted
            fsyncs = flusher.fsync_count
            n = 200
            for i in range(n):
                producer.send(Message("lone-durable", b"%d" % i))
                assert flusher.flushed_where >= broker.store.commitlog.get_max_offset()
            made = selects[0]
            assert flusher.fsync_count - fsyncs == n  # one fsync each: each came alone
        # the old path made 4 selects a send; a timer's turn now and then is allowed for
        assert made <= 2.5 * n, f"{made} loop turns for {n} sends"

        sock = connect(served.wire_port)
        try:
            fsyncs = flusher.fsync_count
            code = pw.BY_NAME["SendMessage"].code
            two = b"".join(
                pw.frame(
                    k,
                    code,
                    0,
                    pw.request_body(b"two-in-one", send_request(t, b).SerializeToString()),
                )
                for k, t, b in ((1, "lone-durable", b"a"), (2, "lone-durable", b"b"))
            )
            sock.sendall(two)  # one write: one read, one turn
            answers = [read_frame(sock) for _ in range(2)]
            assert sorted(a[0] for a in answers) == [1, 2]
            for _, flags, body in answers:
                assert flags == 0, body
                assert service_pb2.SendMessageResponse.FromString(body).status.code == Code.OK
            assert flusher.fsync_count - fsyncs == 1  # together: one fsync for both
        finally:
            sock.close()
    finally:
        selector.select = select
        served.stop()
        broker.shutdown()
