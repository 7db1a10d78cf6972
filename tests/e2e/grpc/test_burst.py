"""The served broker under a burst of clients: stored once, answered in time, refused cleanly.

- Four producer processes issue 1,000 sends each at once against `reliable broker start
  --flush sync`, over gRPC (the protocol's stubs) and over the native wire (the framework's
  `NativeStub`), each call with a 3 s deadline, and resend by the same message id until
  acknowledged (`bench.burst`): every message is stored exactly once (read back from the
  commitlog on disk), every call is answered OK or refused with a status a client backs off
  from, and the server's log has at most one line per kind (no traceback).
- A send abandoned by its client before it is stored, while it is stored, and after it is
  stored (while its fsync is awaited), then resent by the same message id: one copy, and
  the resend gets the first send's offset.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from bench.burst import ABANDONED, OK, REFUSALS, Plan, run_burst
from broker.broker import Broker
from broker.server.codes import Code
from broker.server.config import ServerConfig
from broker.server.server import MessagingServer
from protocol.pb import service_pb2, service_pb2_grpc
from reliable.transport._native_wire import NativeStub
from tests.e2e.grpc.server_process import ServerProcess, stored_records
from tests.e2e.grpc.test_batched_rpcs import sync_flush_broker

TOPIC = "burst"
MD = (("x-mq-client-id", "burst-test"),)
WIRES = ["grpc", "wire"]


# --- the burst, against a real server process


@pytest.mark.timeout(240)
@pytest.mark.parametrize("wire", WIRES)
def test_a_burst_of_four_producers_is_stored_once_answered_or_refused(
    wire: str, make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = make_server("--flush", "sync", "--wire-port", "0")
    # Each call's deadline is 15 s, not the official client's 3 s (`bench burst` keeps 3 s):
    # in the suite the server shares two cores with three workers, and 4,000 calls each
    # due in 3 s are then a rate the server must reach, a timing assertion (a suite run saw
    # 1,510 calls pass their deadline; 10 s failed beside six busy loops, 15 s did not).
    # The test is about what the server answers and stores, at whatever speed it gets.
    plan = Plan(producers=4, per_producer=1000, deadline_s=15.0, budget_s=90.0, topic=TOPIC)
    started = time.monotonic()
    outcome = run_burst(wire, server.endpoint, plan, server.wire_port)
    minutes = (time.monotonic() - started) / 60
    assert server.terminate() == 0
    # every call answered: OK, or refused with a status a client backs off from
    unexpected = {k: n for k, n in outcome.calls.items() if k != OK and k not in REFUSALS}
    assert not unexpected, (unexpected, dict(outcome.calls))
    assert not any(outcome.calls[k] for k in ABANDONED)
    assert outcome.unacknowledged == 0
    assert len(outcome.acknowledged) == len(set(outcome.acknowledged)) == 4000
    assert outcome.first_answer_s is not None and outcome.first_answer_s < plan.deadline_s
    # what the store holds, read from disk: each message exactly once
    copies = collections.Counter(r.msg_id for r in stored_records(server.store) if r.topic == TOPIC)
    assert set(copies) == set(outcome.acknowledged)
    assert {n for n in copies.values()} == {1}
    # the log: no traceback, at most one line per kind a minute
    log = "".join(server.output)
    assert "Traceback" not in log and "ExecuteBatchError" not in log, log[-3000:]
    for kind in ("refusing sends", "gave up on"):
        lines = sum(1 for line in server.output if kind in line)
        assert lines <= 1 + int(minutes), (kind, lines)


# --- a send abandoned before, during and after storing, then resent


class SlowStore:
    """Slows the served broker at one named seam, on demand: its appends (the loop blocks
    in the store, as a slow disk would make it) or the fsync a send's answer waits for."""

    def __init__(self, broker: Broker) -> None:
        self.append_s = 0.0
        self.durable_s = 0.0
        send_bodies, when_durable = broker.send_bodies, broker.when_durable

        def slow_send_bodies(*args: Any, **kwargs: Any) -> Any:
            if self.append_s:
                time.sleep(self.append_s)
            return send_bodies(*args, **kwargs)

        def slow_when_durable(end: int, callback: Callable[[bool], None]) -> bool:
            if not self.durable_s:
                return when_durable(end, callback)

            def later(ok: bool) -> None:
                threading.Timer(self.durable_s, callback, (ok,)).start()

            return when_durable(end, later)

        broker.send_bodies = slow_send_bodies  # type: ignore[method-assign]
        broker.when_durable = slow_when_durable  # type: ignore[method-assign]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Broker, MessagingServer, SlowStore]]:
    broker = sync_flush_broker(tmp_path)
    slow = SlowStore(broker)
    # these tests abandon calls; none may be refused instead. With the default, a call the
    # loop read late but before its deadline (the slow store just behind it, a loaded
    # machine) was answered TOO_MANY_REQUESTS in time, and its client saw no deadline
    # pass. 0 refuses nothing, and a call read past its deadline is still not stored.
    server = MessagingServer(broker, ServerConfig(port=0, wire_port=0, min_send_time_ms=0))
    server.start()
    try:
        yield broker, server, slow
    finally:
        server.stop()
        broker.shutdown()


