"""The official PushConsumer (concurrent and FIFO) against our server."""

from __future__ import annotations

import random
import threading
from collections import Counter, defaultdict
from typing import Any

from reliable.admin import AdminClient
from tests.e2e.grpc import official
from tests.e2e.grpc.server_process import ServerProcess


class Recorder:
    """A MessageListener body: fails the first attempt of selected messages, records calls."""

    def __init__(self, fail: Any) -> None:
        self.fail = fail
        self.lock = threading.Lock()
        self.calls: list[tuple[str, int, str | None, bytes]] = []
        self.ok: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()

    def consume(self, message: Any) -> Any:
        from rocketmq import ConsumeResult

        with self.lock:
            self.calls.append(
                (
                    message.message_id,
                    message.delivery_attempt or 1,
                    message.message_group,
                    message.body,
                )
            )
            if self.fail(message, self.failed[message.message_id]):
                self.failed[message.message_id] += 1
                return ConsumeResult.FAILURE
            self.ok[message.message_id] += 1
            return ConsumeResult.SUCCESS


def push_consumer(endpoint: str, group: str, topic: str, recorder: Recorder) -> Any:
    from rocketmq import FilterExpression, MessageListener, PushConsumer

    class Listener(MessageListener):
        def consume(self, message: Any) -> Any:
            return recorder.consume(message)

    consumer = PushConsumer(
        official.configuration(endpoint),
        group,
        Listener(),
        {topic: FilterExpression("*")},
        consumption_thread_count=4,
    )
    consumer.startup()
    return consumer


def test_push_consumer_retries_failures_and_loses_nothing(server: ServerProcess) -> None:
    recorder = Recorder(lambda m, failed: m.body.endswith(b"0") and failed == 0)
    consumer = push_consumer(server.endpoint, "g-push", "t-push", recorder)
    producer = official.producer(server.endpoint, ["t-push"])
    try:
        sent = {
            producer.send(official.message("t-push", f"p{i}".encode())).message_id
            for i in range(100)
        }
        assert official.wait_for(lambda: set(recorder.ok) == sent, timeout_s=60)
        assert max(recorder.ok.values()) == 1  # each success exactly once: acks took
        retried = {mid for mid, n in recorder.failed.items() if n}
        assert len(retried) == 10
        attempts = defaultdict(list)
        for mid, attempt, _, _ in recorder.calls:
            attempts[mid].append(attempt)
        for mid in retried:  # redelivered by the server with the attempt counted
            assert attempts[mid] == [1, 2]
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_fifo_push_consumer_keeps_group_order_under_failures(
    server: ServerProcess, seed: int
) -> None:
    admin = AdminClient(server.endpoint)
    admin.call("CreateTopic", name="t-fifo", queues=4, type="FIFO")
    admin.call("CreateGroup", name="g-fifo", fifo=True, max_retries=3)
    admin.close()
    rng = random.Random(seed)
    doomed = set()  # messages whose first try fails (retried locally by the FIFO consumer)

    def fail(m: Any, failed: int) -> bool:
        return m.message_id in doomed and failed == 0

    recorder = Recorder(fail)
    consumer = push_consumer(server.endpoint, "g-fifo", "t-fifo", recorder)
    producer = official.producer(server.endpoint, ["t-fifo"])
    try:
        order: dict[str, list[str]] = defaultdict(list)
        for i in range(15):
            for g in ("a", "b", "c", "d"):
                mid = producer.send(
                    official.message("t-fifo", f"{g}{i}".encode(), group=f"grp-{g}")
                ).message_id
                order[f"grp-{g}"].append(mid)
                if rng.random() < 0.2:
                    doomed.add(mid)
        everything = {m for ids in order.values() for m in ids}
        assert official.wait_for(lambda: set(recorder.ok) == everything, timeout_s=60)
        with recorder.lock:
            calls = list(recorder.calls)
        for group, ids in order.items():
            seen = [mid for mid, _, g, _ in calls if g == group]
            # every call of the group, retries included, walks the send order
            positions = [ids.index(mid) for mid in seen]
            assert positions == sorted(positions), f"{group} out of order (seed {seed})"
            assert sorted(set(positions)) == list(range(len(ids)))
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_fifo_simple_consumer_holds_the_group_while_in_flight(server: ServerProcess) -> None:
    admin = AdminClient(server.endpoint)
    admin.call("CreateTopic", name="t-fifo-s", queues=2, type="FIFO")
    admin.call("CreateGroup", name="g-fifo-s", fifo=True)
    admin.close()
    consumer = official.simple_consumer(server.endpoint, "g-fifo-s", "t-fifo-s")
    producer = official.producer(server.endpoint, ["t-fifo-s"])
    try:
        ids = [
            producer.send(official.message("t-fifo-s", f"{i}".encode(), group="one")).message_id
            for i in range(3)
        ]
        (first,) = official.receive_until(
            consumer, lambda g: len(g) >= 1, invisible_s=8, ack=False, batch=1
        )
        assert first.message_id == ids[0]
        assert consumer.receive(32, 2) == []  # 1 and 2 wait while 0 is in flight
        again = official.receive_until(
            consumer, lambda g: len(g) >= 1, invisible_s=30, ack=False, batch=1
        )
        assert [(m.message_id, m.delivery_attempt) for m in again] == [(ids[0], 2)]
        consumer.ack(again[0])
        rest = official.receive_until(consumer, lambda g: len(g) >= 2, invisible_s=30)
        assert [m.message_id for m in rest] == ids[1:]
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_slow_handler_keeps_its_message_through_auto_renewal(make_server: Any) -> None:
    import time

    server = make_server("--default-invisible-ms", "3000")  # renewed every second
    calls: list[tuple[str, str, int]] = []
    lock = threading.Lock()

    def slow(name: str) -> Recorder:
        def fail(m: Any, failed: int) -> bool:
            with lock:
                calls.append((name, m.message_id, m.delivery_attempt or 1))
            if m.body == b"slow":
                time.sleep(6)  # well past the 3 s invisible time
            return False

        return Recorder(fail)

    a, b = slow("a"), slow("b")
    first = push_consumer(server.endpoint, "g-renew", "t-renew", a)
    second = push_consumer(server.endpoint, "g-renew", "t-renew", b)
    producer = official.producer(server.endpoint, ["t-renew"])
    try:
        mid = producer.send(official.message("t-renew", b"slow")).message_id
        assert official.wait_for(lambda: mid in a.ok or mid in b.ok, timeout_s=30)
        quick = producer.send(official.message("t-renew", b"after")).message_id
        assert official.wait_for(lambda: quick in a.ok or quick in b.ok, timeout_s=30)
        with lock:
            assert len([c for c in calls if c[1] == mid]) == 1  # one delivery, attempt 1
        assert a.ok[mid] + b.ok[mid] == 1  # handled once: never redelivered meanwhile
    finally:
        producer.shutdown()
        first.shutdown()
        second.shutdown()


