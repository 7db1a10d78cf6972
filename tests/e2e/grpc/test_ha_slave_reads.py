"""Reading from a slave while its master is down (docs/ha.md, "Reading from a slave"), with
real processes on loopback: two broker groups of a sync-master and a slave each.

Group a's master is SIGKILLed: sends go on to group b, and consumers (the framework's grpc
transport and the official SimpleConsumer) keep receiving and acknowledging group a's
messages from its slave. The master is restarted: what was acknowledged on the slave is
not handed out again (only what was received there and not acknowledged comes again), and
consuming goes on from the master.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import reliable
from reliable import Message, Producer, SimpleConsumer
from reliable.admin import AdminClient
from reliable.errors import ReliableError
from tests.e2e.grpc import official
from tests.e2e.grpc.cluster_process import Cluster
from tests.e2e.grpc.conftest import FAST
from tests.e2e.grpc.server_process import stored_records
from tests.e2e.grpc.test_cluster import READ, READ_WRITE, _ids_in_store, _route
from tests.e2e.grpc.test_push import Recorder, push_consumer


@pytest.fixture
def cluster(tmp_path: Path, client_home: Path) -> Iterator[Cluster]:
    made = Cluster(
        tmp_path / "cluster", client_home, *FAST, "--ha-config-sync-ms", "300", role="sync-master"
    ).start()
    yield made
    made.kill()


def _committed(endpoint: str, group: str, topic: str) -> dict[int, int | None]:
    """The group's committed offset per queue of `topic`, as `endpoint` has it."""
    admin = AdminClient(endpoint)
    try:
        progress = admin.call("GroupProgress", group=group)
    except ReliableError:
        return {}
    finally:
        admin.close()
    return {
        q["queue_id"]: q["committed_offset"]
        for t in progress.get("topics", [])
        if t["topic"] == topic
        for q in t["queues"]
    }


FORBIDDEN = 40300


def _receive_status(endpoint: str, group: str, topic: str) -> int:
    """The status of one ReceiveMessage (one message, no wait) asked of `endpoint`."""
    import grpc
    from rocketmq.grpc_protocol import service_pb2, service_pb2_grpc

    request = service_pb2.ReceiveMessageRequest()
    request.group.name = group
    request.message_queue.topic.name = topic
    request.message_queue.id = -1
    request.filter_expression.type = 1  # TAG
    request.filter_expression.expression = "*"
    request.batch_size = 1
    request.invisible_duration.seconds = 30
    request.long_polling_timeout.seconds = 1
    with grpc.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        for response in stub.ReceiveMessage(
            request, metadata=[("x-mq-client-id", "slave-probe")], timeout=10
        ):
            if response.WhichOneof("content") == "status":
                return int(response.status.code)
    raise AssertionError("ReceiveMessage answered no status")


def _dead_lettered(store: Path, group: str) -> set[str]:
    """The original ids of the messages in a store's dead-letter topic of `group`."""
    return {
        m.properties["DLQ_ORIGIN_MESSAGE_ID"]
        for m in stored_records(store)
        if m.topic == f"%DLQ%{group}"
    }


def _group_of(message: Any) -> str:
    return str(message.source)


