"""The framework's grpc transport against two broker groups (docs/ha.md, Broker groups):
the scenarios of `test_framework_transport` that take a started transport, unchanged, with
a transport whose access point names both masters. Its producer sends to both groups, its
consumers receive from each in turn and acknowledge where each message came from."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import reliable
from reliable import Transport
from reliable.admin import AdminClient
from tests.e2e.grpc.cluster_process import Cluster
from tests.e2e.grpc.conftest import FAST
from tests.e2e.grpc.test_framework_transport import (
    test_handler_decorators_with_retry_and_dead_letter,
    test_push_consumer_handler_with_retries,
    test_recall_cancels_a_delayed_message,
    test_send_and_receive_with_invisible_time,
)

SCENARIOS = [
    test_send_and_receive_with_invisible_time,
    test_push_consumer_handler_with_retries,
    test_handler_decorators_with_retry_and_dead_letter,
    test_recall_cancels_a_delayed_message,
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, client_home: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path_factory.mktemp("cluster"), client_home, *FAST).start()
    yield made
    # both groups stored and delivered messages of the scenarios
    made.finish(min_offset=20_000)


@pytest.fixture
def transport(cluster: Cluster) -> Iterator[Transport]:
    t = reliable.connect("grpc", endpoint=cluster.endpoint)
    t.start()
    yield t
    t.close()


def test_the_scenarios_are_the_transport_ones() -> None:
    import inspect

    from tests.e2e.grpc import test_framework_transport as module

    taking_a_transport = {
        name
        for name, fn in vars(module).items()
        if name.startswith("test_") and list(inspect.signature(fn).parameters) == ["transport"]
    }
    assert taking_a_transport == {fn.__name__ for fn in SCENARIOS}


def test_every_group_s_orphaned_transactions_reach_the_producer(cluster: Cluster) -> None:
    """The producer keeps a Telemetry stream to every group's master, as the official
    clients do: a half message left pending in either group is checked back, the check is
    answered to the group that asked, and the message is delivered. With a stream to the
    access point's server only, the other group's checks had nobody to go to."""
    from reliable import Message, Producer, ReceivedMessage, SimpleConsumer
    from tests.e2e.grpc import official

    topic, count = "t-cl-fw-orphans", 8
    t = reliable.connect("grpc", endpoint=cluster.endpoint)
    t.start()
    asked: list[str] = []

    def checker(message: ReceivedMessage) -> reliable.TransactionState:
        asked.append(message.message_id)
        return reliable.TransactionState.COMMIT

    try:
        with (
            Producer(t, transaction_checker=checker) as producer,
            SimpleConsumer(
                "g-cl-fw-orphans", {topic: "*"}, transport=t, await_duration_s=1
            ) as consumer,
        ):
            ids = {
                producer.send_in_transaction(
                    Message(topic, f"pending {i}".encode()),
                    lambda m, arg: reliable.TransactionState.UNKNOWN,  # the outcome never told
                ).receipt.message_id
                for i in range(count)
            }
            got: set[str] = set()

            def arrived() -> bool:
                for m in consumer.receive(max_messages=16):
                    consumer.ack(m)
                    got.add(m.message_id)
                return got >= ids

            def why() -> str:
                """What each group holds of the messages never delivered, the producer's
                Telemetry streams, and each master's transaction log lines (a rare
                failure: one group's checks never reached the checker)."""
                missing = sorted(ids - got)
                out = [
                    f"{len(missing)} of {count} never delivered, "
                    f"{len(ids - set(asked))} never checked",
                    f"producer streams (target: settings answered): {producer_streams(t)}",
                ]
                for group in cluster.groups:
                    admin = AdminClient(group.master.endpoint)
                    try:
                        roles = {
                            mid: [
                                r["role"]
                                for r in admin.call("TraceMessage", key=mid, topic=topic)["records"]
                            ]
                            for mid in missing
                        }
                    except Exception as exc:
                        roles = {"trace failed": [repr(exc)]}
                    finally:
                        admin.close()
                    lines = [
                        x for x in group.master.output if "transaction" in x or "elemetry" in x
                    ]
                    out.append(f"{group.name}: {roles}; log: {''.join(lines[-8:])}")
                return "\n".join(out)

            assert official.wait_for(arrived, timeout_s=60, interval_s=0), why()
            assert got == ids and ids <= set(asked)
            # committed where each half message was: in both groups
            held: dict[str, set[str]] = {}
            for group in cluster.groups:
                admin = AdminClient(group.master.endpoint)
                try:
                    held[group.name] = {
                        mid
                        for mid in ids
                        if admin.call("QueryMessage", unique_key=mid, topic=topic)["messages"]
                    }
                finally:
                    admin.close()
            assert all(held.values()) and set().union(*held.values()) == ids, held
    finally:
        t.close()


def producer_streams(t: Transport) -> dict[str, bool]:
    """A grpc transport's producer Telemetry streams: target ("access point" for the
    access point's) -> whether its server answered the Settings."""
    first = getattr(t, "_producer_stream", None)
    more: dict[str, Any] = getattr(t, "_producer_streams", {})
    streams = {"access point": first, **more} if first is not None else dict(more)
    return {target: stream.ready.is_set() for target, stream in streams.items()}


def test_a_consumer_is_a_live_client_of_every_group(cluster: Cluster) -> None:
    """A consumer's Telemetry stream reaches every group's master: each knows the client
    as a consumer of its group (from its Settings) and can deliver a message to it
    directly (`ReconsumeMessage` with `client_id`; a simple consumer answers that it has
    no listener). With a stream to the access point's server only, the other group
    answered that the client is not connected to it."""
    from reliable import Message, Producer, SimpleConsumer
    from tests.e2e.grpc import official

    topic, group, count = "t-cl-fw-live", "g-cl-fw-live", 8
    t = reliable.connect("grpc", endpoint=cluster.endpoint)
    t.start()
    try:
        with (
            Producer(t) as producer,
            SimpleConsumer(group, {topic: "*"}, transport=t, await_duration_s=1) as consumer,
        ):
            consumer.receive(max_messages=1)  # the group exists before the first send
            ids = [producer.send(Message(topic, f"m{i}".encode())).message_id for i in range(count)]
            got: set[str] = set()

            def arrived() -> bool:
                for m in consumer.receive(max_messages=16):
                    consumer.ack(m)
                    got.add(m.message_id)
                return got >= set(ids)

            assert official.wait_for(arrived, timeout_s=60, interval_s=0)
            client_id = t.consumer_client_id(group)  # type: ignore[attr-defined]
            for g in cluster.groups:
                admin = AdminClient(g.master.endpoint)
                try:
                    mine = [
                        mid
                        for mid in ids
                        if admin.call("QueryMessage", unique_key=mid, topic=topic)["messages"]
                    ]
                    assert mine, g.name
                    verdict = admin.call(
                        "ReconsumeMessage", id=mine[0], group=group, client_id=client_id
                    )
                finally:
                    admin.close()
                assert verdict["client_id"] == client_id
                assert verdict["status"] == "NOT_IMPLEMENTED", (g.name, verdict)
    finally:
        t.close()
