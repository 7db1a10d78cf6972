"""The gateway itself: merged calls answered one by one, exactly as the broker answers each
alone; signatures; a killed gateway and a killed broker lose nothing and store nothing
twice; a cancelled long poll lets its messages go; TLS; the command line.

Each merged-call test issues its calls at once (grpc futures on one channel), so they
queue together in the gateway and leave as merged requests; the gateway's exit line says
how many were merged, and the tests check that some were (a test whose calls were never
merged would prove nothing)."""

from __future__ import annotations

import json
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

import reliable
from bench._tls import self_signed
from broker.server.codes import Code
from protocol.pb import service_pb2, service_pb2_grpc
from tests.e2e.grpc import official
from tests.e2e.grpc.gateway_process import GatewayProcess
from tests.e2e.grpc.server_process import ServerProcess, cli, stored_records
from tests.e2e.grpc.test_batched_rpcs import receive_all, receive_request

MD = (("x-mq-client-id", "gateway-test"),)
_STOPPED = re.compile(r"(\d+) merged requests carried (\d+) of them, (\d+) sent again alone")


def merged_counts(gateway: GatewayProcess) -> tuple[int, int, int]:
    """(merged requests, calls in them, calls sent again alone), from the exit line of a
    stopped gateway."""
    assert gateway.terminate() == 0, "".join(gateway.output)
    for line in gateway.output:
        m = _STOPPED.search(line)
        if m:
            return int(m.group(1)), int(m.group(2)), int(m.group(3))
    raise AssertionError("no exit line:\n" + "".join(gateway.output))


def message(topic: str, body: bytes, message_id: str | None = None) -> Any:
    m = service_pb2.SendMessageRequest().messages.add()
    m.topic.name = topic
    m.body = body
    m.system_properties.message_id = message_id or uuid.uuid4().hex.upper()
    m.system_properties.message_type = 1
    m.system_properties.body_encoding = 1
    m.system_properties.born_host = "127.0.0.1"
    m.system_properties.born_timestamp.GetCurrentTime()
    return m


def send_request(*messages: Any) -> Any:
    request = service_pb2.SendMessageRequest()
    request.messages.extend(messages)
    return request


def ack_request(group: str, topic: str, message_id: str, handle: str) -> Any:
    request = service_pb2.AckMessageRequest()
    request.group.name, request.topic.name = group, topic
    entry = request.entries.add()
    entry.message_id, entry.receipt_handle = message_id, handle
    return request


@pytest.fixture
def own_gateway(broker: ServerProcess) -> Iterator[GatewayProcess]:
    """A gateway of the test's own, stopped by the test to read its exit line; its sends
    and acks wait 50 ms for others (the calls issued together share requests however
    slowly this machine issues them)."""
    proc = GatewayProcess(broker.endpoint, "--linger", "50ms").start()
    yield proc
    proc.kill()


@pytest.fixture
def stubs(broker: ServerProcess, own_gateway: GatewayProcess) -> Iterator[tuple[Any, Any]]:
    """(a stub of the broker's own gRPC port, a stub of the gateway)."""
    direct = grpc.insecure_channel(broker.endpoint)
    front = grpc.insecure_channel(own_gateway.endpoint)
    yield (
        service_pb2_grpc.MessagingServiceStub(direct),
        service_pb2_grpc.MessagingServiceStub(front),
    )
    direct.close()
    front.close()


def all_at_once(call: Any, requests: list[Any]) -> list[Any]:
    futures = [call.future(r, metadata=MD, timeout=30) for r in requests]
    return [f.result() for f in futures]


def outcome(reply: Any) -> tuple[int, list[int]]:
    return reply.status.code, [e.status.code for e in reply.entries]


