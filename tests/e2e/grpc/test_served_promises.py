"""What the framework's consumers promise holds on both transports: the embedded broker and
our gRPC server in a real subprocess (the production topology).

- an orderly consumer parks a poison message's *message group* until an operator unparks it,
  and the dead letters say which group was parked;
- a stopped consumer's messages are taken over at once, a SIGKILLed one's within the
  server's lease release (not after the whole invisible time);
- `consume_from` decides where a new group starts;
- broadcasting over gRPC fails with an error that names the alternative.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

import reliable
from reliable import (
    ConfigurationError,
    ConsumeContext,
    ConsumeFrom,
    ConsumeResult,
    Message,
    MessageModel,
    Producer,
    PushConsumer,
    ReceivedMessage,
    SimpleConsumer,
    Transport,
)
from reliable.admin import AdminClient
from tests.e2e.grpc import official
from tests.e2e.grpc.conftest import open_transport
from tests.e2e.grpc.server_process import REPO, ServerProcess

# quick client intervals for both engines (pull: rebalance / offsets; receive: long polls)
QUICK = {
    "rebalance_interval_s": 0.2,
    "heartbeat_interval_s": 0.2,
    "persist_offset_interval_s": 0.2,
    "pull_suspend_ms": 200,
    "pull_error_delay_s": 0.1,
    "receive_long_poll_ms": 1000,
    "invisible_ms": 30_000,
}


@pytest.fixture(params=["embedded-pull", "embedded-receive", "grpc-receive"])
def side(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Transport, str]]:
    """A transport and the push consumer's engine on it (both engines on embedded)."""
    name, engine = request.param.split("-")
    for t in open_transport(request, name, tmp_path):
        yield t, engine


def unique(name: str, transport: Transport, *extra: str) -> str:
    return "-".join((name, transport.name, *extra))


def admin_of(transport: Transport) -> AdminClient:
    return AdminClient(transport.endpoint)  # type: ignore[attr-defined]


def dead_letters(transport: Transport, group: str, want: int) -> list[ReceivedMessage]:
    """`want` messages of `%DLQ%<group>`, read (and acked) by a reader group."""
    got: list[ReceivedMessage] = []
    with SimpleConsumer(
        f"{group}-dlq-reader",
        {f"%DLQ%{group}": "*"},
        transport=transport,
        await_duration_s=1,
        invisible_duration_s=15,
    ) as reader:

        def enough() -> bool:
            for m in reader.receive(max_messages=32):
                reader.ack(m)
                got.append(m)
            return len(got) >= want

        official.wait_for(enough, timeout_s=30, interval_s=0)
    return got


