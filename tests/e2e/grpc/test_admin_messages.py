"""`reliable admin message ...` and `reliable admin topic status` against a real server
process, and the same queries against its store once it is stopped.

Every query form finds a message a producer sent with a key; a key whose index hash
collides with it never does; answers are capped with a visible "more"; and the trace of a
message that failed twice, was dead-lettered, re-sent to its group by an operator and then
confirmed shows each step, in order, from the outbox stub to the confirmation row, whether
the operator replayed the dead letter with `dlq replay` or `message reconsume`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from broker.store.index_key import topic_key_hash
from reliable import (
    ConsumeContext,
    ConsumeFrom,
    ConsumeResult,
    Message,
    Producer,
    PushConsumer,
    ReceivedMessage,
    connect,
)
from reliable import admin_messages as api
from reliable.admin import AdminClient
from tests.e2e.grpc import official
from tests.e2e.grpc.server_process import ServerProcess
from tests.e2e.grpc.server_process import admin_cli as cli
from tests.e2e.grpc.server_process import admin_json as doc


def colliding_keys(topic: str, prefix: str = "k") -> tuple[str, str]:
    """Two keys whose index hash (crc32 of `topic#key`, 31 bits) is the same: a birthday
    search over pseudo-random keys (crc32 is linear, so keys that differ in a few bytes
    never collide; these differ everywhere)."""
    seen: dict[int, str] = {}
    for i in range(2_000_000):
        key = f"{prefix}{hashlib.sha256(str(i).encode()).hexdigest()[:12]}"
        h = topic_key_hash(topic, key)
        if h in seen:
            return seen[h], key
        seen[h] = key
    raise AssertionError("no collision found")  # pragma: no cover


def send(endpoint: str, messages: Sequence[Message]) -> list[str]:
    """Send with the framework's producer over gRPC; the client message ids."""
    t = connect("grpc", endpoint=endpoint)
    t.start()
    try:
        with Producer(t) as producer:
            return [producer.send(m).message_id for m in messages]
    finally:
        t.close()


def test_every_query_form_finds_the_message_running_and_stopped(
    tmp_path: Path, make_server: Callable[..., ServerProcess]
) -> None:
    store = tmp_path / "store"
    server = make_server(store=store)
    ep = ("--endpoint", server.endpoint)
    assert cli("topic", "create", "q-orders", "--queues", "2", *ep).returncode == 0
    k1, k2 = colliding_keys("q-orders")
    [mid] = send(
        server.endpoint,
        [
            Message(
                "q-orders",
                b"order 42 \xff",
                keys=["order-42", k1],
                tags="created",
                properties={"shop": "eu"},
            )
        ],
    )
    by_id = doc("message", "query", "--id", mid, "--body", *ep)
    assert by_id["more"] is False
    [m] = by_id["messages"]
    assert (m["topic"], m["msg_id"], m["unique_key"], m["tags"], m["keys"]) == (
        "q-orders",
        mid,
        mid,
        "created",
        ["order-42", k1],
    )
    assert m["properties"]["shop"] == "eu" and m["reconsume_times"] == 0 and m["size"] > 0
    assert (m["body"], m["body_encoding"]) == ("order 42 \xff".encode("latin-1").hex(), "hex")
    assert len(mid) == len(m["offset_msg_id"]) == 32  # both ids look alike: both are tried
    at = str(m["store_time_ms"])
    queries: list[tuple[str, ...]] = [
        ("--id", mid),
        ("--id", m["offset_msg_id"]),
        ("--id", mid, "--topic", "q-orders"),
        ("--key", "order-42", "--topic", "q-orders"),
        ("--key", k1, "--topic", "q-orders"),
        ("--unique-key", mid, "--topic", "q-orders"),
        ("--topic", "q-orders", "--queue", str(m["queue_id"]), "--offset", str(m["queue_offset"])),
        ("--topic", "q-orders", "--since", at, "--until", at),
        ("--topic", "q-orders", "--since", m["store_time"]),
        ("--topic", "q-orders", "--since", "10m"),
    ]
    running = [doc("message", "query", *q, *ep) for q in queries]
    for q, found in zip(queries, running, strict=True):
        assert [x["offset_msg_id"] for x in found["messages"]] == [m["offset_msg_id"]], q
        assert found["messages"][0]["commitlog_offset"] == m["commitlog_offset"]
    # a key colliding with one of the message's in the index is never a match
    for form in (
        ("--key", k2, "--topic", "q-orders"),
        ("--unique-key", k2, "--topic", "q-orders"),
        ("--id", k2),
    ):
        missed = cli("message", "query", *form, *ep)
        assert missed.returncode == 1 and "no message found" in missed.stderr, form
    untraced = cli("message", "trace", k2, "--json", *ep)
    assert untraced.returncode == 1 and json.loads(untraced.stdout)["records"] == []
    text = cli("message", "query", "--key", "order-42", "--topic", "q-orders", *ep)
    assert text.returncode == 0
    header = text.stdout.splitlines()[0].split()
    assert header[:4] == ["STORE", "TIME", "TOPIC", "QUEUE"] and mid in text.stdout
    assert "shop=eu" in text.stdout
    status = doc("topic", "status", "q-orders", *ep)
    queue = status["queues"][m["queue_id"]]
    assert (queue["min_offset"], queue["max_offset"], queue["last_store_time_ms"]) == (
        0,
        1,
        m["store_time_ms"],
    )
    assert status["messages"] == 1 and len(status["queues"]) == 2

    assert server.terminate() == 0
    offline = ("--store", str(store))
    stopped = [doc("message", "query", *q, *offline) for q in queries]
    assert stopped == running
    assert doc("topic", "status", "q-orders", *offline) == status
    assert doc("message", "query", "--id", mid, "--body", *offline) == by_id
    # the table is the same too
    assert (
        cli("message", "query", "--key", "order-42", "--topic", "q-orders", *offline).stdout
        == text.stdout
    )