def test_fifo_poison_message_is_forwarded_to_dlq_and_the_group_moves_on(
    server: ServerProcess,
) -> None:
    admin = AdminClient(server.endpoint)
    admin.call("CreateTopic", name="t-fifo-poison", queues=2, type="FIFO")
    admin.call("CreateGroup", name="g-fifo-poison", fifo=True, max_retries=1)  # 2 attempts
    admin.close()
    recorder = Recorder(lambda m, failed: m.body == b"poison")
    consumer = push_consumer(server.endpoint, "g-fifo-poison", "t-fifo-poison", recorder)
    producer = official.producer(server.endpoint, ["t-fifo-poison"])
    try:
        ids = [
            producer.send(
                official.message("t-fifo-poison", body, group="only", props={"n": str(i)})
            ).message_id
            for i, body in enumerate([b"first", b"poison", b"third"])
        ]
        # the client retries the poison message locally, then forwards it to the DLQ
        # (ForwardMessageToDeadLetterQueue) and carries on with the group
        assert official.wait_for(lambda: {ids[0], ids[2]} <= set(recorder.ok), timeout_s=60)
        with recorder.lock:
            order = [mid for mid, _, _, _ in recorder.calls]
        assert order == [ids[0], ids[1], ids[1], ids[2]]
        dlq = official.simple_consumer(server.endpoint, "g-fifo-poison-dlq", "%DLQ%g-fifo-poison")
        try:
            got = official.receive_until(dlq, lambda g: len(g) >= 1, timeout_s=20)
        finally:
            dlq.shutdown()
        assert [(m.message_id, m.body, m.properties.get("n")) for m in got] == [
            (ids[1], b"poison", "1")
        ]
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_two_push_consumers_and_three_producers_share_the_work(
    server: ServerProcess, seed: int
) -> None:
    rng = random.Random(seed)
    flaky = set()
    lock = threading.Lock()

    def fail(m: Any, failed: int) -> bool:
        return m.message_id in flaky and failed == 0

    shared = Recorder(fail)
    consumers = [push_consumer(server.endpoint, "g-shared", "t-shared", shared) for _ in range(2)]
    sent: set[str] = set()

    def produce(k: int) -> None:
        producer = official.producer(server.endpoint, ["t-shared"])
        try:
            for i in range(150):
                mid = producer.send(official.message("t-shared", f"{k}-{i}".encode())).message_id
                with lock:
                    sent.add(mid)
                    if rng.random() < 0.1:
                        flaky.add(mid)
        finally:
            producer.shutdown()

    try:
        threads = [threading.Thread(target=produce, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(sent) == 450
        assert official.wait_for(lambda: set(shared.ok) == sent, timeout_s=90), (
            f"{len(sent - set(shared.ok))} never succeeded (seed {seed})"
        )
        assert max(shared.ok.values()) == 1, f"a message succeeded twice (seed {seed})"
    finally:
        for c in consumers:
            c.shutdown()