class Recorder:
    """A listener recording bodies in consumption order; `fail(body)` says which fail."""

    def __init__(
        self, fail: Callable[[bytes], bool] = lambda _b: False, delay_s: float = 0.0
    ) -> None:
        self.lock = threading.Lock()
        self.bodies: list[bytes] = []
        self.fail = fail
        self.delay_s = delay_s

    def __call__(self, messages: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        for m in messages:
            if self.fail(m.body):
                return ConsumeResult.RECONSUME_LATER
            time.sleep(self.delay_s)
            with self.lock:
                self.bodies.append(m.body)
        return ConsumeResult.SUCCESS

    def seen(self) -> list[bytes]:
        with self.lock:
            return list(self.bodies)


# --- parking (issue items 2 and 3)
def test_orderly_parks_the_poison_group_until_an_operator_unparks_it(
    side: tuple[Transport, str],
) -> None:
    transport, engine = side
    topic = unique("park", transport, engine)
    group = unique("park-g", transport, engine)
    if transport.name == "grpc":  # FIFO is the server group's property
        with_admin = admin_of(transport)
        with_admin.call("CreateGroup", name=group, fifo=True)
    recorder = Recorder(fail=lambda body: body == b"P2")
    consumer = PushConsumer(
        group,
        recorder,
        {topic: "*"},
        transport=transport,
        engine=engine,
        orderly=True,
        max_reconsume_times=1,
        suspend_ms=50,
        consume_from=ConsumeFrom.FIRST,
        **QUICK,
    )

    def of(prefix: bytes) -> list[bytes]:
        return [b for b in recorder.seen() if b.startswith(prefix)]

    def send(producer: Producer, *bodies: str) -> None:
        for body in bodies:
            producer.send(Message(topic, body.encode(), message_group=body[0]))

    with Producer(transport) as producer, consumer:
        send(producer, *[f"{g}{i}" for i in range(6) for g in "PQ"])
        assert official.wait_for(lambda: len(of(b"Q")) == 6 and len(of(b"P")) == 2, timeout_s=60)
        send(producer, "P6", "Q6")
        assert official.wait_for(lambda: len(of(b"Q")) == 7, timeout_s=30)
        parked = dead_letters(transport, group, 5)
        # P stays parked: nothing of it was consumed after P1
        assert of(b"P") == [b"P0", b"P1"]
        # the operator acts: P flows again from its next message
        if transport.name == "grpc":
            assert with_admin.call("ListParkedGroups", group=group)["parked"] == [
                {"group": group, "topic": topic, "message_group": "P"}
            ]
            assert with_admin.call(
                "UnparkMessageGroup", group=group, topic=topic, message_group="P"
            ) == {"unparked": True}
            with_admin.close()
        else:
            broker = transport.broker  # type: ignore[attr-defined]
            assert broker.parked_message_groups(group) == [
                {"group": group, "topic": topic, "message_group": "P"}
            ]
            assert broker.unpark_message_group(group, topic, "P")
        send(producer, "P7")
        assert official.wait_for(lambda: len(of(b"P")) == 3, timeout_s=30)
    assert of(b"P") == [b"P0", b"P1", b"P7"]
    assert of(b"Q") == [f"Q{i}".encode() for i in range(7)]
    assert [m.body for m in parked] == [b"P2", b"P3", b"P4", b"P5", b"P6"]
    for m in parked:
        assert m.properties.get("PARKED_MESSAGE_GROUP") == "P", m.properties
        assert m.properties.get("DLQ_ORIGIN_TOPIC") == topic


def test_parked_group_survives_a_consumer_restart(transport: Transport) -> None:
    """The park is the broker's record, not the consumer's memory."""
    topic, group = unique("park-restart", transport), unique("park-restart-g", transport)
    if transport.name == "grpc":
        admin = admin_of(transport)
        admin.call("CreateGroup", name=group, fifo=True)
        admin.close()
    settings = dict(
        orderly=True, max_reconsume_times=0, suspend_ms=50, consume_from=ConsumeFrom.FIRST, **QUICK
    )
    first = Recorder(fail=lambda body: body == b"A1")
    with Producer(transport) as producer:
        with PushConsumer(group, first, {topic: "*"}, transport=transport, **settings):
            for body in (b"A0", b"A1", b"B0"):
                producer.send(Message(topic, body, message_group=body[:1].decode()))
            assert official.wait_for(
                lambda: dead_letters_count(transport, group) == 1 and b"B0" in first.seen(),
                timeout_s=60,
            )
        second = Recorder()
        with PushConsumer(group, second, {topic: "*"}, transport=transport, **settings):
            for body in (b"A2", b"B1"):
                producer.send(Message(topic, body, message_group=body[:1].decode()))
            assert official.wait_for(lambda: b"B1" in second.seen(), timeout_s=30)
            time.sleep(1.0)  # A2 had its chance to be (wrongly) consumed
    # two message groups: ordered within each, not between them (both may be ready at once)
    assert sorted(first.seen()) == [b"A0", b"B0"]
    assert second.seen() == [b"B1"]
    assert [m.body for m in dead_letters(transport, group, 2)] == [b"A1", b"A2"]


def test_an_orderly_handler_parks_its_group_with_nothing_set_up(transport: Transport) -> None:
    """A new user's orderly handler, with no group created beforehand: over gRPC the consumer
    makes its server group FIFO (keeping its other settings) before the first receive, so
    the poison message's group is parked and none of its later messages is consumed, as on
    the embedded transport."""
    from reliable import Worker, handler

    topic, group = unique("park-new", transport), unique("park-new-g", transport)
    if transport.name == "grpc":  # an existing, non-FIFO group with its own retries
        admin = admin_of(transport)
        admin.call("CreateGroup", name=group, fifo=False, max_retries=5)
    seen: list[bytes] = []

    @handler(
        topic,
        group=group,
        orderly=True,
        max_reconsume_times=1,
        suspend_ms=50,
        consume_from="first",
        **QUICK,
    )
    def ship(message: ReceivedMessage) -> None:
        if message.body == b"P2":
            raise RuntimeError("poison")
        seen.append(message.body)

    with Producer(transport) as producer:
        for i in range(6):
            for g in "PQ":
                producer.send(Message(topic, f"{g}{i}".encode(), message_group=g))
    with Worker(ship, transport=transport):
        assert official.wait_for(lambda: dead_letters_count(transport, group) == 4, timeout_s=60)
        assert official.wait_for(lambda: seen.count(b"Q5") == 1, timeout_s=30)
        time.sleep(1.0)  # a later message of P had its chance to be (wrongly) consumed
    assert [b for b in seen if b.startswith(b"P")] == [b"P0", b"P1"]
    assert [b for b in seen if b.startswith(b"Q")] == [f"Q{i}".encode() for i in range(6)]
    if transport.name == "grpc":
        info = admin.call("GetGroup", name=group)
        admin.close()
        assert (info["fifo"], info["max_retries"]) == (True, 5), info


def dead_letters_count(transport: Transport, group: str) -> int:
    """How many dead letters `%DLQ%<group>` holds (without consuming them)."""
    if transport.name == "grpc":
        admin = admin_of(transport)
        try:
            info = admin.call("GetTopic", name=f"%DLQ%{group}")
        except Exception:  # not created yet
            return 0
        finally:
            admin.close()
        return sum(q["max_offset"] - q["min_offset"] for q in info["queues"])
    broker = transport.broker  # type: ignore[attr-defined]
    cfg = broker.get_topic(f"%DLQ%{group}")
    if cfg is None:
        return 0
    return sum(broker.max_offset(cfg.name, q) for q in range(cfg.read_queue_nums))


# --- takeover (issue item 4)
def test_a_stopped_consumer_hands_its_messages_over_at_once(side: tuple[Transport, str]) -> None:
    transport, engine = side
    topic = unique("handover", transport, engine)
    group = unique("handover-g", transport, engine)
    slow, fast = Recorder(delay_s=0.3), Recorder()
    settings = dict(consume_threads=2, consume_from=ConsumeFrom.FIRST, **QUICK)
    a = PushConsumer(group, slow, {topic: "*"}, transport=transport, engine=engine, **settings)
    b = PushConsumer(group, fast, {topic: "*"}, transport=transport, engine=engine, **settings)
    with Producer(transport) as producer:
        a.start()
        sent = {f"m{i}".encode() for i in range(40)}
        for body in sorted(sent):
            producer.send(Message(topic, body))
        assert official.wait_for(lambda: len(slow.seen()) >= 2, timeout_s=30)
        b.start()
        try:
            stopped = time.monotonic()
            a.shutdown()  # returns once its handlers finished and it left the group
            assert official.wait_for(
                lambda: set(slow.seen()) | set(fast.seen()) == sent, timeout_s=30
            )
            took = time.monotonic() - stopped
        finally:
            b.shutdown()
    # what `a` held was handed over at once, not after its 30 s lease
    assert set(slow.seen() + fast.seen()) == sent
    if engine == "receive":  # invisible time: no rebalance, so every message exactly once
        assert sorted(slow.seen() + fast.seen()) == sorted(sent)
    assert took < 10, took


def test_a_killed_consumer_releases_its_messages_within_the_lease_release(
    make_server: Callable[..., ServerProcess],
) -> None:
    """A real consumer process is SIGKILLed while handling: the server notices the dead
    connection and releases its messages after the stream grace (3 s), far sooner than the
    60 s auto-renewed invisible time or the consumer's 30 s lease."""
    server = make_server("--default-invisible-ms", "60000")
    topic, group = "killed", "killed-g"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.grpc.consumer_child", server.endpoint, group, topic],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=REPO,
    )
    handling: list[str] = []
    lines: list[str] = []

    def pump() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line)
            if line.startswith("handling "):
                handling.append(line.split()[1])

    threading.Thread(target=pump, daemon=True).start()
    t = reliable.connect("grpc", endpoint=server.endpoint)
    t.start()
    try:
        assert official.wait_for(
            lambda: any(x.startswith("started") for x in lines), timeout_s=30
        ), lines
        with Producer(t) as producer:
            sent = {producer.send(Message(topic, f"k{i}".encode())).message_id for i in range(6)}
        assert official.wait_for(lambda: len(handling) == 2, timeout_s=30), lines
        time.sleep(0.5)
        assert len(handling) == 2  # two handler threads, nothing more taken from the group
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        killed = time.monotonic()
        done = Recorder()
        with PushConsumer(
            group,
            done,
            {topic: "*"},
            transport=t,
            consume_threads=4,
            consume_from=ConsumeFrom.FIRST,
            receive_long_poll_ms=1000,
        ):
            assert official.wait_for(lambda: len(done.seen()) == 6, timeout_s=40)
            took = time.monotonic() - killed
    finally:
        if child.poll() is None:
            child.kill()
        t.close()
    assert sorted(done.seen()) == sorted(f"k{i}".encode() for i in range(6))
    assert set(handling) <= sent
    assert took < 15, took  # the stream grace + release, not the 60 s invisible time


