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


TOPIC, GROUP = "t-ha-reads", "g-ha-reads"
OTHER, PUSHED = "g-ha-reads-official", "g-ha-reads-push"  # the official clients' groups


class Reader:
    """The framework's SimpleConsumer: every delivery counted by id. While asked to hold,
    the first `hold` of group a's messages stay leased, never acknowledged, and the next
    one is dead-lettered (its copy is written by a's master once it is back)."""

    def __init__(self, consumer: SimpleConsumer, transport: Any, group_a: str) -> None:
        self.consumer, self.transport, self.group_a = consumer, transport, group_a
        self.got: Counter[str] = Counter()  # every delivery to the framework consumer, by id
        self.held: set[str] = set()  # received from a's slave and never acknowledged there
        self.dead: set[str] = set()  # dead-lettered on a's slave

    def take(self, batch: int = 16, hold: int = 0) -> list[Any]:
        try:
            received = self.consumer.receive(max_messages=batch)
        except ReliableError:  # a group changing hands: the next route has it
            return []
        for m in received:
            self.got[m.message_id] += 1
            if hold and _group_of(m) == self.group_a:
                if len(self.held) < hold:
                    self.held.add(m.message_id)  # leased on the slave, never acknowledged
                    continue
                if not self.dead:  # its copy is written by the master once it is back
                    self.transport.forward_to_dlq(GROUP, m)
                    self.dead.add(m.message_id)
                    continue
            self.consumer.ack(m)
        return received


def test_a_dead_master_s_messages_are_read_from_its_slave_and_its_acks_survive_its_return(
    cluster: Cluster,
) -> None:
    a, b = cluster.groups
    slave = a.slaves[0]
    transport = reliable.connect("grpc", endpoint=cluster.endpoint)
    transport.start()
    try:
        with (
            SimpleConsumer(
                GROUP,
                {TOPIC: "*"},
                transport=transport,
                await_duration_s=1,
                invisible_duration_s=30,
            ) as consumer,
            Producer(transport) as producer,
        ):
            reader = Reader(consumer, transport, a.name)
            reader.take(1)  # the group exists before the sends
            _create_groups(cluster.endpoint, OTHER, PUSHED)
            sent = _send(producer, "p", 60)
            in_a = _some_consumed_on_the_master_and_synced_to_its_slave(reader, a)
            before_kill = set(reader.got)

            a.master.kill()
            sent |= _sends_go_to_group_b_and_its_slave_serves_group_a(producer, a, b)
            # the framework consumer receives every message, a's from the slave; three of
            # a's stay leased there, unacknowledged
            assert official.wait_for(
                lambda: (reader.take(hold=3), set(reader.got) >= sent)[1], timeout_s=60
            )
            assert len(reader.held) == 3 and len(reader.dead) == 1
            acked_on_slave = in_a - before_kill - reader.held - reader.dead
            assert acked_on_slave
            assert max(reader.got.values()) == 1  # nothing was delivered twice so far
            on_slave = _the_official_consumers_read_group_a_from_its_slave(cluster, slave, in_a)

            # the master comes back: the slave stops serving, its acknowledgements reach
            # the master, and consuming goes on from there
            a.master.start()
            sent |= _the_slave_stops_serving_and_sends_go_on(producer, a, b)
            assert official.wait_for(
                lambda: (
                    reader.take(),
                    set(reader.got) >= sent and all(reader.got[i] == 2 for i in reader.held),
                )[1],
                timeout_s=60,
            )
            # a few more receives: anything acknowledged on the slave coming again shows up
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                reader.take()
    finally:
        transport.close()
    got, held, dead = reader.got, reader.held, reader.dead
    # the master wrote the dead-letter copy the slave deferred to it
    assert official.wait_for(lambda: _dead_lettered(a.master.store, GROUP) == dead)
    # only what was leased on the slave and never acknowledged there came again
    again = {i for i, n in got.items() if n > 1}
    assert again == held, f"delivered again: {sorted(again - held)[:10]}"
    assert all(got[i] == 1 for i in acked_on_slave)
    # the official group's acknowledgements on the slave reached the master: its offsets
    # there are at least the slave's (it never consumed from the master itself)
    assert official.wait_for(
        lambda: all(
            (_committed(a.master.endpoint, OTHER, TOPIC).get(q) or 0) >= offset
            for q, offset in on_slave.items()
            if offset is not None
        )
    ), (_committed(a.master.endpoint, OTHER, TOPIC), on_slave)