def test_a_re_created_topic_does_not_bring_the_deleted_ones_messages_back(
    tmp_path: Path, make_server: Callable[..., ServerProcess]
) -> None:
    store = tmp_path / "store"
    server = make_server(store=store)
    ep = ("--endpoint", server.endpoint)

    def probe(body: str, *where: str) -> dict[str, Any]:
        sent: dict[str, Any] = doc("message", "send", "scratch", body, "--key", "probe-0", *where)
        return sent

    assert cli("topic", "create", "scratch", "--queues", "1", *ep).returncode == 0
    old = probe("old", *ep)
    assert cli("topic", "delete", "scratch", "--yes", *ep).returncode == 0
    assert cli("topic", "create", "scratch", "--queues", "1", *ep).returncode == 0
    gone = cli("message", "query", "--key", "probe-0", "--topic", "scratch", *ep)
    assert gone.returncode == 1 and "no message found" in gone.stderr
    new = probe("new", *ep)
    assert (old["queue_id"], old["queue_offset"]) == (new["queue_id"], new["queue_offset"])

    def only_the_new_one(*where: str) -> None:
        for form in (
            ("--key", "probe-0", "--topic", "scratch"),
            ("--unique-key", new["msg_id"], "--topic", "scratch"),
            ("--id", new["msg_id"]),
            ("--id", new["offset_msg_id"]),
        ):
            found = doc("message", "query", *form, *where)["messages"]
            assert [m["offset_msg_id"] for m in found] == [new["offset_msg_id"]], form
        for form in (
            ("--unique-key", old["msg_id"], "--topic", "scratch"),
            ("--id", old["msg_id"]),
            ("--id", old["offset_msg_id"]),
        ):
            missed = cli("message", "query", *form, *where)
            assert missed.returncode == 1 and "no message found" in missed.stderr, form

    only_the_new_one(*ep)
    assert server.terminate() == 0
    only_the_new_one("--store", str(store))
    again = make_server(store=store)
    only_the_new_one("--endpoint", again.endpoint)