def test_merged_sends_are_answered_each_as_the_broker_answers_it_alone(
    stubs: tuple[Any, Any], own_gateway: GatewayProcess, broker: ServerProcess
) -> None:
    direct, front = stubs
    shared_id = uuid.uuid4().hex.upper()

    def requests(topic: str, again_id: str) -> list[Any]:
        """Good sends, an empty body, a bad topic, a bad message id, a send of two, and a
        resend of one message id, in a fixed order."""
        made = []
        for i in range(48):
            if i % 12 == 3:
                made.append(send_request(message(topic, b"")))
            elif i % 12 == 5:
                made.append(send_request(message("bad topic!", b"x")))
            elif i % 12 == 7:
                made.append(send_request(message(topic, b"x", message_id="x" * 200)))
            elif i % 12 == 9:
                made.append(send_request(message(topic, b"a"), message(topic, b"")))
            elif i in (10, 11):
                made.append(send_request(message(topic, b"again", message_id=again_id)))
            else:
                made.append(send_request(message(topic, f"m{i}".encode())))
        return made

    alone = [
        direct.SendMessage(r, metadata=MD, timeout=30)
        for r in requests("gw-m-d", uuid.uuid4().hex.upper())
    ]
    together = all_at_once(front.SendMessage, requests("gw-m-g", shared_id))
    assert [outcome(r) for r in together] == [outcome(r) for r in alone]
    assert together[10].entries[0].offset == together[11].entries[0].offset  # stored once
    # every message that was answered OK is stored once, and nothing else
    wanted = {e.message_id for r in together for e in r.entries if e.status.code == Code.OK}
    assert len(wanted) == 48 - 4 * 3 - 1  # 4 each of three bad sends; the resend
    stored = sorted(m.msg_id for m in stored_records(broker.store) if m.topic == "gw-m-g")
    assert stored == sorted(wanted)
    merged, members, alone_again = merged_counts(own_gateway)
    assert merged > 0 and members > merged, (merged, members)
    assert alone_again == 0


def test_merged_acks_settle_each_message_and_a_refused_request_is_answered_alone(
    stubs: tuple[Any, Any], own_gateway: GatewayProcess
) -> None:
    direct, front = stubs
    topic, group = "gw-acks", "gw-acks-g"
    front.SendMessage(
        send_request(*(message(topic, f"m{i}".encode()) for i in range(40))),
        metadata=MD,
        timeout=10,
    )
    got = receive_all(front, group, topic, 40)
    assert len(got) == 40
    acks = [
        ack_request(
            group, topic, m.system_properties.message_id, m.system_properties.receipt_handle
        )
        for m in got
    ]
    acks[5] = ack_request(group, topic, "00", "not-a-handle")  # fails alone
    replies = all_at_once(front.AckMessage, acks)
    codes = [r.status.code for r in replies]
    assert codes == [Code.INVALID_RECEIPT_HANDLE if i == 5 else Code.OK for i in range(40)]
    assert [r.entries[0].receipt_handle for r in replies] == [
        a.entries[0].receipt_handle for a in acks
    ]
    # acknowledged: nothing comes back after the invisible time (30 s: the handle of the
    # one left unacknowledged is still held)
    assert receive_all(front, group, topic, 1, within_s=3) == []
    # a whole request refused (a bad group name): each call gets the broker's own answer
    bad = [ack_request("bad group!", topic, "00", f"h{i}") for i in range(24)]
    expected = outcome(direct.AckMessage(bad[0], metadata=MD, timeout=10))
    assert expected[0] != Code.OK
    assert [outcome(r) for r in all_at_once(front.AckMessage, bad)] == [expected] * 24
    merged, _, alone_again = merged_counts(own_gateway)
    assert merged > 0
    assert alone_again > 0  # the refused merged requests, each call sent again alone


def test_the_framework_over_grpc_through_the_gateway(gateway: GatewayProcess) -> None:
    """The framework's own transport pinned to gRPC: its batch receive
    (`reliable.v1.BatchMessaging/ReceiveMessages`) and batched acks pass over the wire."""
    topic, group = "gw-framework", "gw-framework-g"
    with reliable.SimpleConsumer(
        group,
        {topic: None},
        transport="grpc",
        endpoint=gateway.endpoint,
        wire="grpc",
        await_duration_s=1,
    ) as consumer:
        with reliable.Producer("grpc", endpoint=gateway.endpoint, wire="grpc") as producer:
            sent = {
                producer.send(reliable.Message(topic, f"m{i}".encode())).message_id
                for i in range(300)
            }
        got: list[str] = []
        deadline = time.monotonic() + 30
        while len(got) < 300 and time.monotonic() < deadline:
            for m in consumer.receive(32):
                got.append(m.message_id)
                consumer.ack(m)
        assert sorted(got) == sorted(sent)  # each once
        assert consumer.receive(32) == []