@pytest.fixture(params=WIRES)
def stub(request: pytest.FixtureRequest, served: tuple[Broker, MessagingServer, SlowStore]) -> Any:
    server = served[1]
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    made: Any = service_pb2_grpc.MessagingServiceStub(channel)
    if request.param == "wire":
        made = NativeStub(made, None, host="127.0.0.1", ask_port=None, port=server.wire_port)
    yield made
    if isinstance(made, NativeStub):
        made.close()
    channel.close()


def _send(message_id: str) -> Any:
    request = service_pb2.SendMessageRequest()
    m = request.messages.add()
    m.topic.name = TOPIC
    m.body = message_id.encode()
    sp = m.system_properties
    sp.message_id = message_id
    sp.message_type = 1
    sp.body_encoding = 1
    sp.born_host = "127.0.0.1"
    sp.born_timestamp.GetCurrentTime()
    return request


def _abandon(stub: Any, message_id: str, timeout_s: float) -> None:
    """A send given up at its deadline (it must not be answered in time)."""
    with pytest.raises(grpc.RpcError) as raised:
        stub.SendMessage(_send(message_id), metadata=MD, timeout=timeout_s)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def _resend(stub: Any, message_id: str) -> int:
    """The same message again, answered OK: its offset."""
    reply = stub.SendMessage(_send(message_id), metadata=MD, timeout=10)
    assert reply.status.code == Code.OK, reply.status
    return int(reply.entries[0].offset)


def _copies(broker: Broker, message_id: str) -> int:
    assert broker.store.wait_dispatched(timeout_s=10.0)
    found = 0
    for queue in range(broker.get_topic(TOPIC).write_queue_nums):
        for offset in range(broker.store.get_max_offset_in_queue(TOPIC, queue)):
            ext = broker.store.get_message_by_queue_offset(TOPIC, queue, offset)
            found += ext is not None and ext.msg_id == message_id
    return found


def test_a_send_abandoned_while_it_is_stored_is_stored_once(
    served: tuple[Broker, MessagingServer, SlowStore], stub: Any
) -> None:
    broker, _, slow = served
    message_id = uuid.uuid4().hex.upper()
    slow.append_s = 0.8  # the loop is in the store past the call's deadline
    _abandon(stub, message_id, 0.3)
    slow.append_s = 0.0
    first = _resend(stub, message_id)
    assert _resend(stub, message_id) == first
    assert _copies(broker, message_id) == 1


def test_a_send_abandoned_after_it_is_stored_is_stored_once(
    served: tuple[Broker, MessagingServer, SlowStore], stub: Any
) -> None:
    """Stored, its fsync still awaited when the client gives up: the resend that comes
    meanwhile waits for the first send's result, and one that comes after gets it too."""
    broker, _, slow = served
    message_id = uuid.uuid4().hex.upper()
    slow.durable_s = 1.2
    _abandon(stub, message_id, 0.3)
    during = _resend(stub, message_id)  # the first send is still awaiting its fsync
    slow.durable_s = 0.0
    time.sleep(1.2)  # the first send's result has come by now
    assert _resend(stub, message_id) == during
    assert _copies(broker, message_id) == 1


def test_a_send_abandoned_before_it_is_read_is_not_stored_and_its_resend_is(
    served: tuple[Broker, MessagingServer, SlowStore], stub: Any
) -> None:
    """The loop is held up by another send while this one waits to be read past its
    deadline: not stored, not answered; its resend is stored once."""
    broker, server, slow = served
    blocker, message_id = uuid.uuid4().hex.upper(), uuid.uuid4().hex.upper()
    slow.append_s = 1.0

    async def both() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            aio = service_pb2_grpc.MessagingServiceStub(channel)
            first = asyncio.ensure_future(aio.SendMessage(_send(blocker), metadata=MD, timeout=5))
            await asyncio.sleep(0.2)  # the server's loop is in the slow store now
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await aio.SendMessage(_send(message_id), metadata=MD, timeout=0.3)
            assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert (await first).status.code == Code.OK

    asyncio.run(both())
    slow.append_s = 0.0
    time.sleep(0.2)
    assert _copies(broker, message_id) == 0  # read after its deadline: not stored
    first = _resend(stub, message_id)
    assert _resend(stub, message_id) == first
    assert _copies(broker, message_id) == 1
    assert _copies(broker, blocker) == 1


def test_abandoned_calls_are_counted_and_logged_once_a_minute(
    served: tuple[Broker, MessagingServer, SlowStore], caplog: pytest.LogCaptureFixture
) -> None:
    _, server, slow = served
    caplog.set_level(logging.INFO)
    slow.append_s = 0.5
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    plain = service_pb2_grpc.MessagingServiceStub(channel)
    try:
        for _ in range(3):
            _abandon(plain, uuid.uuid4().hex.upper(), 0.2)
        time.sleep(0.6)  # their answers were made after their deadlines
    finally:
        channel.close()
    assert server.ctx.overload.abandoned_calls >= 2  # one may end in gRPC before it is read
    lines = [r for r in caplog.records if "gave up on" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert not [r for r in caplog.records if r.exc_info], "no traceback for an abandoned call"