def test_bad_arguments_and_missing_messages_fail_with_one_line(
    make_server: Callable[..., ServerProcess],
) -> None:
    server = make_server()
    ep = ("--endpoint", server.endpoint)
    cases: list[tuple[tuple[str, ...], int, str]] = [
        (("message", "query", "--id", "not an id"), 2, "is not an id"),
        (("message", "query", "--id", "x" * 200), 2, "is not an id"),
        (("message", "query", "--key", "k"), 2, "needs a topic"),
        (("message", "query", "--topic", "t", "--since", "yesterday"), 2, "is not a time"),
        (("message", "query", "--topic", "t"), 2, "give --id"),
        (("message", "query", "--id", "0" * 32), 1, "no message found"),
        (
            ("message", "query", "--topic", "nowhere", "--queue", "0", "--offset", "7"),
            1,
            "TOPIC_NOT_FOUND",
        ),
        (("message", "query", "--key", "k", "--topic", "nowhere"), 1, "TOPIC_NOT_FOUND"),
        (("message", "query", "--key", "k", "--topic", "t", "--limit", "5000"), 2, "--limit"),
        (
            ("message", "reconsume", "0" * 32, "--group", "g", "--client", "c1"),
            1,
            "CONSUMER_GROUP_NOT_FOUND",
        ),
        (("message", "reconsume", "0" * 32, "--group", "nobody"), 1, "CONSUMER_GROUP_NOT_FOUND"),
        (("message", "trace", "unknown-key"), 1, "nothing known about"),
        (("topic", "status", "nowhere"), 1, "TOPIC_NOT_FOUND"),
    ]
    for args, code, text in cases:
        done = cli(*args, *ep)
        assert done.returncode == code, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and text in lines[0], (args, done.stderr)
    assert cli("group", "create", "g-exists", *ep).returncode == 0
    missing = cli("message", "reconsume", "0" * 32, "--group", "g-exists", *ep)
    assert missing.returncode == 1 and "MESSAGE_NOT_FOUND" in missing.stderr


def test_results_are_capped_with_a_more_marker(make_server: Callable[..., ServerProcess]) -> None:
    server = make_server()
    ep = ("--endpoint", server.endpoint)
    ids = send(
        server.endpoint,
        [Message("cap-orders", f"order {i}".encode(), keys=["same"]) for i in range(5)],
    )
    capped = doc("message", "query", "--key", "same", "--topic", "cap-orders", "--limit", "3", *ep)
    assert capped["more"] is True
    assert [x["msg_id"] for x in capped["messages"]] == ids[::-1][:3]  # newest first
    whole = doc("message", "query", "--key", "same", "--topic", "cap-orders", "--limit", "5", *ep)
    assert whole["more"] is False and [x["msg_id"] for x in whole["messages"]] == ids[::-1]
    by_time = doc("message", "query", "--topic", "cap-orders", "--since", "1h", "--limit", "2", *ep)
    assert by_time["more"] is True
    assert [x["msg_id"] for x in by_time["messages"]] == ids[::-1][:2]
    text = cli("message", "query", "--key", "same", "--topic", "cap-orders", "--limit", "3", *ep)
    assert text.returncode == 0
    assert (
        text.stdout.rstrip()
        .splitlines()[-1]
        .startswith("(more messages match: only the newest 3 are shown")
    )
    # the Python API returns the very documents the command prints
    admin = AdminClient(server.endpoint)
    try:
        assert api.query_messages(admin, key="same", topic="cap-orders", limit=3) == capped
        status = api.topic_status(admin, "cap-orders")
        assert status["messages"] == 5
        assert status["last_store_time_ms"] == whole["messages"][0]["store_time_ms"]
    finally:
        admin.close()


def test_send_and_reconsume_from_the_command_line(
    make_server: Callable[..., ServerProcess],
) -> None:
    server = make_server()
    ep = ("--endpoint", server.endpoint)
    sent = doc(
        "message",
        "send",
        "cli-orders",
        "order 7",
        "--key",
        "order-7",
        "--key",
        "cust-3",
        "--tag",
        "created",
        "--property",
        "shop=eu",
        *ep,
    )
    assert sent["status"] == "PUT_OK" and sent["topic"] == "cli-orders"
    [m] = doc("message", "query", "--id", sent["msg_id"], "--body", *ep)["messages"]
    assert (m["offset_msg_id"], m["keys"], m["tags"], m["body"]) == (
        sent["offset_msg_id"],
        ["order-7", "cust-3"],
        "created",
        "order 7",
    )
    assert m["properties"]["shop"] == "eu"
    reserved = cli("message", "send", "cli-orders", "x", "--property", "KEYS=a", *ep)
    assert reserved.returncode == 2 and "KEYS" in reserved.stderr
    assert cli("group", "create", "cli-billing", *ep).returncode == 0
    again = doc(
        "message", "reconsume", sent["msg_id"], "--group", "cli-billing", "--operator", "alice", *ep
    )
    assert again["copy"]["topic"] == "%RETRY%cli-billing"
    assert again["source"]["offset_msg_id"] == sent["offset_msg_id"]
    copies = doc("message", "query", "--id", sent["msg_id"], *ep)["messages"]
    assert [c["topic"] for c in copies] == ["%RETRY%cli-billing", "cli-orders"]
    props = copies[0]["properties"]
    assert (props["OPERATOR_ACTION"], props["OPERATOR"], props["RETRY_TOPIC"]) == (
        "reconsume",
        "alice",
        "cli-orders",
    )
    assert copies[0]["unique_key"] == sent["msg_id"]


