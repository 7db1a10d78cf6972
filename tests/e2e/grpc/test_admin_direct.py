"""`reliable admin message reconsume ID --group G --client CLIENT_ID` against a real server
process (RocketMQ's CONSUME_MESSAGE_DIRECTLY over the Telemetry stream).

The framework's push consumers over the grpc transport: the one client named runs its
listener on the message exactly once and the command prints its verdict; the other client
of the group sees nothing; nothing is acknowledged, retried or copied. A failing listener is
reported as failed. A client that is not a live client of the group, a client with no
listener, and a client that never answers (the official RocketMQ 5 Python client, a raw
Telemetry stream) each give their typed answer; a stopped store refuses --client.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import pytest

from reliable import (
    ConsumeContext,
    ConsumeFrom,
    ConsumeResult,
    Message,
    Producer,
    PushConsumer,
    ReceivedMessage,
    SimpleConsumer,
    Transport,
    connect,
)
from reliable import admin_messages as api
from reliable.admin import AdminCallError, AdminClient
from reliable.transport.base import DirectConsume
from tests.e2e.grpc import official
from tests.e2e.grpc.raw_telemetry import RawTelemetry, consumer_settings
from tests.e2e.grpc.server_process import ServerProcess
from tests.e2e.grpc.server_process import admin_cli as cli
from tests.e2e.grpc.server_process import admin_json as doc


class Recording:
    """A listener recording each delivery (message id, body); `mode` says how it ends."""

    def __init__(self) -> None:
        self.mode = "ok"  # ok | later | raise
        self.seen: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()

    def __call__(self, messages: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        with self.lock:
            self.seen.extend((m.message_id, m.body) for m in messages)
        if self.mode == "later":
            return ConsumeResult.RECONSUME_LATER
        if self.mode == "raise":
            raise RuntimeError("payment service down")
        return ConsumeResult.SUCCESS

    def ids(self) -> list[str]:
        with self.lock:
            return [mid for mid, _ in self.seen]


def start_consumer(endpoint: str, group: str, topic: str, listener: Recording) -> PushConsumer:
    consumer = PushConsumer(
        group,
        listener,
        {topic: "*"},
        transport="grpc",
        endpoint=endpoint,
        consume_from=ConsumeFrom.FIRST,
        consume_threads=1,
        heartbeat_interval_s=0.5,
        receive_long_poll_ms=1000,
    )
    return consumer.start()


def client_id(consumer: PushConsumer | Transport, group: str) -> str:
    t = consumer.transport if isinstance(consumer, PushConsumer) else consumer
    return cast(DirectConsume, t).consumer_client_id(group)


def send(endpoint: str, message: Message) -> str:
    t = connect("grpc", endpoint=endpoint)
    t.start()
    try:
        with Producer(t) as producer:
            return producer.send(message).message_id
    finally:
        t.close()


def live(endpoint: str, group: str) -> list[str]:
    return sorted(doc("group", "show", group, "--endpoint", endpoint)["consumers"])


def reconsume(*args: str) -> tuple[int, dict[str, Any]]:
    done = cli("message", "reconsume", *args, "--json")
    return done.returncode, json.loads(done.stdout) if done.returncode in (
        0,
        1,
    ) and done.stdout else {}


@pytest.fixture
def two_clients(
    make_server: Callable[..., ServerProcess],
) -> Iterator[tuple[ServerProcess, list[PushConsumer], list[Recording]]]:
    server = make_server()
    ep = ("--endpoint", server.endpoint)
    assert cli("topic", "create", "dc-orders", "--queues", "2", *ep).returncode == 0
    assert cli("group", "create", "dc-billing", *ep).returncode == 0
    listeners = [Recording(), Recording()]
    consumers = [
        start_consumer(server.endpoint, "dc-billing", "dc-orders", lst) for lst in listeners
    ]
    try:
        yield server, consumers, listeners
    finally:
        for c in consumers:
            c.shutdown()


def test_reconsume_to_one_client_runs_its_listener_once_and_reports_the_verdict(
    two_clients: tuple[ServerProcess, list[PushConsumer], list[Recording]],
) -> None:
    server, consumers, listeners = two_clients
    ep = ("--endpoint", server.endpoint)
    group = "dc-billing"
    ids = [client_id(c, group) for c in consumers]
    assert ids[0] != ids[1]
    # the operator finds the client ids where the group is shown
    assert official.wait_for(lambda: live(server.endpoint, group) == sorted(ids), timeout_s=20)
    text = cli("group", "show", group, *ep)
    assert all(i in text.stdout.splitlines()[0] for i in ids)

    mid = send(server.endpoint, Message("dc-orders", b"order 42", keys=["order-42"]))
    assert official.wait_for(lambda: len(listeners[0].ids() + listeners[1].ids()) == 1)
    before = [lst.ids() for lst in listeners]
    progress = doc("group", "show", group, *ep)["total"]

    code, done = reconsume(mid, "--group", group, "--client", ids[1], *ep)
    assert code == 0, done
    assert (done["consumed"], done["status"], done["client_id"], done["msg_id"]) == (
        True,
        "OK",
        ids[1],
        mid,
    )
    assert done["source"]["topic"] == "dc-orders" and done["source"]["keys"] == ["order-42"]
    assert listeners[1].ids() == [*before[1], mid]  # delivered to that client, once
    assert listeners[1].seen[-1][1] == b"order 42"
    time.sleep(2.0)  # nothing else follows: no ack, no retry, no copy
    assert [lst.ids() for lst in listeners] == [before[0], [*before[1], mid]]
    copies = doc("message", "query", "--id", mid, *ep)["messages"]
    assert [c["topic"] for c in copies] == ["dc-orders"]
    after = doc("group", "show", group, *ep)["total"]
    assert (after["lag"], after["in_flight"]) == (progress["lag"], progress["in_flight"]) == (0, 0)

    # the table for people
    table = cli("message", "reconsume", mid, "--group", group, "--client", ids[0], *ep)
    assert table.returncode == 0, table.stderr
    assert f"to client {ids[0]} of group {group}: consumed it" in table.stdout
    assert table.stdout.splitlines()[1].split()[:2] == ["CLIENT", "RESULT"]
    assert table.stdout.splitlines()[2].split()[:3] == [ids[0], "CONSUMED", "OK"]
    assert listeners[0].ids() == [*before[0], mid]

    # a failing listener is reported as failed (exit 1), and is not retried either
    listeners[1].mode = "later"
    code, failed = reconsume(mid, "--group", group, "--client", ids[1], *ep)
    assert code == 1
    assert (failed["consumed"], failed["status"]) == (False, "FAILED_TO_CONSUME_MESSAGE")
    assert "RECONSUME_LATER" in failed["message"]
    listeners[1].mode = "raise"
    code, raised = reconsume(mid, "--group", group, "--client", ids[1], *ep)
    assert code == 1 and raised["consumed"] is False
    assert "RuntimeError: payment service down" in raised["message"]
    time.sleep(2.0)
    assert listeners[1].ids() == [*before[1], mid, mid, mid]
    assert listeners[0].ids() == [*before[0], mid]

    # an unknown client: a typed refusal naming the group's live clients
    unknown = cli("message", "reconsume", mid, "--group", group, "--client", "nobody@1", *ep)
    assert unknown.returncode == 1
    [line] = unknown.stderr.strip().splitlines()
    assert "NOT_FOUND" in line and "'nobody@1' is not connected" in line
    assert all(i in line for i in ids)
    admin = AdminClient(server.endpoint)
    try:
        with pytest.raises(AdminCallError) as refused:
            api.consume_directly(admin, mid, group, "nobody@1")
        assert refused.value.code == "NOT_FOUND"
        assert refused.value.details["live_clients"] == sorted(ids)
        # the Python API answers what the command prints
        listeners[1].mode = "ok"
        verdict = api.consume_directly(admin, mid, group, ids[1], operator="oncall")
        assert (verdict["consumed"], verdict["status"]) == (True, "OK")
    finally:
        admin.close()


def test_clients_that_cannot_or_do_not_answer_and_a_stopped_store(
    make_server: Callable[..., ServerProcess],
) -> None:
    server = make_server()
    ep = ("--endpoint", server.endpoint)
    topic, group = "dn-orders", "dn-billing"
    assert cli("topic", "create", topic, *ep).returncode == 0
    assert cli("group", "create", group, *ep).returncode == 0
    assert cli("group", "create", "dn-other", *ep).returncode == 0
    mid = send(server.endpoint, Message(topic, b"order 7", keys=["order-7"]))
    # streams that read every command and answer none (as the official Python client
    # treats verify_message_command)
    raw = RawTelemetry(server.endpoint, "raw-client-1", consumer_settings(group, topic))
    other = RawTelemetry(server.endpoint, "raw-other-1", consumer_settings("dn-other", topic))
    t = connect("grpc", endpoint=server.endpoint)
    t.start()
    simple = SimpleConsumer(group, {topic: "*"}, transport=t).start()
    stock = official.simple_consumer(server.endpoint, group, topic)  # the official client
    try:
        simple_id = client_id(t, group)
        stock_id = str(stock.client_id)
        assert official.wait_for(
            lambda: live(server.endpoint, group) == sorted(["raw-client-1", simple_id, stock_id]),
            timeout_s=20,
        )
        # the official RocketMQ 5 Python client ignores the command: a timeout, not a hang
        ignored = cli(
            "message", "reconsume", mid, "--group", group, "--client", stock_id,
            "--timeout", "1", *ep,
        )  # fmt: skip
        assert ignored.returncode == 1
        assert "PROXY_TIMEOUT" in ignored.stderr and "did not answer within 1000 ms" in (
            ignored.stderr
        )
        # never answers: a timeout that says so, after the one command was sent
        started = time.monotonic()
        silent = cli(
            "message", "reconsume", mid, "--group", group, "--client", "raw-client-1",
            "--timeout", "1", *ep,
        )  # fmt: skip
        took = time.monotonic() - started
        assert silent.returncode == 1
        [line] = silent.stderr.strip().splitlines()
        assert "PROXY_TIMEOUT" in line and "did not answer within 1000 ms" in line
        assert took >= 1.0
        [verify] = raw.received("verify_message_command")
        assert verify.message.system_properties.message_id == mid
        assert verify.message.body == b"order 7" and verify.message.topic.name == topic
        assert len(verify.nonce) >= 16
        # a client with no listener (a simple consumer) says so
        code, refused = reconsume(mid, "--group", group, "--client", simple_id, *ep)
        assert code == 1
        assert (refused["consumed"], refused["status"]) == (False, "NOT_IMPLEMENTED")
        assert "has no listener" in refused["message"]
        # a client of another group is not this group's
        wrong = cli("message", "reconsume", mid, "--group", group, "--client", "raw-other-1", *ep)
        assert wrong.returncode == 1
        assert "is a consumer of group 'dn-other', not a consumer of group 'dn-billing'" in (
            wrong.stderr
        )
        assert "raw-client-1" in wrong.stderr and simple_id in wrong.stderr
        # bad arguments
        bad = cli(
            "message", "reconsume", mid, "--group", group, "--client", "x", "--timeout", "0", *ep
        )
        assert bad.returncode == 2 and "--timeout" in bad.stderr
        nogroup = cli("message", "reconsume", mid, "--group", "dn-none", "--client", "x", *ep)
        assert nogroup.returncode == 1 and "CONSUMER_GROUP_NOT_FOUND" in nogroup.stderr
        nomsg = cli("message", "reconsume", "0" * 32, "--group", group, "--client", "x", *ep)
        assert nomsg.returncode == 1 and "MESSAGE_NOT_FOUND" in nomsg.stderr
    finally:
        stock.shutdown()
        simple.shutdown()
        t.close()
        raw.close()
        other.close()
    assert raw.received("verify_message_command") == [
        verify
    ]  # asked once, only for the one command
    assert server.terminate() == 0
    stopped = cli(
        "message", "reconsume", mid, "--group", group, "--client", "raw-client-1",
        "--store", str(server.store),
    )  # fmt: skip
    assert stopped.returncode == 2
    [line] = stopped.stderr.strip().splitlines()
    assert "needs a running broker (--endpoint): a stopped store has no connected clients" in line
