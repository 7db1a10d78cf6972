"""Hostile clients against a real server process: bounded memory, clear refusals, quiet logs.

- a client that writes Telemetry commands and never reads is cut off, memory stays flat;
- the send de-duplication cache costs bytes per send, not the message's properties;
- out-of-range times and numbers are BAD_REQUEST (or the protocol's code), no traceback;
- undecodable bodies are refused in-band, after the signature check, with one log line;
- with access keys, a client id belongs to its key: a stranger cannot end its session.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.server.codes import Code
from protocol import signing as auth
from protocol.pb import service_pb2, service_pb2_grpc
from tests.e2e.grpc.conftest import FAST
from tests.e2e.grpc.server_process import ServerProcess

SERVICE = "/apache.rocketmq.v2.MessagingService/"
KEYS = {"owner-key": "owner-secret", "stranger-key": "stranger-secret"}


def memory_kb(pid: int, field: str = "RssAnon") -> int:
    """A /proc/<pid>/status memory figure in KiB (anonymous memory: not the store's mmaps)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} missing from /proc/{pid}/status")


def md(client_id: str) -> list[tuple[str, str]]:
    return [("x-mq-client-id", client_id)]


def signed(client_id: str, access_key: str | None = None) -> list[tuple[str, str]]:
    """Metadata signed the way RocketMQ 5 clients sign (MQv2-HMAC-SHA1 over the date)."""
    if access_key is None:
        return md(client_id)
    date_time = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    signature = auth.sign(KEYS[access_key], date_time)
    return [
        ("x-mq-client-id", client_id),
        ("x-mq-date-time", date_time),
        (
            "authorization",
            f"{auth.ALGORITHM} Credential={access_key}, "
            f"SignedHeaders=x-mq-date-time, Signature={signature}",
        ),
    ]


def log_of(server: ServerProcess) -> str:
    return "".join(server.output)


def settings_command(group: str, topic: str) -> Any:
    command = service_pb2.TelemetryCommand()
    command.settings.client_type = 3  # simple consumer
    command.settings.subscription.group.name = group
    entry = command.settings.subscription.subscriptions.add()
    entry.topic.name, entry.expression.type, entry.expression.expression = topic, 1, "*"
    return command


def send_request(
    topic: str,
    body: bytes = b"x",
    message_id: str | None = None,
    properties: dict[str, str] | None = None,
) -> Any:
    request = service_pb2.SendMessageRequest()
    message = request.messages.add()
    message.topic.name = topic
    message.body = body
    message.system_properties.message_id = message_id or uuid.uuid4().hex.upper()
    message.system_properties.message_type = 1
    message.user_properties.update(properties or {})
    return request


def receive_request(group: str, topic: str, *, auto_renew: bool = False, poll_s: int = 1) -> Any:
    request = service_pb2.ReceiveMessageRequest(batch_size=8, auto_renew=auto_renew)
    request.group.name = group
    request.message_queue.topic.name = topic
    request.filter_expression.type, request.filter_expression.expression = 1, "*"
    if not auto_renew:
        request.invisible_duration.seconds = 15
    request.long_polling_timeout.seconds = poll_s
    return request


def wait_for(predicate: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[Any]:
    channel = grpc.insecure_channel(server.endpoint)
    yield service_pb2_grpc.MessagingServiceStub(channel)
    channel.close()


# --- Telemetry replies that are never read -------------------------------------------------
def test_client_that_never_reads_telemetry_is_cut_off(
    make_server: Callable[..., ServerProcess],
) -> None:
    server = make_server()
    assert server.proc is not None
    pid = server.proc.pid
    channel = grpc.insecure_channel(server.endpoint)
    telemetry = channel.stream_stream(SERVICE + "Telemetry")  # raw bytes both ways
    raw = settings_command("g-hog", "t-hog").SerializeToString()
    commands = 40_000  # unbounded, this cost the server ~70 MB
    written = threading.Event()

    def requests() -> Iterator[bytes]:
        for _ in range(commands):
            yield raw
        written.set()
        time.sleep(60)  # keep the stream open, as a stuck client would

    try:
        before = memory_kb(pid)
        call = telemetry(requests(), metadata=md("telemetry-hog"), timeout=120)
        assert written.wait(60), "the server stopped taking commands"
        assert wait_for(
            lambda: (
                "left unread" in log_of(server) or "replies are waiting unread" in log_of(server)
            )
        )
        time.sleep(1.0)
        grown_mb = (memory_kb(pid) - before) / 1024
        assert grown_mb < 20, f"server memory grew {grown_mb:.0f} MB"
        # the stream is over: what was sent before the cut arrives, then the final status
        replies = 0
        with pytest.raises(grpc.RpcError) as info:
            for _ in call:
                replies += 1
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert replies <= 64 + 2_000  # the queue bound plus what the HTTP/2 window held
        # logged once, no traceback; the client may reconnect at once
        assert log_of(server).count("replies are waiting unread") == 1
        assert "Traceback" not in log_of(server)
        again = telemetry(iter([raw]), metadata=md("telemetry-hog"), timeout=10)
        assert service_pb2.TelemetryCommand.FromString(next(again)).status.code == Code.OK
        again.cancel()
    finally:
        channel.close()
    assert server.alive()


# --- the send de-duplication cache ----------------------------------------------------------
def test_dedupe_cache_costs_bytes_not_properties(make_server: Callable[..., ServerProcess]) -> None:
    server = make_server()
    assert server.proc is not None
    channel = grpc.insecure_channel(server.endpoint)
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    # 15 KiB of user properties per message: a cache that kept them cost ~38 KB a send
    properties = {f"p{i:02d}": chr(ord("a") + i) * 1000 for i in range(15)}
    try:
        first = stub.SendMessage(
            send_request("t-dedupe", message_id="DEDUPE-FIRST", properties=properties),
            metadata=md("dedupe"),
            timeout=10,
        )
        assert first.status.code == Code.OK
        before = memory_kb(server.proc.pid)
        for batch in range(250):
            request = service_pb2.SendMessageRequest()
            for i in range(16):
                message = send_request(
                    "t-dedupe", message_id=f"DEDUPE-{batch}-{i}", properties=properties
                ).messages[0]
                request.messages.append(message)
            reply = stub.SendMessage(request, metadata=md("dedupe"), timeout=30)
            assert reply.status.code == Code.OK, reply.status
        grown_mb = (memory_kb(server.proc.pid) - before) / 1024
        # 4,000 sends: ~75 MB more when every entry held its properties
        assert grown_mb < 25, f"server memory grew {grown_mb:.0f} MB over 4,000 sends"
        # still idempotent: the same send again gets the first result, not a second copy
        again = stub.SendMessage(
            send_request("t-dedupe", message_id="DEDUPE-FIRST", properties=properties),
            metadata=md("dedupe"),
            timeout=10,
        )
        assert again.entries[0].offset == first.entries[0].offset
        # other user properties: a deliberate new copy, stored
        other = stub.SendMessage(
            send_request(
                "t-dedupe", message_id="DEDUPE-FIRST", properties={**properties, "n": "2"}
            ),
            metadata=md("dedupe"),
            timeout=10,
        )
        assert other.status.code == Code.OK
        assert other.entries[0].offset != first.entries[0].offset
    finally:
        channel.close()


# --- numeric ranges -------------------------------------------------------------------------
def _send_code(stub: Any, mutate: Callable[[Any], None]) -> int:
    request = send_request("t-ranges")
    mutate(request.messages[0].system_properties)
    reply = stub.SendMessage(request, metadata=md("ranges"), timeout=10)
    return int(reply.status.code)


def _first_receive_code(stub: Any, mutate: Callable[[Any], None]) -> int:
    request = receive_request("g-ranges", "t-ranges")
    mutate(request)
    replies = list(stub.ReceiveMessage(request, metadata=md("ranges"), timeout=10))
    assert replies[-1].HasField("delivery_timestamp")
    return int(replies[0].status.code)


def test_out_of_range_numbers_are_bad_requests(server: ServerProcess, stub: Any) -> None:
    def born(seconds: int, nanos: int = 0) -> Callable[[Any], None]:
        def mutate(sp: Any) -> None:
            sp.born_timestamp.seconds, sp.born_timestamp.nanos = seconds, nanos

        return mutate

    def deliver(seconds: int) -> Callable[[Any], None]:
        def mutate(sp: Any) -> None:
            sp.message_type = 3
            sp.delivery_timestamp.seconds = seconds

        return mutate

    # the reported case: a huge born timestamp was INTERNAL_ERROR with a traceback
    assert _send_code(stub, born(2**62)) == Code.BAD_REQUEST
    assert _send_code(stub, born(-1)) == Code.BAD_REQUEST
    assert _send_code(stub, born(int(time.time()), 2_000_000_000)) == Code.BAD_REQUEST
    assert _send_code(stub, born(-(2**63))) == Code.BAD_REQUEST
    assert _send_code(stub, deliver(2**62)) == Code.BAD_REQUEST
    assert _send_code(stub, deliver(-(2**40))) == Code.BAD_REQUEST
    assert _send_code(stub, born(int(time.time()))) == Code.OK  # a sane one still goes

    def message_type(number: int) -> Callable[[Any], None]:
        def mutate(sp: Any) -> None:
            sp.message_type = number

        return mutate

    assert _send_code(stub, message_type(5)) == Code.BAD_REQUEST  # LITE: not served
    assert _send_code(stub, message_type(2**31 - 1)) == Code.BAD_REQUEST
    assert (
        stub.Heartbeat(
            service_pb2.HeartbeatRequest(client_type=77), metadata=md("ranges"), timeout=5
        ).status.code
        == Code.UNRECOGNIZED_CLIENT_TYPE
    )

    def invisible(seconds: int, nanos: int = 0) -> Callable[[Any], None]:
        def mutate(request: Any) -> None:
            request.invisible_duration.seconds = seconds
            request.invisible_duration.nanos = nanos

        return mutate

    def polling(seconds: int, nanos: int = 0) -> Callable[[Any], None]:
        def mutate(request: Any) -> None:
            request.long_polling_timeout.seconds = seconds
            request.long_polling_timeout.nanos = nanos

        return mutate

    assert _first_receive_code(stub, invisible(2**62)) == Code.BAD_REQUEST
    assert _first_receive_code(stub, invisible(10**11)) == Code.ILLEGAL_INVISIBLE_TIME
    assert _first_receive_code(stub, invisible(-5, 0)) == Code.ILLEGAL_INVISIBLE_TIME
    assert _first_receive_code(stub, invisible(5, -3)) == Code.BAD_REQUEST  # mixed signs
    assert _first_receive_code(stub, polling(2**62)) == Code.BAD_REQUEST
    assert _first_receive_code(stub, polling(-1, 5)) == Code.BAD_REQUEST

    def batch(size: int) -> Callable[[Any], None]:
        def mutate(request: Any) -> None:
            request.batch_size = size

        return mutate

    assert _first_receive_code(stub, batch(-(2**31))) == Code.BAD_REQUEST

    change = service_pb2.ChangeInvisibleDurationRequest(receipt_handle="x", message_id="ID")
    change.group.name, change.topic.name = "g-ranges", "t-ranges"
    change.invisible_duration.seconds = 2**62
    assert (
        stub.ChangeInvisibleDuration(change, metadata=md("ranges"), timeout=5).status.code
        == Code.BAD_REQUEST
    )
    query = service_pb2.QueryOffsetRequest(query_offset_policy=2)  # TIMESTAMP
    query.message_queue.topic.name, query.message_queue.id = "t-ranges", 0
    query.timestamp.seconds = 2**62
    assert stub.QueryOffset(query, metadata=md("ranges"), timeout=5).status.code == Code.BAD_REQUEST
    query.message_queue.id = 2**31 - 1
    assert (
        stub.QueryOffset(query, metadata=md("ranges"), timeout=5).status.code == Code.ILLEGAL_OFFSET
    )
    route = service_pb2.QueryRouteRequest()
    route.topic.name = "t-ranges"
    address = route.endpoints.addresses.add()
    address.host, address.port = "127.0.0.1", 2**31 - 1
    assert stub.QueryRoute(route, metadata=md("ranges"), timeout=5).status.code == Code.BAD_REQUEST
    settings = settings_command("g-ranges", "t-ranges")
    settings.settings.subscription.long_polling_timeout.seconds = 2**62
    reply = next(stub.Telemetry(iter([settings]), metadata=md("ranges-tele"), timeout=10))
    assert reply.status.code == Code.BAD_REQUEST
    # none of it was a surprise to the server: no traceback, nothing "unexpected"
    assert "Traceback" not in log_of(server)
    assert "unexpected error" not in log_of(server)


# --- undecodable bodies ---------------------------------------------------------------------
GARBAGE = b"\xff\xff\xff\xff\x0f garbage"


def _hammer_with_garbage(
    channel: grpc.Channel, metadata: list[tuple[str, str]], times: int
) -> set[int]:
    """Undecodable bodies on a unary, a server-streaming and the bidi RPC; the codes seen."""
    codes: set[int] = set()
    unary = {
        "SendMessage": service_pb2.SendMessageResponse,
        "AckMessage": service_pb2.AckMessageResponse,
        "UpdateOffset": service_pb2.UpdateOffsetResponse,
    }
    for method, response in unary.items():
        call = channel.unary_unary(SERVICE + method)
        for _ in range(times):
            codes.add(
                int(response.FromString(call(GARBAGE, metadata=metadata, timeout=10)).status.code)
            )
    receive = channel.unary_stream(SERVICE + "ReceiveMessage")
    for _ in range(times // 4):
        replies = [
            service_pb2.ReceiveMessageResponse.FromString(r)
            for r in receive(GARBAGE, metadata=metadata, timeout=10)
        ]
        assert replies[-1].HasField("delivery_timestamp")
        codes.add(int(replies[0].status.code))
    telemetry = channel.stream_stream(SERVICE + "Telemetry")
    for reply in telemetry(iter([GARBAGE] * (times // 4)), metadata=metadata, timeout=10):
        codes.add(int(service_pb2.TelemetryCommand.FromString(reply).status.code))
    return codes


def test_undecodable_bodies_answered_in_band_with_one_log_line(
    make_server: Callable[..., ServerProcess],
) -> None:
    server = make_server()
    channel = grpc.insecure_channel(server.endpoint)
    try:
        assert _hammer_with_garbage(channel, md("garbage"), 200) == {Code.BAD_REQUEST}
    finally:
        channel.close()
    log = log_of(server)
    assert "Traceback" not in log
    lines = [line for line in log.splitlines() if "undecodable" in line and " from " in line]
    # one line per RPC (five of them), not one per call (~700)
    assert 1 <= len(lines) <= 5, lines
    assert server.alive()


# --- access keys: client ids and the NOT_IMPLEMENTED RPCs -----------------------------------
@pytest.fixture(scope="module")
def auth_server(
    tmp_path_factory: pytest.TempPathFactory, client_home: Path
) -> Iterator[ServerProcess]:
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    keys.write_text(json.dumps(KEYS))
    proc = ServerProcess(
        tmp_path_factory.mktemp("auth-store"), client_home, *FAST, "--credentials-file", str(keys)
    ).start()
    yield proc
    assert proc.terminate() == 0, log_of(proc)


def test_undecodable_bodies_are_unauthorized_before_anything(auth_server: ServerProcess) -> None:
    channel = grpc.insecure_channel(auth_server.endpoint)
    try:
        assert _hammer_with_garbage(channel, md("unsigned"), 100) == {Code.UNAUTHORIZED}
    finally:
        channel.close()
    assert "undecodable " not in log_of(auth_server)  # a stranger cannot write to our log
    assert "Traceback" not in log_of(auth_server)


def test_a_client_id_belongs_to_its_access_key(auth_server: ServerProcess) -> None:
    channel = grpc.insecure_channel(auth_server.endpoint)
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    owner, topic, group = "owner-client", "t-owned", "g-owned"
    try:
        sent = stub.SendMessage(
            send_request(topic), metadata=signed(owner, "owner-key"), timeout=10
        )
        assert sent.status.code == Code.OK
        # the owner receives it as a push consumer does: kept invisible while it lives
        replies = list(
            stub.ReceiveMessage(
                receive_request(group, topic, auto_renew=True),
                metadata=signed(owner, "owner-key"),
                timeout=10,
            )
        )
        assert [
            r.message.system_properties.message_id for r in replies if r.HasField("message")
        ] == [sent.entries[0].message_id]

        # a stranger with valid keys of its own, naming the owner's client id
        notify = service_pb2.NotifyClientTerminationRequest()
        notify.group.name = group
        stranger = signed(owner, "stranger-key")
        assert (
            stub.NotifyClientTermination(notify, metadata=stranger, timeout=5).status.code
            == Code.FORBIDDEN
        )
        assert (
            stub.Heartbeat(
                service_pb2.HeartbeatRequest(client_type=3), metadata=stranger, timeout=5
            ).status.code
            == Code.FORBIDDEN
        )
        tele = next(
            stub.Telemetry(iter([settings_command(group, topic)]), metadata=stranger, timeout=5)
        )
        assert tele.status.code == Code.FORBIDDEN
        # ...released nothing: the message stays with its owner (a release shows in 1 s)
        other = list(
            stub.ReceiveMessage(
                receive_request(group, topic, poll_s=3),
                metadata=signed("other-client", "stranger-key"),
                timeout=10,
            )
        )
        assert not any(r.HasField("message") for r in other)
        assert other[0].status.code == Code.MESSAGE_NOT_FOUND

        # the owner's own termination releases it: the check above could have failed
        assert (
            stub.NotifyClientTermination(
                notify, metadata=signed(owner, "owner-key"), timeout=5
            ).status.code
            == Code.OK
        )
        got: list[str] = []
        deadline = time.monotonic() + 15
        while not got and time.monotonic() < deadline:
            got = [
                r.message.system_properties.message_id
                for r in stub.ReceiveMessage(
                    receive_request(group, topic, poll_s=2),
                    metadata=signed("other-client", "stranger-key"),
                    timeout=10,
                )
                if r.HasField("message")
            ]
        assert got == [sent.entries[0].message_id]
        # once the owner's session is gone, its id is free again
        assert (
            stub.Heartbeat(
                service_pb2.HeartbeatRequest(client_type=3), metadata=stranger, timeout=5
            ).status.code
            == Code.OK
        )
    finally:
        channel.close()


def test_not_implemented_rpcs_check_the_signature_first(auth_server: ServerProcess) -> None:
    channel = grpc.insecure_channel(auth_server.endpoint)
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    try:
        for metadata, expected in (
            (md("nosig"), Code.UNAUTHORIZED),
            (signed("signed", "owner-key"), Code.NOT_IMPLEMENTED),
        ):
            assert (
                stub.UpdateOffset(
                    service_pb2.UpdateOffsetRequest(), metadata=metadata, timeout=5
                ).status.code
                == expected
            )
            assert (
                stub.SyncLiteSubscription(
                    service_pb2.SyncLiteSubscriptionRequest(), metadata=metadata, timeout=5
                ).status.code
                == expected
            )
            pulled = list(
                stub.PullMessage(service_pb2.PullMessageRequest(), metadata=metadata, timeout=5)
            )
            assert [r.status.code for r in pulled] == [expected]
    finally:
        channel.close()


def test_a_client_id_claimed_during_a_parked_receive(auth_server: ServerProcess) -> None:
    """The claim lands while a stranger's receive is parked: FORBIDDEN, not a traceback."""
    channel = grpc.insecure_channel(auth_server.endpoint)
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    topic, group, client_id = "t-race", "g-race", "race-client"
    try:
        # the topic and group exist before the stranger parks
        assert (
            stub.SendMessage(
                send_request(topic), metadata=signed("setup", "owner-key"), timeout=10
            ).status.code
            == Code.OK
        )
        list(
            stub.ReceiveMessage(
                receive_request(group, topic), metadata=signed("setup", "owner-key"), timeout=10
            )
        )
        replies: list[Any] = []
        stranger = threading.Thread(
            target=lambda: replies.extend(
                stub.ReceiveMessage(
                    receive_request(group, topic, poll_s=4),
                    metadata=signed(client_id, "stranger-key"),
                    timeout=10,
                )
            )
        )
        stranger.start()
        time.sleep(0.5)  # the stranger's call is parked on an empty queue
        assert (
            stub.Heartbeat(
                service_pb2.HeartbeatRequest(client_type=3),
                metadata=signed(client_id, "owner-key"),
                timeout=5,
            ).status.code
            == Code.OK
        )
        assert (
            stub.SendMessage(
                send_request(topic), metadata=signed("setup", "owner-key"), timeout=10
            ).status.code
            == Code.OK
        )
        stranger.join(15)
        assert not stranger.is_alive()
        assert replies[0].status.code == Code.FORBIDDEN
        assert replies[-1].HasField("delivery_timestamp")
        assert "Traceback" not in log_of(auth_server)
    finally:
        channel.close()
