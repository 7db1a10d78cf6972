"""Every RPC of MessagingService (and of its extension, the batch receive) against a real
server process: random and mutated requests.

One server for the module (`reliable broker start`, a subprocess). For each RPC, hypothesis
draws either random bytes as the request body (sent over a raw channel with identity
serializers) or a valid request of that RPC overlaid with a random message of the same type
(random field values, huge numbers, empty and huge strings, unknown enum numbers, nested
garbage). Every call must end cleanly: the gRPC status is OK, every reply parses as the
RPC's response, and its in-band status is a protocol code other than INTERNAL_ERROR. At the
end the server is still up, its log holds no traceback and no "unexpected error", and its
anonymous memory grew by a bounded amount. A second server, with access keys on, must
refuse every unsigned request of every RPC with UNAUTHORIZED, whatever its body, and log
nothing about it.

Seeded and bounded by the profiles in `tests/fuzz/conftest.py` ("ci": derandomized, 60
examples per RPC; `--soak`: many more).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool, json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.server.codes import Code
from protocol import ext as protocol_ext
from protocol.pb import service_pb2
from reliable.admin import AdminClient
from tests.e2e.grpc.server_process import ServerProcess

SERVICE = service_pb2.DESCRIPTOR.services_by_name["MessagingService"]
# and the server's one extension, the batch receive (`protocol.ext`)
EXTENSION = descriptor_pool.Default().FindServiceByName(protocol_ext.SERVICE)
METHODS = {m.name: m for m in (*SERVICE.methods, *EXTENSION.methods)}
TOPIC, GROUP = "t-fuzz", "g-fuzz"
CLIENT_IDS = ("fuzz-a", "fuzz-b", "fuzz-c")
MEMORY_BOUND_MB = 150  # the dedupe cache alone may take 32 MiB; nothing here comes close
KNOWN_CODES = {int(c) for c in Code}

NOW = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
_QUEUE = {"topic": {"name": TOPIC}, "id": 0}
_ENDPOINTS = {"scheme": "IPv4", "addresses": [{"host": "127.0.0.1", "port": 8081}]}
_FILTER = {"type": "TAG", "expression": "*"}
_MESSAGE = {
    "topic": {"name": TOPIC},
    "body": "Zm96eg==",
    "systemProperties": {
        "messageId": "FUZZ0001",
        "messageType": "NORMAL",
        "tag": "a",
        "keys": ["k"],
        "bornTimestamp": NOW,
        "bornHost": "127.0.0.1",
    },
    "userProperties": {"p": "v"},
}
# one valid request per RPC, in the protocol's JSON form
TEMPLATES: dict[str, dict[str, Any]] = {
    "QueryRoute": {"topic": {"name": TOPIC}, "endpoints": _ENDPOINTS},
    "Heartbeat": {"group": {"name": GROUP}, "clientType": "SIMPLE_CONSUMER"},
    "SendMessage": {"messages": [_MESSAGE]},
    "QueryAssignment": {
        "topic": {"name": TOPIC},
        "group": {"name": GROUP},
        "endpoints": _ENDPOINTS,
    },
    "ReceiveMessage": {
        "group": {"name": GROUP},
        "messageQueue": _QUEUE,
        "filterExpression": _FILTER,
        "batchSize": 4,
        "invisibleDuration": "10s",
        "longPollingTimeout": "1s",
    },
    "AckMessage": {
        "group": {"name": GROUP},
        "topic": {"name": TOPIC},
        "entries": [{"messageId": "FUZZ0001", "receiptHandle": "h"}],
    },
    "ForwardMessageToDeadLetterQueue": {
        "group": {"name": GROUP},
        "topic": {"name": TOPIC},
        "receiptHandle": "h",
        "messageId": "FUZZ0001",
        "deliveryAttempt": 3,
        "maxDeliveryAttempts": 3,
    },
    "PullMessage": {
        "group": {"name": GROUP},
        "messageQueue": _QUEUE,
        "offset": 0,
        "batchSize": 4,
        "filterExpression": _FILTER,
        "longPollingTimeout": "1s",
    },
    "UpdateOffset": {"group": {"name": GROUP}, "messageQueue": _QUEUE, "offset": 0},
    "GetOffset": {"group": {"name": GROUP}, "messageQueue": _QUEUE},
    "QueryOffset": {"messageQueue": _QUEUE, "queryOffsetPolicy": "TIMESTAMP", "timestamp": NOW},
    "EndTransaction": {
        "topic": {"name": TOPIC},
        "messageId": "FUZZ0001",
        "transactionId": "00" * 16 + ":x",
        "resolution": "COMMIT",
        "source": "SOURCE_CLIENT",
    },
    "Telemetry": {
        "settings": {
            "clientType": "SIMPLE_CONSUMER",
            "subscription": {
                "group": {"name": GROUP},
                "subscriptions": [{"topic": {"name": TOPIC}, "expression": _FILTER}],
            },
        }
    },
    "NotifyClientTermination": {"group": {"name": GROUP}},
    "ChangeInvisibleDuration": {
        "group": {"name": GROUP},
        "topic": {"name": TOPIC},
        "receiptHandle": "h",
        "invisibleDuration": "10s",
        "messageId": "FUZZ0001",
    },
    "RecallMessage": {"topic": {"name": TOPIC}, "recallHandle": "h"},
    "SyncLiteSubscription": {
        "action": "PARTIAL_ADD",
        "topic": {"name": TOPIC},
        "group": {"name": GROUP},
        "liteTopicSet": ["x"],
    },
}
TEMPLATES["ReceiveMessages"] = TEMPLATES["ReceiveMessage"]  # the same request, one answer


# each example is a round trip to a real server (~30 ms, a long poll up to a second): the
# profile's count (60 in make test), at most 500 per RPC test in make soak (~10 min in all)
RPC_EXAMPLES = min(settings.default.max_examples, 500)


def test_every_rpc_has_a_template() -> None:
    assert set(TEMPLATES) == set(METHODS)


# --- strategies ------------------------------------------------------------------------------
_I32, _I64 = (-(2**31), 2**31 - 1), (-(2**63), 2**63 - 1)
_U32, _U64 = (0, 2**32 - 1), (0, 2**64 - 1)


# boundaries of int32/int64, of protobuf's Timestamp (year 9999) and Duration (10,000 years)
_EDGES = (
    0,
    1,
    -1,
    1000,
    2**31 - 1,
    -(2**31),
    2**32 - 1,
    2**62,
    253_402_300_799,
    253_402_300_800,
    315_576_000_001,
    999_999_999,
    1_000_000_000,
    -(10**12),
)


def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    edges = sorted({low, high, *(v for v in _EDGES if low <= v <= high)})
    return st.one_of(
        st.sampled_from(edges),
        st.integers(low, high),
        st.integers(max(low, -2000), min(high, 2000)),
    )


_STRINGS = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            TOPIC,
            GROUP,
            "%RETRY%g-fuzz",
            "%DLQ%g-fuzz",
            "TBW102",
            "SCHEDULE_TOPIC_XXXX",
            "a|b",
            "*",
            "||",
            "\x00",
            "\x01\x02",
            "é" * 40,
            "x" * 128,
            "x" * 300,
            "x" * 70_000,
            "0" * 32 + ":x",
            "1~t~0~0~ff",
        ]
    ),
    st.text(max_size=40),
    st.text(alphabet="abc-_%|0123456789~: ", max_size=80),
)
_BYTES = st.one_of(st.binary(max_size=64), st.sampled_from([b"", b"\x00" * 5000]))

_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    FieldDescriptor.TYPE_INT32: _integers(*_I32),
    FieldDescriptor.TYPE_SINT32: _integers(*_I32),
    FieldDescriptor.TYPE_SFIXED32: _integers(*_I32),
    FieldDescriptor.TYPE_INT64: _integers(*_I64),
    FieldDescriptor.TYPE_SINT64: _integers(*_I64),
    FieldDescriptor.TYPE_SFIXED64: _integers(*_I64),
    FieldDescriptor.TYPE_UINT32: _integers(*_U32),
    FieldDescriptor.TYPE_FIXED32: _integers(*_U32),
    FieldDescriptor.TYPE_UINT64: _integers(*_U64),
    FieldDescriptor.TYPE_FIXED64: _integers(*_U64),
    FieldDescriptor.TYPE_BOOL: st.booleans(),
    FieldDescriptor.TYPE_FLOAT: st.floats(width=32),
    FieldDescriptor.TYPE_DOUBLE: st.floats(),
    FieldDescriptor.TYPE_STRING: _STRINGS,
    FieldDescriptor.TYPE_BYTES: _BYTES,
}


def _enum_values(field: FieldDescriptor) -> st.SearchStrategy[int]:
    known = [v.number for v in field.enum_type.values]
    return st.one_of(st.sampled_from(known), _integers(*_I32))  # open enums: any number


def _value(draw: st.DrawFn, field: FieldDescriptor, depth: int) -> Any:
    if field.type == FieldDescriptor.TYPE_ENUM:
        return draw(_enum_values(field))
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return draw(messages(field.message_type, depth + 1))
    return draw(_SCALARS[field.type])


@st.composite
def messages(draw: st.DrawFn, descriptor: Descriptor, depth: int = 0) -> Any:
    """A message of `descriptor` with a random subset of its fields set to random values."""
    cls = _class_of(descriptor)
    message = cls()
    fields = [f for f in descriptor.fields if depth < 4 or f.type != FieldDescriptor.TYPE_MESSAGE]
    if not fields:
        return message
    for field in draw(st.lists(st.sampled_from(fields), max_size=4, unique_by=id)):
        with contextlib.suppress(ValueError, TypeError):  # a value the API itself refuses
            _set(draw, message, field, depth)
    return message


def _set(draw: st.DrawFn, message: Any, field: FieldDescriptor, depth: int) -> None:
    target = getattr(message, field.name)
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key_field, value_field = field.message_type.fields
        for _ in range(draw(st.integers(0, 3))):
            key = _value(draw, key_field, depth)
            value = _value(draw, value_field, depth)
            if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                target[key].CopyFrom(value)
            else:
                target[key] = value
    elif field.is_repeated:
        count = draw(st.integers(0, 3))
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            for _ in range(count):
                target.add().CopyFrom(_value(draw, field, depth))
        else:
            target.extend(_value(draw, field, depth) for _ in range(count))
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        target.CopyFrom(_value(draw, field, depth))
    else:
        setattr(message, field.name, _value(draw, field, depth))


def _class_of(descriptor: Descriptor) -> Any:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(descriptor)


def _template(rpc: str) -> Any:
    return json_format.ParseDict(TEMPLATES[rpc], _class_of(METHODS[rpc].input_type)())


@st.composite
def request_bodies(draw: st.DrawFn, rpc: str) -> bytes:
    """Random bytes, a random request, or a valid request overlaid with random fields."""
    kind = draw(st.sampled_from(["bytes", "random", "mutated", "mutated"]))
    if kind == "bytes":
        return draw(
            st.one_of(
                st.binary(max_size=512), st.binary(min_size=1, max_size=16).map(lambda b: b * 200)
            )
        )
    overlay = draw(messages(METHODS[rpc].input_type))
    if kind == "random":
        return bytes(overlay.SerializeToString())
    request = _template(rpc)
    request.MergeFrom(overlay)
    return bytes(request.SerializeToString())


# --- the server ------------------------------------------------------------------------------
def _anon_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon")


class Fuzzed:
    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.channel = grpc.insecure_channel(
            server.endpoint, options=[("grpc.max_receive_message_length", -1)]
        )
        assert server.proc is not None
        self.baseline_kb = _anon_kb(server.proc.pid)
        self.calls = 0

    def call(self, rpc: str, body: bytes, client_id: str) -> list[Any]:
        """Send `body` to `rpc`; the parsed replies. Fails on anything but a clean answer."""
        method = METHODS[rpc]
        response = _class_of(method.output_type)
        path = f"/{method.containing_service.full_name}/{rpc}"
        metadata = [("x-mq-client-id", client_id)]
        self.calls += 1
        if method.client_streaming:
            raw = list(
                self.channel.stream_stream(path)(iter([body]), metadata=metadata, timeout=20)
            )
        elif method.server_streaming:
            raw = list(self.channel.unary_stream(path)(body, metadata=metadata, timeout=20))
        else:
            raw = [self.channel.unary_unary(path)(body, metadata=metadata, timeout=20)]
        return [response.FromString(r) for r in raw]


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    server = ServerProcess(
        tmp_path_factory.mktemp("fuzz-store"),
        tmp_path_factory.mktemp("fuzz-home"),
        # no auto-created topics: random valid names would each get queue files on disk
        # and short long polls: a valid receive on an empty queue waits this long
        "--no-auto-create-topics",
        "--long-polling-ms",
        "10",
        "--min-long-polling-ms",
        "10",
        "--min-invisible-ms",
        "1000",
    ).start()
    try:
        admin = AdminClient(server.endpoint)
        admin.call("CreateTopic", name=TOPIC, type="MIXED")
        admin.close()
        fuzzed = Fuzzed(server)
        yield fuzzed
        fuzzed.channel.close()
    finally:
        code = server.terminate()
    log = "".join(server.output)
    assert code == 0, log
    assert "Traceback" not in log, log
    assert "unexpected error" not in log, log


def _assert_clean(replies: list[Any], rpc: str) -> None:
    # a Telemetry command other than Settings (a thread dump, a verify result) gets no reply
    assert replies or rpc == "Telemetry", f"{rpc} answered nothing"
    for reply in replies:
        if reply.HasField("status"):
            code = int(reply.status.code)
            assert code in KNOWN_CODES, f"{rpc}: unknown code {code}"
            assert code not in (Code.INTERNAL_ERROR, Code.INTERNAL_SERVER_ERROR), (
                f"{rpc}: {reply.status}"
            )
    if rpc in ("ReceiveMessage", "PullMessage", "ReceiveMessages"):
        assert replies[0].HasField("status")


@pytest.mark.timeout(1800)  # the soak profile's thousands of examples per RPC
@pytest.mark.parametrize("rpc", sorted(TEMPLATES))
@settings(max_examples=RPC_EXAMPLES)
@given(data=st.data())
def test_rpc_answers_every_request_cleanly(fuzzed: Fuzzed, rpc: str, data: st.DataObject) -> None:
    body = data.draw(request_bodies(rpc), label="body")
    client_id = data.draw(st.sampled_from(CLIENT_IDS), label="client id")
    try:
        replies = fuzzed.call(rpc, body, client_id)
    except grpc.RpcError as exc:  # only the in-band answer is clean
        pytest.fail(f"{rpc} ended with {exc.code()}: {exc.details()}")
    _assert_clean(replies, rpc)
    assert fuzzed.server.alive()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    """A second server, with access keys on."""
    keys = tmp_path_factory.mktemp("fuzz-keys") / "keys.json"
    keys.write_text('{"fuzz-key": "fuzz-secret"}')
    server = ServerProcess(
        tmp_path_factory.mktemp("guarded-store"),
        tmp_path_factory.mktemp("guarded-home"),
        "--credentials-file",
        str(keys),
    ).start()
    try:
        guarded = Fuzzed(server)
        yield guarded
        guarded.channel.close()
    finally:
        code = server.terminate()
    log = "".join(server.output)
    assert code == 0, log
    assert "Traceback" not in log, log
    assert "undecodable " not in log, log  # unsigned callers cannot write to the log


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("rpc", sorted(TEMPLATES))
@settings(max_examples=RPC_EXAMPLES)
@given(data=st.data())
def test_unsigned_requests_are_refused_whatever_they_carry(
    guarded: Fuzzed, rpc: str, data: st.DataObject
) -> None:
    body = data.draw(request_bodies(rpc), label="body")
    try:
        replies = guarded.call(rpc, body, data.draw(st.sampled_from(CLIENT_IDS)))
    except grpc.RpcError as exc:
        pytest.fail(f"{rpc} ended with {exc.code()}: {exc.details()}")
    assert [int(r.status.code) for r in replies if r.HasField("status")][:1] == [
        Code.UNAUTHORIZED
    ], f"{rpc}: {replies[:1]}"


def test_valid_templates_are_served(fuzzed: Fuzzed) -> None:
    """The templates the mutations start from reach the handlers (not refused as garbage)."""
    send = fuzzed.call("SendMessage", _template("SendMessage").SerializeToString(), "fuzz-a")
    assert send[0].status.code == Code.OK
    route = fuzzed.call("QueryRoute", _template("QueryRoute").SerializeToString(), "fuzz-a")
    assert route[0].status.code == Code.OK and len(route[0].message_queues) == 4


def test_server_survived_with_bounded_memory(fuzzed: Fuzzed) -> None:
    assert fuzzed.server.alive()
    assert fuzzed.server.proc is not None
    grown_mb = (_anon_kb(fuzzed.server.proc.pid) - fuzzed.baseline_kb) / 1024
    assert grown_mb < MEMORY_BOUND_MB, f"grew {grown_mb:.0f} MB over {fuzzed.calls} calls"
    log = "".join(fuzzed.server.output)
    assert "Traceback" not in log, log
    assert "unexpected error" not in log, log