# how the operator sends the dead letter back: (command, the copy's role and trace line)
REPLAYS = {
    "reconsume": (
        ("message", "reconsume", "{mid}", "--group", "{group}", "--operator", "oncall"),
        "reconsume",
        "operator oncall re-sent it to tr-billing",
    ),
    "dlq-replay": (
        ("dlq", "replay", "--group", "{group}", "--id", "{mid}", "--operator", "oncall"),
        "replayed",
        "operator oncall replayed the dead letter (DLQ offset 0) to tr-billing",
    ),
}
TR_TOPIC, TR_GROUP = "tr-orders", "tr-billing"


@pytest.mark.slow
@pytest.mark.parametrize("replay", sorted(REPLAYS))
def test_trace_of_a_message_failed_twice_dead_lettered_replayed_and_confirmed(
    tmp_path: Path, make_server: Callable[..., ServerProcess], replay: str
) -> None:
    """The issue's story: two failures, the dead-letter queue, the operator's replay
    (`dlq replay`, or `message reconsume`), the confirmation: every step, in order."""
    from idempotency import IdempotencyGuard

    command, role, line = REPLAYS[replay]
    store = tmp_path / "store"
    server = make_server(store=store)
    ep = ("--endpoint", server.endpoint)
    assert cli("topic", "create", TR_TOPIC, "--queues", "2", *ep).returncode == 0
    assert cli("group", "create", TR_GROUP, "--max-retries", "1", *ep).returncode == 0
    db = f"sqlite:///{tmp_path / 'shop.db'}"
    engine, tables = _shop_database(db)
    listener = FailsTwiceThenConfirms(IdempotencyGuard(engine, tables, None))
    with _connected(server.endpoint) as t:
        mid = _fail_twice_dead_letter_and_replay(t, ep, engine, tables, listener, command)
        trace = doc("message", "trace", "order-42", "--db", db, *ep)
        text = cli("message", "trace", "order-42", "--db", db, *ep)
    assert server.terminate() == 0
    try:  # the stopped store tells the same story
        assert doc("message", "trace", "order-42", "--db", db, "--store", str(store)) == trace
    finally:
        engine.dispose()
    _assert_every_step_in_order(trace, mid, role)
    _assert_the_group_s_summary_and_the_outbox_s_rows(trace, mid, role, replay)
    assert text.returncode == 0
    assert line in text.stdout
    assert "tr-billing confirmed it (SUCCESS)" in text.stdout


def _shop_database(db: str) -> tuple[sa.Engine, Any]:
    """The shop's database: the outbox's tables, the billing group declared for the topic."""
    from outbox import OutboxTables, declare_groups

    engine = sa.create_engine(db)
    tables = OutboxTables()
    tables.create_all(engine)
    declare_groups(engine, tables, TR_TOPIC, [TR_GROUP])
    return engine, tables