# --- where a new group starts (issue item 5)
def test_consume_from_decides_where_a_new_group_starts(side: tuple[Transport, str]) -> None:
    transport, engine = side
    topic = unique("start", transport, engine)
    with Producer(transport) as producer:
        for body in (b"old-1", b"old-2"):
            producer.send(Message(topic, body))
        time.sleep(0.05)
        boundary_ms = int(time.time() * 1000)
        time.sleep(0.05)
        producer.send(Message(topic, b"old-3"))
        queues = transport.route(topic).read_queues
        # stored is not yet queued: LAST means after what the queues hold
        assert official.wait_for(
            lambda: (
                sum(
                    transport.max_offset(q)  # type: ignore[attr-defined]
                    for q in queues
                )
                == 3
            ),
            timeout_s=10,
        )
        expected = {
            ConsumeFrom.FIRST: [b"new-1", b"old-1", b"old-2", b"old-3"],
            ConsumeFrom.LAST: [b"new-1"],
            ConsumeFrom.TIMESTAMP: [b"new-1", b"old-3"],
        }
        recorders = {where: Recorder() for where in expected}
        consumers = [
            PushConsumer(
                unique("start-g", transport, engine, where.value),
                recorders[where],
                {topic: "*"},
                transport=transport,
                engine=engine,
                consume_from=where,
                consume_timestamp_ms=boundary_ms,
                **QUICK,
            )
            for where in expected
        ]
        for c in consumers:
            c.start()
        try:
            producer.send(Message(topic, b"new-1"))
            assert official.wait_for(
                lambda: all(len(recorders[w].seen()) >= len(expected[w]) for w in expected),
                timeout_s=30,
            )
            time.sleep(1.0)  # anything older that was (wrongly) delivered has arrived now
        finally:
            for c in consumers:
                c.shutdown()
    for where, want in expected.items():
        assert sorted(recorders[where].seen()) == want, where