def _create_groups(endpoint: str, *names: str) -> None:
    """Create the groups on every master (slaves get them by sync)."""
    admin = AdminClient(endpoint)
    try:
        for name in names:
            admin.call("CreateGroup", name=name)
    finally:
        admin.close()


def _send(producer: Producer, prefix: str, n: int) -> set[str]:
    return {producer.send(Message(TOPIC, f"{prefix}{i}".encode())).message_id for i in range(n)}


def _some_consumed_on_the_master_and_synced_to_its_slave(reader: Reader, a: Any) -> set[str]:
    """Some consumed on group a's master, and its offsets synced to its slave, which
    refuses receives while its master is up; the ids group a holds."""
    slave = a.slaves[0]
    assert official.wait_for(
        lambda: sum(reader.got.values()) >= 20 or not reader.take(), timeout_s=30
    )
    assert official.wait_for(
        lambda: (
            _committed(slave.endpoint, GROUP, TOPIC)
            == _committed(a.master.endpoint, GROUP, TOPIC)
            != {}
        ),
        timeout_s=30,
    )
    # its master is up: the slave refuses receives (they go to the master)
    assert _receive_status(slave.endpoint, GROUP, TOPIC) == FORBIDDEN
    in_a = set(_ids_in_store(a.master.store, TOPIC))
    assert in_a - set(reader.got), "group a holds messages nobody received yet"
    return in_a


def _sends_go_to_group_b_and_its_slave_serves_group_a(
    producer: Producer, a: Any, b: Any
) -> set[str]:
    """With a's master dead, sends never stop: they go to group b, and every other server
    names a's slave for its receives (READ only). The ids sent."""
    slave = a.slaves[0]
    after_kill = _send(producer, "q", 20)
    assert not after_kill & set(_ids_in_store(slave.store, TOPIC))
    served = (a.name, 0, 0, READ, slave.port)
    assert official.wait_for(lambda: served in _route(b.master.endpoint, TOPIC))
    return after_kill


def _the_official_consumers_read_group_a_from_its_slave(
    cluster: Cluster, slave: Any, in_a: set[str]
) -> dict[int, int | None]:
    """The official SimpleConsumer and PushConsumer, started now, read group a from the
    slave too (the push consumer's assignment names it); the official group's committed
    offsets on the slave."""
    recorder = Recorder(lambda m, failed: False)
    push = push_consumer(cluster.endpoint, PUSHED, TOPIC, recorder)
    simple = official.simple_consumer(cluster.endpoint, OTHER, TOPIC, await_s=1)
    try:
        official_got = official.receive_until(
            simple, lambda ms: {m.message_id for m in ms} >= in_a, timeout_s=30
        )
        assert official.wait_for(lambda: set(recorder.ok) >= in_a, timeout_s=30)
    finally:
        simple.shutdown()
        push.shutdown()
    assert {m.message_id for m in official_got} >= in_a
    on_slave = _committed(slave.endpoint, OTHER, TOPIC)
    assert on_slave and all(on_slave.values())
    return on_slave


def _the_slave_stops_serving_and_sends_go_on(producer: Producer, a: Any, b: Any) -> set[str]:
    """a's master is back: every other server routes to it again, its slave refuses
    receives again, and sends go on. The ids sent."""
    slave = a.slaves[0]
    back = (a.name, 0, 0, READ_WRITE, a.master.port)
    assert official.wait_for(lambda: back in _route(b.master.endpoint, TOPIC))
    assert official.wait_for(lambda: _receive_status(slave.endpoint, GROUP, TOPIC) == FORBIDDEN)
    return _send(producer, "r", 20)