class FailsTwiceThenConfirms:
    """Billing's listener after a bad deploy: the first two deliveries fail, the next is
    confirmed under the idempotency guard."""

    def __init__(self, guard: Any) -> None:
        self.guard = guard
        self.lock = threading.Lock()
        self.calls: list[int] = []
        self.confirmed = threading.Event()

    def __call__(self, messages: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        with self.lock:
            self.calls.append(messages[0].delivery_attempt)
            if len(self.calls) <= 2:
                return ConsumeResult.RECONSUME_LATER  # a bad deploy: fails every time
        result: ConsumeResult = self.guard.consume(messages[0], TR_GROUP, lambda m: None)
        self.confirmed.set()
        return result


@contextmanager
def _connected(endpoint: str) -> Iterator[Any]:
    """The framework's gRPC transport to `endpoint`, closed on leaving."""
    t = connect("grpc", endpoint=endpoint)
    t.start()
    try:
        yield t
    finally:
        t.close()


def _fail_twice_dead_letter_and_replay(
    t: Any,
    ep: tuple[str, ...],
    engine: sa.Engine,
    tables: Any,
    listener: FailsTwiceThenConfirms,
    command: tuple[str, ...],
) -> str:
    """Publish an order through the outbox; billing fails it twice, it is dead-lettered,
    the operator sends it back with `command`, billing confirms it and the broker shows it
    acknowledged. The order's message id."""
    from outbox import Outbox

    consumer = PushConsumer(
        TR_GROUP,
        listener,
        {TR_TOPIC: "*"},
        transport=t,
        consume_from=ConsumeFrom.FIRST,
        consume_threads=1,
        heartbeat_interval_s=0.5,
        receive_long_poll_ms=1000,
    )
    with consumer, Producer(t) as producer:
        outbox = Outbox(tables, producer)
        with Session(engine) as session, session.begin():
            mid = outbox.publish(session, Message(TR_TOPIC, b"order 42", keys=["order-42"]))

        def dead_lettered() -> bool:
            done = cli("message", "query", "--id", mid, "--topic", f"%DLQ%{TR_GROUP}", *ep)
            return done.returncode == 0

        assert official.wait_for(dead_lettered, timeout_s=60, interval_s=0.5)
        assert len(listener.calls) == 2 and not listener.confirmed.is_set()
        replayed = cli(*(a.format(mid=mid, group=TR_GROUP) for a in command), *ep)
        assert replayed.returncode == 0, replayed.stderr
        assert listener.confirmed.wait(60)

        def settled() -> bool:
            g = doc("message", "trace", "order-42", *ep)["groups"]
            return bool(g) and g[0]["state"] == "acknowledged"

        assert official.wait_for(settled, timeout_s=30, interval_s=0.5)
    return str(mid)


def _assert_every_step_in_order(trace: dict[str, Any], mid: str, role: str) -> None:
    assert trace["message_ids"] == [mid]
    roles = [r["role"] for r in trace["records"]]
    assert roles == ["original", "dead-letter", role]
    steps = [
        (e["source"], e["kind"], e.get("attempt"))
        for e in trace["events"]
        if e["kind"] != "stub-updated"
    ]
    assert steps == [
        ("outbox", "stub-created", None),
        ("broker", "original", None),
        ("broker", "delivered", 1),
        ("broker", "handed-back", 1),  # RECONSUME_LATER
        ("broker", "delivered", 2),
        ("broker", "handed-back", 2),
        ("broker", "dead-letter", None),  # at its last attempt: %DLQ%<group>
        ("broker", "dead-lettered", None),
        ("broker", role, None),  # the operator's copy in %RETRY%<group>
        ("broker", "delivered", 1),
        ("consumer", "confirmed", None),
        ("broker", "acknowledged", None),
    ], json.dumps(trace["events"], indent=1)
    times = [e["time_ms"] for e in trace["events"]]
    assert times == sorted(times)


def _assert_the_group_s_summary_and_the_outbox_s_rows(
    trace: dict[str, Any], mid: str, role: str, replay: str
) -> None:
    group = TR_GROUP
    [g] = trace["groups"]
    assert (
        g["group"],
        g["state"],
        g["deliveries"],
        g["retries"],
        g["dead_lettered"],
        g["reconsumed"],
        g["replayed"],
        g["acknowledged"],
    ) == (
        group,
        "acknowledged",
        3,
        1,
        True,
        int(replay == "reconsume"),
        int(replay == "dlq-replay"),
        True,
    )
    # the copy is the group's alone, and says who sent it back
    [copy] = [r for r in trace["records"] if r["role"] == role]
    assert (copy["topic"], copy["properties"]["OPERATOR"]) == (f"%RETRY%{group}", "oncall")
    [stub] = trace["outbox"]["stubs"]
    assert (stub["message_id"], stub["send_count"], stub["expected_groups"]) == (mid, 1, [group])
    [row] = trace["outbox"]["confirmations"]
    assert (row["group"], row["outcome"]) == (group, "SUCCESS")
