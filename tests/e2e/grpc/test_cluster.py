"""Broker groups with real processes on loopback (docs/ha.md, Broker groups): every server
routes every group; killing one group's master never stops sends."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import pytest

import reliable
from reliable import Message, Producer
from tests.e2e.grpc import official
from tests.e2e.grpc.cluster_process import Cluster
from tests.e2e.grpc.conftest import FAST
from tests.e2e.grpc.server_process import ServerProcess, stored_records


@pytest.fixture
def cluster(tmp_path: Path, client_home: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path / "cluster", client_home, *FAST, role="sync-master").start()
    yield made
    made.kill()


def _route(endpoint: str, topic: str) -> list[tuple[str, int, int, int, int]]:
    """QueryRoute's queues as (broker name, broker id, queue id, permission, port)."""
    from rocketmq.grpc_protocol import service_pb2, service_pb2_grpc

    with grpc.insecure_channel(endpoint) as channel:
        request = service_pb2.QueryRouteRequest()
        request.topic.name = topic
        response = service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(
            request, metadata=[("x-mq-client-id", "route-probe")], timeout=10
        )
    assert response.status.code == 20000, response.status
    return [
        (
            mq.broker.name,
            mq.broker.id,
            mq.id,
            mq.permission,
            mq.broker.endpoints.addresses[0].port,
        )
        for mq in response.message_queues
    ]


def _assignment(endpoint: str, topic: str, group: str) -> list[tuple[str, int, int]]:
    from rocketmq.grpc_protocol import service_pb2, service_pb2_grpc

    with grpc.insecure_channel(endpoint) as channel:
        request = service_pb2.QueryAssignmentRequest()
        request.topic.name, request.group.name = topic, group
        response = service_pb2_grpc.MessagingServiceStub(channel).QueryAssignment(
            request, metadata=[("x-mq-client-id", "route-probe")], timeout=10
        )
    assert response.status.code == 20000, response.status
    return [
        (a.message_queue.broker.name, a.message_queue.broker.id, a.message_queue.permission)
        for a in response.assignments
    ]


READ, READ_WRITE = 2, 4


def test_every_server_routes_every_group_and_a_dead_master_s_slave_serves_reads(
    cluster: Cluster,
) -> None:
    a, b = cluster.groups
    both = [
        (g.name, 0, q, READ_WRITE, g.master.port) for q in range(4) for g in cluster.groups
    ]  # queue by queue, group by group: the next queue is always the other group's
    for proc in cluster.processes:  # masters and slaves answer alike (once each has
        # probed the servers started after it)
        assert official.wait_for(lambda p=proc: _route(p.endpoint, "t-cl-route") == both)
    assert _assignment(b.slaves[0].endpoint, "t-cl-route", "g-cl-route") == [
        ("broker-a", 0, READ_WRITE),
        ("broker-b", 0, READ_WRITE),
    ]
    a.master.kill()
    # its slave serves the group's receives: READ only, at the slave's endpoint, under
    # broker id 0 (the only one the official clients read from)
    a_by_slave = [
        (name, 0, q, READ, a.slaves[0].port) if name == "broker-a" else (name, i, q, p, port)
        for name, i, q, p, port in both
    ]
    for proc in (a.slaves[0], b.master, b.slaves[0]):
        assert official.wait_for(lambda p=proc: _route(p.endpoint, "t-cl-route") == a_by_slave)
        assert _assignment(proc.endpoint, "t-cl-route", "g-cl-route") == [
            ("broker-a", 0, READ),
            ("broker-b", 0, READ_WRITE),
        ]
    a.slaves[0].kill()  # the whole group is gone: its queues leave the route
    only_b = [row for row in both if row[0] == "broker-b"]
    assert official.wait_for(lambda: _route(b.master.endpoint, "t-cl-route") == only_b)
    # the old master comes back: its queues are writable again
    a.master.start()
    assert official.wait_for(
        lambda: (
            _route(b.slaves[0].endpoint, "t-cl-route")
            == [r for r in both if r[0] == "broker-b" or r[3] == READ_WRITE]
        )
    )


def test_a_server_not_in_its_cluster_file_refuses_to_start(tmp_path: Path) -> None:
    cluster_file = tmp_path / "c.toml"
    cluster_file.write_text('[[groups]]\nname = "broker-x"\nmaster = "127.0.0.1:1"\n')
    proc = ServerProcess(tmp_path / "s", tmp_path, "--cluster", str(cluster_file))
    with pytest.raises(RuntimeError, match="no broker group 'broker-a'"):
        proc.start()


def _ids_in_store(store: Path, topic: str) -> Counter[str]:
    """How often each message id of `topic` is in a store's commitlog, read file by file."""
    return Counter(m.msg_id for m in stored_records(store) if m.topic == topic)