def test_a_handler_started_before_publishing_consumes_with_the_default_start(
    transport: Transport,
) -> None:
    """The README's flow: a Worker started with a handler and its `dlq_handler`, then
    messages sent, with `consume_from` left at its default (LAST): every message sent after
    the start is consumed, and one raising a `dead_letter_on` exception reaches the dead
    letter handler at once, on both."""
    from reliable import Worker, dlq_handler, handler

    class InvalidOrder(Exception):
        pass

    topic, group = unique("readme", transport), unique("readme-g", transport)
    got: list[bytes] = []
    dead: list[tuple[bytes, str]] = []

    @handler(topic, group=group, dead_letter_on=(InvalidOrder,))
    def bill(message: ReceivedMessage) -> None:
        if message.body == b"invalid":
            raise InvalidOrder("unparseable")
        got.append(message.body)

    @dlq_handler(group)
    def billing_dead_letters(message: ReceivedMessage) -> None:
        dead.append((message.body, message.properties["DLQ_ORIGIN_TOPIC"]))

    with (
        Worker(bill, billing_dead_letters, transport=transport) as worker,
        worker.producer() as producer,
    ):
        producer.send(Message(topic, b'{"id": 42}', keys=["order-42"]))
        producer.send(Message(topic, b"invalid"))
        assert official.wait_for(lambda: got == [b'{"id": 42}'] and len(dead) == 1, timeout_s=30), (
            got,
            dead,
        )
        assert dead == [(b"invalid", topic)]