def _voluntary_switches(pid: int) -> int:
    """Every thread's voluntary context switches so far (`/proc/<pid>/task/*/status`)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # a thread that ended meanwhile
            continue
        total += int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M)[1])  # type: ignore[index]
    return total


def test_calls_one_at_a_time_do_not_wake_the_go_runtime_monitor(broker: ServerProcess) -> None:
    """Idle between two calls, the gateway's Go runtime monitor used to sleep deeply and be
    woken by the next call's first system call (reliable_cli.gateway.QUIET_MONITOR).
    Started by `reliable gateway start`, it is kept from that sleep. On one core
    (`--procs 1`, as the bench runs it) that is about two voluntary context switches a
    call (the request's arrival and the broker's answer) where it was about six."""
    front = GatewayProcess(broker.endpoint, "--procs", "1").start()
    try:
        assert front.proc is not None
        pid = front.proc.pid  # the launcher execs the gateway: its pid
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert any(e.startswith(b"GODEBUG=schedtrace=") for e in environ), environ
        calls = 600
        with reliable.Producer("grpc", endpoint=front.endpoint, wire="grpc") as producer:
            for i in range(50):  # the channel, the route, the runtime settled
                producer.send(reliable.Message("gw-monitor", f"warm{i}".encode()))
            before = _voluntary_switches(pid)
            for i in range(calls):
                producer.send(reliable.Message("gw-monitor", f"m{i}".encode()))
            after = _voluntary_switches(pid)
        # measured: 5.9 a call with the deep sleep (GODEBUG=schedtrace=0), 2.1 without
        assert (after - before) / calls < 4, (after - before) / calls
    finally:
        assert front.terminate() == 0, "".join(front.output)


def test_a_cancelled_long_poll_lets_its_messages_go(gateway: GatewayProcess) -> None:
    channel = grpc.insecure_channel(gateway.endpoint)
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    topic, group = "gw-cancel", "gw-cancel-g"
    try:
        receive_all(stub, group, topic, 0)  # the group exists
        request = receive_request(group, topic, invisible_s=60, poll_s=20)
        parked = stub.ReceiveMessage(request, metadata=MD, timeout=30)
        time.sleep(0.5)  # parked in the broker
        parked.cancel()
        stub.SendMessage(send_request(message(topic, b"after")), metadata=MD, timeout=10)
        # had the cancelled receive taken it, it would stay invisible for 60 s
        got = receive_all(stub, group, topic, 1, within_s=10)
        assert [m.body for m in got] == [b"after"]
    finally:
        channel.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def send_until_acknowledged(
    stub: Any, topic: str, ids: list[str], deadline_s: float
) -> tuple[set[str], int]:
    """Send every id (concurrently), resending the ones not acknowledged by the same id
    until all are, as a client does: the ids acknowledged and how many calls failed."""
    left, failures = list(ids), 0
    deadline = time.monotonic() + deadline_s
    while left and time.monotonic() < deadline:
        futures = [
            (
                i,
                stub.SendMessage.future(
                    send_request(message(topic, i.encode(), i)), metadata=MD, timeout=5
                ),
            )
            for i in left
        ]
        left = []
        for i, f in futures:
            try:
                reply = f.result()
                if reply.status.code != Code.OK:
                    left.append(i)
            except grpc.RpcError:
                failures += 1
                left.append(i)
        if left:
            time.sleep(0.2)
    return set(ids) - set(left), failures


def test_a_killed_gateway_and_a_killed_broker_lose_nothing_and_store_nothing_twice(
    make_server: Callable[..., ServerProcess],
) -> None:
    wire = free_port()
    broker = make_server("--wire-port", str(wire))
    port = free_port()
    front = GatewayProcess(broker.endpoint, port=port).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    topic = "gw-kills"
    ids = [uuid.uuid4().hex.upper() for _ in range(600)]
    try:
        # the gateway killed while 200 sends are in flight, started again on its port
        futures = [
            stub.SendMessage.future(
                send_request(message(topic, i.encode(), i)), metadata=MD, timeout=5
            )
            for i in ids[:200]
        ]
        front.kill()
        for f in futures:
            f.exception()  # each answered or failed: the client resends the failed ones
        front = GatewayProcess(broker.endpoint, port=port).start()
        done, _ = send_until_acknowledged(stub, topic, ids[:300], 60)
        assert done == set(ids[:300])
        # the broker killed behind the gateway, started again on its ports: the gateway
        # dials it again for the next call
        futures = [
            stub.SendMessage.future(
                send_request(message(topic, i.encode(), i)), metadata=MD, timeout=5
            )
            for i in ids[300:]
        ]
        broker.kill()
        for f in futures:
            f.exception()
        broker.start()  # its port and wire port as before
        done, _ = send_until_acknowledged(stub, topic, ids[300:], 60)
        assert done == set(ids[300:])
    finally:
        channel.close()
        front.kill()
    broker.terminate()
    stored = [m.msg_id for m in stored_records(broker.store) if m.topic == topic]
    assert sorted(stored) == sorted(ids)  # each once: none lost, none stored twice


def test_signatures_hold_through_the_gateway(
    tmp_path: Path, make_server: Callable[..., ServerProcess]
) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"app-key": "app-secret"}))
    broker = make_server("--credentials-file", str(keys), "--wire-port", "0")
    # the broker tells its wire port only to a signed caller: the gateway is told
    refused = cli("gateway", "start", "--broker", broker.endpoint, "--listen", "127.0.0.1:0")
    assert refused.returncode == 2
    assert "name it with --wire" in refused.stderr
    front = GatewayProcess(broker.endpoint, "--wire", f"127.0.0.1:{broker.wire_port}").start()
    try:
        producer = official.producer(front.endpoint, ["gw-auth"], ak="app-key", sk="app-secret")
        consumer = official.simple_consumer(
            front.endpoint, "gw-auth-g", "gw-auth", ak="app-key", sk="app-secret"
        )
        try:
            mid = producer.send(official.message("gw-auth", b"signed")).message_id
            got = official.receive_until(consumer, lambda g: len(g) >= 1)
            assert [m.message_id for m in got] == [mid]
            # a wrong secret is refused with the broker's own status (its gRPC port's and
            # the gateway's alike), and the signed client's calls go on
            for endpoint in (broker.endpoint, front.endpoint):
                t = reliable.connect(
                    "grpc", endpoint=endpoint, access_key="app-key", secret_key="wrong", wire="grpc"
                )
                t.start()
                try:
                    with pytest.raises(reliable.BrokerCallError) as info:
                        t.route("gw-auth")
                    assert info.value.code == "UNAUTHORIZED"
                finally:
                    t.close()
            again = producer.send(official.message("gw-auth", b"still")).message_id
            got = official.receive_until(consumer, lambda g: len(g) >= 1)
            assert [m.message_id for m in got] == [again]
        finally:
            producer.shutdown()
            consumer.shutdown()
    finally:
        front.kill()


@pytest.mark.parametrize("behind", ["plain", "tls"])
def test_tls_in_front_and_behind(
    tmp_path: Path, broker: ServerProcess, make_server: Callable[..., ServerProcess], behind: str
) -> None:
    """TLS to the gateway; and behind it, to a broker serving TLS (gRPC and its wire with
    the same certificate), trusted with --broker-ca."""
    cert, key = self_signed(tmp_path)
    upstream, extra = broker, ()
    if behind == "tls":
        upstream = make_server("--tls-cert", str(cert), "--tls-key", str(key), "--wire-port", "0")
        extra = ("--broker-ca", str(cert))
    front = GatewayProcess(
        upstream.endpoint, "--tls-cert", str(cert), "--tls-key", str(key), *extra
    ).start()
    try:
        credentials = grpc.ssl_channel_credentials(cert.read_bytes())
        with grpc.secure_channel(front.endpoint, credentials) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            topic = f"gw-tls-{behind}"
            reply = stub.SendMessage(
                send_request(message(topic, b"secret")), metadata=MD, timeout=10
            )
            assert reply.status.code == Code.OK
            assert [m.body for m in receive_all(stub, f"{topic}-g", topic, 1)] == [b"secret"]
        with grpc.insecure_channel(front.endpoint) as plain, pytest.raises(grpc.RpcError):
            service_pb2_grpc.MessagingServiceStub(plain).SendMessage(
                send_request(message(f"gw-tls-{behind}", b"plain")), metadata=MD, timeout=3
            )
    finally:
        front.kill()


def test_the_command_line(make_server: Callable[..., ServerProcess]) -> None:
    shown = cli("gateway", "start", "--help")
    assert shown.returncode == 0 and "--broker" in shown.stdout
    assert cli("gateway", "start").returncode == 2  # --broker is required
    built = cli("gateway", "build")
    assert built.returncode == 0 and Path(built.stdout.strip()).is_file()
    no_wire = make_server("--wire-port", "off")
    refused = cli("gateway", "start", "--broker", no_wire.endpoint, "--listen", "127.0.0.1:0")
    assert refused.returncode == 2
    assert "serves no native wire" in refused.stderr
