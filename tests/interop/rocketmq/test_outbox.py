"""The outbox story on Apache RocketMQ 5: publish in a transaction, consumers behind the
idempotency guard, the resend worker and `reliable reconcile`.

The proxy says neither which queue a send went to nor accepts a send to a group's retry
topic, so two things differ from our server, both checked here: a stub records queue -1
and is judged by the expected latency (short here: 1 s), and a message one group missed
is resent to the whole topic (`producer.can_send_to_group()` is False), the group that
confirmed it already absorbing its copy with the guard.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from apache_rocketmq import RocketMQCluster
from idempotency import IdempotencyGuard
from outbox import Outbox, OutboxConfig, OutboxTables, ResendPolicy, ResendWorker, declare_groups
from outbox.latency import ExpectedLatency
from reliable import Message, Producer, ReceivedMessage, SimpleConsumer
from reliable_cli.exit_codes import ExitCode
from tests.interop.rocketmq.helpers import drain, grpc_transport, receive, unique

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
MESSAGES = 3


def _start_reconcile(db: Path) -> Future[subprocess.CompletedProcess[str]]:
    """`reliable reconcile` of `db` in its own process, running while the caller goes on."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [
        sys.executable,
        *("-m", "reliable_cli", "reconcile", "--db", f"sqlite:///{db}"),
        *("--expected-latency", "1", "--conf", "spark.sql.shuffle.partitions=2"),
    ]
    run = ThreadPoolExecutor(1)
    future = run.submit(
        subprocess.run, command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240
    )
    run.shutdown(wait=False)
    return future


def _reconcile(db: Path) -> subprocess.CompletedProcess[str]:
    return _start_reconcile(db).result()


@pytest.fixture(scope="module")
def unconfirmed(
    rocketmq: RocketMQCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Future[subprocess.CompletedProcess[str]]]:
    """A consumer that acknowledged without confirming, and the reconciliation of that, in
    its own process from the module's start: its Spark run overlaps the other test."""
    topic, group = unique("ob-nc"), unique("ob-nc-g")
    rocketmq.create_topic(topic)
    rocketmq.create_group(group)
    db = tmp_path_factory.mktemp("unconfirmed") / "app.db"
    engine = sa.create_engine(f"sqlite:///{db}")
    tables = OutboxTables()
    tables.create_all(engine)
    declare_groups(engine, tables, topic, [group])
    with (
        grpc_transport(rocketmq.endpoint) as transport,
        SimpleConsumer(group, {topic: "*"}, transport=transport, await_duration_s=1) as consumer,
        Producer(transport) as producer,
    ):
        receive(consumer, 1)
        outbox = Outbox(tables, producer)
        for i in range(MESSAGES):
            with Session(engine) as session, session.begin():
                outbox.publish(session, Message(topic, f"order {i}".encode()))
        acked = len(drain(consumer, MESSAGES))  # acked, never confirmed
    engine.dispose()
    assert acked == MESSAGES
    time.sleep(1.2)  # older than the expected latency
    result = _start_reconcile(db)
    yield result
    result.result()  # never left running


def test_a_missed_message_is_resent_to_the_topic_and_the_certificate_is_clean(
    rocketmq: RocketMQCluster,
    tmp_path: Path,
    unconfirmed: Future[subprocess.CompletedProcess[str]],  # its reconciliation runs meanwhile
) -> None:
    topic, g1, g2 = unique("ob"), unique("ob-billing"), unique("ob-stock")
    rocketmq.create_topic(topic)
    for g in (g1, g2):
        rocketmq.create_group(g)
    db = tmp_path / "app.db"
    engine = sa.create_engine(f"sqlite:///{db}")
    tables = OutboxTables()
    tables.create_all(engine)
    declare_groups(engine, tables, topic, [g1, g2])
    guard = IdempotencyGuard(engine, tables, None)
    runs: dict[str, list[str]] = {g1: [], g2: []}

    def handle(group: str) -> Callable[[ReceivedMessage], None]:
        return lambda m: runs[group].append(m.message_id)

    with (
        grpc_transport(rocketmq.endpoint) as transport,
        SimpleConsumer(g1, {topic: "*"}, transport=transport, await_duration_s=1) as c1,
        SimpleConsumer(g2, {topic: "*"}, transport=transport, await_duration_s=1) as c2,
        Producer(transport) as producer,
    ):
        receive(c1, 1), receive(c2, 1)  # both groups are known before the sends
        assert not producer.can_send_to_group()  # the proxy offers no per-group resend
        outbox = Outbox(tables, producer, config=OutboxConfig(resend_after=timedelta(0)))
        ids = []
        for i in range(MESSAGES):
            with Session(engine) as session, session.begin():
                ids.append(outbox.publish(session, Message(topic, f"order {i}".encode())))
        with engine.connect() as conn:  # the proxy does not say which queue
            assert {r[0] for r in conn.execute(sa.select(tables.stub.c.queue_id))} == {-1}
        missed = ids[0]

        def g1_consume(m: ReceivedMessage) -> None:
            guard.consume(m, g1, handle(g1))

        skipped: list[str] = []

        def g2_consume(m: ReceivedMessage) -> None:
            if m.message_id == missed and not skipped:  # acknowledged once, not handled
                skipped.append(m.message_id)
                return
            guard.consume(m, g2, handle(g2))

        assert len(drain(c1, MESSAGES, on_message=g1_consume)) == MESSAGES
        assert len(drain(c2, MESSAGES, on_message=g2_consume)) == MESSAGES
        time.sleep(1.2)  # older than the expected latency
        worker = ResendWorker(
            engine,
            tables,
            producer,
            policy=ResendPolicy(expected_latency=ExpectedLatency(timedelta(seconds=1))),
        )
        passed = worker.run_once()
        assert (passed.resent, passed.topic_fallbacks) == (1, 1), passed
        # every group gets the copy; g1 had confirmed it: its guard absorbs it
        assert [m.message_id for m in drain(c1, 1, on_message=g1_consume)] == [missed]
        assert [m.message_id for m in drain(c2, 1, on_message=g2_consume)] == [missed]
    assert sorted(runs[g1]) == sorted(ids)  # once each: the resend was absorbed
    assert sorted(runs[g2]) == sorted(ids)
    assert worker.run_once().resent == 0
    engine.dispose()
    result = _reconcile(db)
    assert result.returncode == ExitCode.OK, result.stdout + result.stderr
    assert "NOT CLEAN" not in result.stdout and "CLEAN" in result.stdout


def test_acknowledged_without_confirming_is_not_clean(
    unconfirmed: Future[subprocess.CompletedProcess[str]],
) -> None:
    result = unconfirmed.result()
    assert result.returncode == ExitCode.UNACCOUNTED, result.stdout + result.stderr
    assert f"NOT CLEAN ({MESSAGES} unaccounted)" in result.stdout
    assert "within the expected latency (queue unknown)" in result.stdout