def test_the_readme_outbox_snippet_consumes_what_was_published_before(
    transport: Transport, sqlite_url: str, redis_client: object
) -> None:
    """The README's outbox snippet, as written: the message is published (after commit)
    before the inventory handler ever ran; its `consume_from="first"` makes the new group
    read it, on both transports, and the guard confirms it exactly once."""
    import uuid

    import sqlalchemy as sa
    from sqlalchemy.orm import Session

    from idempotency import GuardConfig, IdempotencyGuard
    from outbox import Outbox, OutboxTables, declare_groups
    from reliable import Worker, handler

    topic, group = unique("OrderCreated", transport), unique("inventory", transport)
    engine = sa.create_engine(sqlite_url)
    tables = OutboxTables()
    tables.create_all(engine)
    declare_groups(engine, tables, topic, [group])
    with Producer(transport) as producer:
        outbox = Outbox(tables, producer)
        with Session(engine) as session, session.begin():
            message_id = outbox.publish(session, Message(topic, b'{"order": 1}'))
    guard = IdempotencyGuard(
        engine,
        tables,
        redis_client,  # type: ignore[arg-type]
        config=GuardConfig(key_prefix=f"t:{uuid.uuid4().hex[:8]}:"),
    )
    reserved: list[str] = []

    @handler(topic, group=group, idempotent=guard, consume_from="first")
    def reserve(message: ReceivedMessage, session: Session) -> None:
        reserved.append(message.message_id)

    def confirmed() -> list[tuple[str, str]]:
        with engine.connect() as conn:
            c = tables.confirmation.c
            return [tuple(r) for r in conn.execute(sa.select(c.message_id, c.consumer_group))]

    with Worker(reserve, transport=transport):
        assert official.wait_for(lambda: confirmed() == [(message_id, group)], timeout_s=30)
        time.sleep(0.5)  # a second (wrong) run would have happened by now
    assert reserved == [message_id]
    engine.dispose()


# --- broadcasting (issue item 6)
def test_broadcasting_over_grpc_names_the_alternative(server: ServerProcess) -> None:
    t = reliable.connect("grpc", endpoint=server.endpoint)
    with pytest.raises(ConfigurationError) as caught:
        PushConsumer(
            "stats",
            lambda msgs, ctx: ConsumeResult.SUCCESS,
            {"clicks": "*"},
            transport=t,
            message_model=MessageModel.BROADCASTING,
        )
    text = str(caught.value)
    assert "broadcasting needs a transport that can pull" in text
    assert "own consumer group" in text and "stats-<instance name>" in text
    assert "docs/client.md" in text
    docs = (REPO / "docs" / "client.md").read_text()
    assert "### Broadcasting" in docs and "own consumer group" in docs
    # every place that offers broadcasting says it is embedded-only, with the alternative
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "broadcasting needs the embedded transport" in readme
    assert "its own consumer group" in readme