class Sends:
    """Acknowledged ids and the time of each acknowledgement, from every producer."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: list[tuple[float, str, str]] = []  # (when, who, message id)
        self.failed: list[tuple[str, str]] = []

    def ok(self, who: str, message_id: str) -> None:
        with self.lock:
            self.acked.append((time.monotonic(), who, message_id))

    def fail(self, who: str, exc: BaseException) -> None:
        with self.lock:
            self.failed.append((who, repr(exc)[:300]))


def _official(endpoint: str, topic: str, who: str, sends: Sends, stop: threading.Event) -> None:
    producer = official.producer(endpoint, [topic])
    try:
        i = 0
        while not stop.is_set():
            try:
                receipt = producer.send(official.message(topic, f"{who}-{i}".encode() * 20))
                sends.ok(who, receipt.message_id)
            except Exception as exc:
                sends.fail(who, exc)
            i += 1
    finally:
        producer.shutdown()


def _framework(endpoint: str, topic: str, sends: Sends, stop: threading.Event, window: int) -> None:
    """send_async with at most `window` sends outstanding."""
    slots = threading.Semaphore(window)

    def done(f: Future[Any]) -> None:
        exc = f.exception()
        if exc is None:
            sends.ok("framework", f.result().message_id)
        else:
            sends.fail("framework", exc)
        slots.release()

    transport = reliable.connect("grpc", endpoint=endpoint)
    transport.start()
    with Producer(transport, send_timeout_s=3.0) as producer:
        i = 0
        while not stop.is_set():
            if not slots.acquire(timeout=0.5):
                continue
            producer.send_async(Message(topic, f"fw-{i}".encode() * 20)).add_done_callback(done)
            i += 1
        for _ in range(window):  # every outstanding send has its outcome
            slots.acquire(timeout=30)
    transport.close()


def test_killing_one_master_never_stops_sends_and_loses_nothing(cluster: Cluster) -> None:
    topic = "t-cl-chaos"
    a, b = cluster.groups
    sends, stop = Sends(), threading.Event()
    window = 16
    threads = [
        threading.Thread(
            target=_official, args=(cluster.endpoint, topic, f"official{n}", sends, stop)
        )
        for n in range(2)
    ]
    threads.append(
        threading.Thread(target=_framework, args=(cluster.endpoint, topic, sends, stop, window))
    )
    for t in threads:
        t.start()
    try:
        assert official.wait_for(lambda: len(sends.acked) >= 600, timeout_s=90)
        killed_at = time.monotonic()
        a.master.kill()  # SIGKILL: no shutdown hook runs
        # sends go on: each producer gets acknowledgements after the kill
        assert official.wait_for(
            lambda: (
                {w for t, w, _ in list(sends.acked) if t > killed_at + 3}
                >= {"official0", "official1", "framework"}
            ),
            timeout_s=60,
        ), (Counter(w for t, w, _ in list(sends.acked) if t > killed_at), sends.failed[:5])
        time.sleep(3)
    finally:
        stop.set()
        for t in threads:
            t.join(90)
    assert not any(t.is_alive() for t in threads)
    assert sends.failed == []  # every send got through within its bounded retries
    acked = [mid for _, _, mid in sends.acked]
    assert len(acked) == len(set(acked))
    # the longest pause between two acknowledgements, around the kill
    times = sorted(t for t, _, _ in sends.acked)
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert max(gaps) < 5.0, max(gaps)
    after = [mid for t, _, mid in sends.acked if t > killed_at + 1]
    for proc in cluster.processes:
        proc.kill()
    # the surviving stores: group a's slave (a sync-master's slave had every acknowledged
    # message before its answer) and group b's master
    in_a = _ids_in_store(a.slaves[0].store, topic)
    in_b = _ids_in_store(b.master.store, topic)
    assert max(in_a.values()) == 1 and max(in_b.values()) == 1  # never twice in one group
    assert set(acked) <= set(in_a) | set(in_b)  # nothing acknowledged is lost
    assert set(after) <= set(in_b)  # after the kill, group b takes them all
    # a send in flight at the kill may have reached a's slave without its answer, then been
    # sent again to b: at most one per producer's outstanding sends
    assert len(set(in_a) & set(in_b)) <= 2 + window
    assert len(in_a) > 100 and len(in_b) > 100  # both groups took sends before the kill
    print(
        f"acknowledged {len(acked)} ({len(after)} after the kill), longest pause "
        f"{max(gaps):.3f} s, in a's slave {len(in_a)}, in b {len(in_b)}, "
        f"in both {len(set(in_a) & set(in_b))}"
    )


def test_routes_come_from_a_live_master_when_the_access_point_s_server_dies(
    cluster: Cluster,
) -> None:
    """The framework asks its access point for routes. Given one server's address alone,
    it learns both groups' masters from the first route; once that server is killed,
    routes come from the other group's master at once (every server answers routes for
    all groups), so sends go on: without it, every route and send failed with
    UNAVAILABLE until the dead server came back."""
    a, b = cluster.groups
    topic = "t-cl-access-point"
    transport = reliable.connect("grpc", endpoint=a.master.endpoint)
    transport.start()
    try:
        with Producer(transport, send_timeout_s=3.0) as producer:
            first = transport.route(topic)
            assert {q.broker for q in first.write_queues} == {a.name, b.name}
            a.master.kill()  # SIGKILL: the access point's only server is gone
            # a send to a's queue fails, forgets the route and asks again: b answers
            ids = [producer.send(Message(topic, f"m{i}".encode())).message_id for i in range(20)]
        assert len(set(ids)) == 20
        # every send after the kill is in b's store, once (a's master is dead)
        assert _ids_in_store(b.master.store, topic) == Counter(dict.fromkeys(ids, 1))
    finally:
        transport.close()


def test_a_recall_reaches_the_group_holding_the_message(cluster: Cluster) -> None:
    """RecallMessage goes to the client's access point; the handle names the group whose
    schedule holds the message, and the access point forwards it there."""
    a = cluster.groups[0]
    topic = "t-cl-recall"
    producer = official.producer(a.master.endpoint, [topic])  # the access point: a alone
    consumer = official.simple_consumer(cluster.endpoint, "g-cl-recall", topic)
    try:
        deliver_at = int(time.time()) + 4
        receipts = [
            producer.send(official.message(topic, f"d{i}".encode(), deliver_at_s=deliver_at))
            for i in range(8)
        ]
        held = Counter(r.recall_handle.partition("@")[0] for r in receipts)
        assert set(held) == {"broker-a", "broker-b"}  # round-robin over both groups
        withdrawn = [r for r in receipts if r.recall_handle.startswith("broker-b@")]
        for r in withdrawn:  # asked of a, held by b
            assert producer.recall_message(topic, r.recall_handle) == r.message_id
        kept = {r.message_id for r in receipts} - {r.message_id for r in withdrawn}
        got = official.receive_until(
            consumer, lambda g: {m.message_id for m in g} >= kept, timeout_s=30
        )
        got += consumer.receive(32, 15) + consumer.receive(32, 15)
        assert sorted(m.message_id for m in got) == sorted(kept)
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_a_promoted_slave_serves_its_group_to_the_framework_again(cluster: Cluster) -> None:
    """Group a's master dies; sends go on to b; an operator promotes a's slave: the routes
    name it a's master, and a framework consumer given both masters' addresses receives
    every acknowledged message, from both groups, once."""
    from reliable import SimpleConsumer
    from reliable.admin import AdminClient

    a, b = cluster.groups
    topic, group = "t-cl-promote", "g-cl-promote"
    transport = reliable.connect("grpc", endpoint=cluster.endpoint)
    transport.start()
    sent: set[str] = set()
    try:
        with (
            SimpleConsumer(
                group,
                {topic: "*"},
                transport=transport,
                await_duration_s=1,
                invisible_duration_s=15,
            ) as consumer,
            Producer(transport) as producer,
        ):
            consumer.receive(max_messages=1)  # the group exists before the sends
            sent |= {producer.send(Message(topic, f"p{i}".encode())).message_id for i in range(100)}
            a.master.kill()
            sent |= {producer.send(Message(topic, f"q{i}".encode())).message_id for i in range(100)}
            admin = AdminClient(a.slaves[0].endpoint)
            try:
                assert official.wait_for(lambda: not _ha_connected(admin), timeout_s=30)
                admin.promote(sync=False)
            finally:
                admin.close()
            promoted = (a.name, 0, 0, READ_WRITE, a.slaves[0].port)
            assert official.wait_for(lambda: promoted in _route(b.master.endpoint, topic))
            sent |= {producer.send(Message(topic, f"r{i}".encode())).message_id for i in range(100)}
            got: Counter[str] = Counter()

            def all_in() -> bool:
                for m in consumer.receive(max_messages=32):
                    consumer.ack(m)
                    got[m.message_id] += 1
                return set(got) >= sent

            assert official.wait_for(all_in, timeout_s=90, interval_s=0)
            assert set(got) == sent and max(got.values()) == 1
            # the consumer's Telemetry reached the promoted slave once a route named it:
            # it is a live client there, and a direct delivery reaches it
            client_id = transport.consumer_client_id(group)  # type: ignore[attr-defined]
            mine = next(iter(_ids_in_store(a.slaves[0].store, topic)))
            admin = AdminClient(a.slaves[0].endpoint)
            verdicts: list[Any] = []

            def delivered() -> bool:
                try:
                    verdicts.append(
                        admin.call("ReconsumeMessage", id=mine, group=group, client_id=client_id)
                    )
                except Exception as exc:  # not connected to it yet
                    verdicts.append(exc)
                    return False
                return True

            try:
                assert official.wait_for(delivered, timeout_s=30, interval_s=0.5), verdicts[-1]
            finally:
                admin.close()
            assert verdicts[-1]["status"] == "NOT_IMPLEMENTED", verdicts[-1]  # no listener
    finally:
        transport.close()
    in_a = _ids_in_store(a.slaves[0].store, topic)
    in_b = _ids_in_store(b.master.store, topic)
    assert in_a and in_b and set(in_a) | set(in_b) == sent


def _ha_connected(admin: Any) -> bool:
    return bool(admin.ha_status().get("connected"))