def test_a_dead_master_s_messages_are_read_from_its_slave_and_its_acks_survive_its_return(
    cluster: Cluster,
) -> None:
    a, b = cluster.groups
    slave = a.slaves[0]
    topic, group, other = "t-ha-reads", "g-ha-reads", "g-ha-reads-official"
    pushed = "g-ha-reads-push"
    transport = reliable.connect("grpc", endpoint=cluster.endpoint)
    transport.start()
    got: Counter[str] = Counter()  # every delivery to the framework consumer, by id
    held: set[str] = set()  # received from a's slave and never acknowledged there
    dead: set[str] = set()  # dead-lettered on a's slave
    try:
        with (
            SimpleConsumer(
                group,
                {topic: "*"},
                transport=transport,
                await_duration_s=1,
                invisible_duration_s=30,
            ) as consumer,
            Producer(transport) as producer,
        ):

            def take(batch: int = 16, hold: int = 0) -> list[Any]:
                try:
                    received = consumer.receive(max_messages=batch)
                except ReliableError:  # a group changing hands: the next route has it
                    return []
                for m in received:
                    got[m.message_id] += 1
                    if hold and _group_of(m) == a.name:
                        if len(held) < hold:
                            held.add(m.message_id)  # leased on the slave, never acknowledged
                            continue
                        if not dead:  # its copy is written by the master once it is back
                            transport.forward_to_dlq(group, m)
                            dead.add(m.message_id)
                            continue
                    consumer.ack(m)
                return received

            take(1)  # the group exists before the sends
            admin = AdminClient(cluster.endpoint)  # every master (slaves get it by sync)
            try:
                admin.call("CreateGroup", name=other)
                admin.call("CreateGroup", name=pushed)
            finally:
                admin.close()
            sent = {producer.send(Message(topic, f"p{i}".encode())).message_id for i in range(60)}
            # some consumed on the master, and its offsets synced to its slave
            assert official.wait_for(lambda: sum(got.values()) >= 20 or not take(), timeout_s=30)
            assert official.wait_for(
                lambda: (
                    _committed(slave.endpoint, group, topic)
                    == _committed(a.master.endpoint, group, topic)
                    != {}
                ),
                timeout_s=30,
            )
            # its master is up: the slave refuses receives (they go to the master)
            assert _receive_status(slave.endpoint, group, topic) == FORBIDDEN
            in_a = set(_ids_in_store(a.master.store, topic))
            assert in_a - set(got), "group a holds messages nobody received yet"
            before_kill = set(got)

            a.master.kill()
            # sends never stop: they go to group b
            after_kill = {
                producer.send(Message(topic, f"q{i}".encode())).message_id for i in range(20)
            }
            sent |= after_kill
            assert not after_kill & set(_ids_in_store(slave.store, topic))
            # every other server names a's slave for its receives (READ only)
            served = (a.name, 0, 0, READ, slave.port)
            assert official.wait_for(lambda: served in _route(b.master.endpoint, topic))

            # the framework consumer receives every message, a's from the slave; three of
            # a's stay leased there, unacknowledged
            assert official.wait_for(lambda: (take(hold=3), set(got) >= sent)[1], timeout_s=60)
            assert len(held) == 3 and len(dead) == 1
            acked_on_slave = in_a - before_kill - held - dead
            assert acked_on_slave
            assert max(got.values()) == 1  # nothing was delivered twice so far

            # the official SimpleConsumer and PushConsumer, started now, read group a from
            # the slave too (the push consumer's assignment names it)
            recorder = Recorder(lambda m, failed: False)
            push = push_consumer(cluster.endpoint, pushed, topic, recorder)
            simple = official.simple_consumer(cluster.endpoint, other, topic, await_s=1)
            try:
                official_got = official.receive_until(
                    simple, lambda ms: {m.message_id for m in ms} >= in_a, timeout_s=30
                )
                assert official.wait_for(lambda: set(recorder.ok) >= in_a, timeout_s=30)
            finally:
                simple.shutdown()
                push.shutdown()
            assert {m.message_id for m in official_got} >= in_a
            on_slave = _committed(slave.endpoint, other, topic)
            assert on_slave and all(on_slave.values())

            # the master comes back: the slave stops serving, its acknowledgements reach
            # the master, and consuming goes on from there
            a.master.start()
            back = (a.name, 0, 0, READ_WRITE, a.master.port)
            assert official.wait_for(lambda: back in _route(b.master.endpoint, topic))
            assert official.wait_for(
                lambda: _receive_status(slave.endpoint, group, topic) == FORBIDDEN
            )
            later = {producer.send(Message(topic, f"r{i}".encode())).message_id for i in range(20)}
            sent |= later
            assert official.wait_for(
                lambda: (take(), set(got) >= sent and all(got[i] == 2 for i in held))[1],
                timeout_s=60,
            )
            # a few more receives: anything acknowledged on the slave coming again shows up
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                take()
    finally:
        transport.close()
    # the master wrote the dead-letter copy the slave deferred to it
    assert official.wait_for(lambda: _dead_lettered(a.master.store, group) == dead)
    # only what was leased on the slave and never acknowledged there came again
    again = {i for i, n in got.items() if n > 1}
    assert again == held, f"delivered again: {sorted(again - held)[:10]}"
    assert all(got[i] == 1 for i in acked_on_slave)
    # the official group's acknowledgements on the slave reached the master: its offsets
    # there are at least the slave's (it never consumed from the master itself)
    assert official.wait_for(
        lambda: all(
            (_committed(a.master.endpoint, other, topic).get(q) or 0) >= offset
            for q, offset in on_slave.items()
            if offset is not None
        )
    ), (_committed(a.master.endpoint, other, topic), on_slave)
