"""An ASYNC_MASTER's machine lost (docs/ha.md, "What each role and mode guarantees"): what
the group loses is bounded by the lag the master reported, and the outbox gets it back.

The order service publishes through the outbox (stubs in a SQLite file) over the grpc
transport to an async-master with one slave. The slave stalls (SIGSTOP: a long pause, a
hung disk) while the sends go on, so the master's reported lag grows; the master is
SIGKILLed and its store directory deleted; the stalled slave is killed and restarted
(whatever sat unread in its socket is gone) and the operator promotes it with `--force`
(its lag is unknown: a plain promotion is refused). Then:

- the acknowledged sends the promoted slave lacks are at most the lag in messages of the
  master's last status report before the kill plus the sends acknowledged after that
  report was asked for (and more than none: the stall guarantees a loss to recover);
- consuming what the promoted slave holds, with the idempotency guard confirming, leaves
  exactly the stubs it does not hold unconfirmed (the lost ones, and the sends that
  failed as the master died);
- one pass of the resend worker resends exactly those to the promoted slave, they are
  consumed, every stub is confirmed, each message handled once, and the certificate is
  CLEAN (one run of the reconciliation: that it calls unconfirmed gRPC sends past the
  expected latency unaccounted is tests/e2e/grpc/test_outbox_served.py's).

It lives in the reconciliation package to share its Spark session (tests/conftest.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from idempotency import IdempotencyGuard
from outbox import (
    ExpectedLatency,
    Outbox,
    OutboxConfig,
    OutboxTables,
    ResendPolicy,
    ResendWorker,
    declare_groups,
)
from outbox.reconcile import ReconcileOptions, reconcile
from protocol.ports import free_port
from reliable import Message, Producer, SimpleConsumer, connect
from reliable.admin import AdminClient
from tests.e2e.grpc.conftest import FAST
from tests.e2e.grpc.server_process import ServerProcess, admin_cli

pytestmark = [pytest.mark.chaos, pytest.mark.spark, pytest.mark.slow]

TOPIC = "t-ha-async-loss"
GROUP = "g-ha-async-loss"
BEFORE_STALL = 100  # acknowledged sends while the slave keeps up
AFTER_STALL = 40  # acknowledged sends after the slave stalled, before the kill
LATENCY = timedelta(seconds=1)  # the expected latency, for the worker and the reconciliation


def _wait(predicate: Any, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


class OrderService:
    """A thread publishing through the outbox; the outbox's sender records every send the
    master acknowledged."""

    def __init__(self, engine: sa.Engine, tables: OutboxTables, producer: Producer) -> None:
        self.engine, self.producer = engine, producer
        self.lock = threading.Lock()
        self.acked: list[str] = []
        self.failed = 0
        self.stop = threading.Event()
        self.outbox = Outbox(
            tables,
            self,
            config=OutboxConfig(resend_after=LATENCY, retry_after_failure=timedelta(0)),
        )
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def send(self, message: Message) -> Any:  # the outbox's Sender
        try:
            receipt = self.producer.send(message)
        except Exception:
            with self.lock:
                self.failed += 1
            self.stop.wait(0.05)
            raise
        with self.lock:
            self.acked.append(receipt.message_id)
        return receipt

    def count(self) -> int:
        with self.lock:
            return len(self.acked)

    def _loop(self) -> None:
        i = 0
        while not self.stop.is_set():
            with Session(self.engine) as session, session.begin():
                self.outbox.publish(session, Message(TOPIC, f"order {i}".encode() * 10))
            i += 1

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(60)


class Machines:
    """The group's two machines: an async-master and its slave, each a server process on a
    store of its own. `stop_all` resumes a stalled process before killing it."""

    def __init__(self, tmp_path: Path) -> None:
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.m_store, self.s_store = tmp_path / "m", tmp_path / "s"
        self.m_ha, self.s_ha = free_port(), free_port()
        self.servers: list[ServerProcess] = []

    def start(self, store: Path, *extra: str, port: int = 0) -> ServerProcess:
        proc = ServerProcess(store, self.home, *FAST, *extra, port=port).start()
        self.servers.append(proc)
        return proc

    def start_master(self) -> ServerProcess:
        return self.start(self.m_store, "--role", "async-master", "--ha-port", str(self.m_ha))

    def start_slave(self, port: int = 0) -> ServerProcess:
        slave_args = (
            *("--role", "slave", "--broker-id", "1", "--ha-port", str(self.s_ha)),
            *("--master", f"127.0.0.1:{self.m_ha}"),
        )
        return self.start(self.s_store, *slave_args, port=port)

    def stop_all(self) -> None:
        for proc in self.servers:
            if proc.proc is not None and proc.alive():
                os.kill(proc.proc.pid, signal.SIGCONT)
            proc.kill()


def _promote(endpoint: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return admin_cli("broker", "promote", "--endpoint", endpoint, "--json", *flags)


def test_async_master_loss_is_bounded_by_its_lag_and_the_outbox_recovers_it(
    spark: Any, tmp_path: Path, table_prefix: str
) -> None:
    machines = Machines(tmp_path)
    db_url = f"sqlite:///{tmp_path / 'app.db'}"
    engine = sa.create_engine(db_url)
    tables = OutboxTables(prefix=table_prefix)
    tables.create_all(engine)
    declare_groups(engine, tables, TOPIC, [GROUP])
    closing: list[Any] = []
    try:
        master = machines.start_master()
        slave = machines.start_slave()
        service, admin = _order_service_sending_to(master, engine, tables, closing)
        assert _wait(lambda: service.count() >= BEFORE_STALL)
        reports = _stall_the_slave_and_watch_the_lag(slave, service, admin)
        # the master's machine is lost: killed while sending, its disk gone
        master.kill()
        shutil.rmtree(machines.m_store)
        service.finish()
        acked = list(service.acked)
        last_before, last_lag = reports[-1]
        bound = last_lag + len(acked) - last_before
        assert last_lag > 0, reports  # the stall shows as lag

        slave = _restart_the_slave_and_force_its_promotion(machines, slave)
        to_slave, resender, on_slave = _clients_of_the_promoted_slave(slave, closing)
        stubs, absent = _stubs_and_those_the_promoted_slave_lacks(
            resender, on_slave, engine, tables
        )
        lost = absent & set(acked)
        assert 0 < len(lost) <= bound, (len(lost), bound, reports[-3:])

        handled, worker = _consume_then_resend_what_it_lacks(
            engine, tables, to_slave, resender, absent
        )
        assert _unconfirmed(engine, tables) == set()
        assert set(handled) == stubs and set(handled.values()) == {1}
        _assert_the_certificate_is_clean(spark, db_url, table_prefix, len(stubs))
        print(
            f"observed: acknowledged {len(acked)} (failed sends {service.failed}), "
            f"last reported lag {last_lag} messages with {len(acked) - last_before} "
            f"acknowledged after: bound {bound}, lost {len(lost)}, never acknowledged "
            f"{len(stubs) - len(acked)}, resent {worker.metrics.resent}"
        )
    finally:
        for thing in reversed(closing):
            for name in ("shutdown", "close"):
                if hasattr(thing, name):
                    getattr(thing, name)()
                    break
        machines.stop_all()
        engine.dispose()


def _order_service_sending_to(
    master: ServerProcess, engine: sa.Engine, tables: OutboxTables, closing: list[Any]
) -> tuple[OrderService, AdminClient]:
    """The order service publishing to the master over gRPC (a send is tried once), started;
    and the operator's admin client on the master."""
    to_master = connect("grpc", endpoint=master.endpoint)
    to_master.start()
    closing.append(to_master)
    producer = Producer(to_master, retry_times_when_send_failed=0, flow_control_retries=0).start()
    closing.append(producer)
    service = OrderService(engine, tables, producer)
    service.thread.start()
    admin = AdminClient(master.endpoint)
    closing.append(admin)
    return service, admin


def _stall_the_slave_and_watch_the_lag(
    slave: ServerProcess, service: OrderService, admin: AdminClient
) -> list[tuple[int, int]]:
    """The slave stalls while the master goes on; the operator's view while sending, until
    AFTER_STALL more sends were acknowledged: (sends acknowledged before the report was
    asked for, the reported lag in messages)."""
    assert slave.proc is not None
    os.kill(slave.proc.pid, signal.SIGSTOP)  # the slave stalls; the master goes on
    stalled_at = service.count()
    reports: list[tuple[int, int]] = []
    while service.count() < stalled_at + AFTER_STALL or not reports:
        before = service.count()
        lag = admin.ha_status()["lag_messages"]
        assert lag is not None, "the master dropped its stalled slave"
        reports.append((before, int(lag)))
        time.sleep(0.05)
    return reports


def _restart_the_slave_and_force_its_promotion(
    machines: Machines, slave: ServerProcess
) -> ServerProcess:
    """The stalled slave is restarted on its store: what it wrote is there, what sat unread
    in its socket is not; its master is dead, so its lag is unknown and only a forced
    promotion is taken."""
    slave.kill()
    slave = machines.start_slave(port=slave.port)
    refused = _promote(slave.endpoint)
    assert refused.returncode == 1 and "not-caught-up" in refused.stderr, refused.stderr
    done = _promote(slave.endpoint, "--force")
    assert done.returncode == 0, done.stderr
    return slave


def _clients_of_the_promoted_slave(
    slave: ServerProcess, closing: list[Any]
) -> tuple[Any, Producer, AdminClient]:
    """A gRPC transport, a producer (the resend worker's) and an admin client on the
    promoted slave."""
    to_slave = connect("grpc", endpoint=slave.endpoint)
    to_slave.start()
    closing.append(to_slave)
    resender = Producer(to_slave).start()
    closing.append(resender)
    on_slave = AdminClient(slave.endpoint)
    closing.append(on_slave)
    return to_slave, resender, on_slave


def _stubs_and_those_the_promoted_slave_lacks(
    resender: Producer, on_slave: AdminClient, engine: sa.Engine, tables: OutboxTables
) -> tuple[set[str], set[str]]:
    """Every stub's id, and the ids the promoted slave does not hold. Its index is built a
    moment after each write, in log order: once a message sent now is found, everything
    before it is indexed."""
    marker = resender.send(Message(f"{TOPIC}-marker", b"the end")).message_id
    assert _wait(
        lambda: on_slave.call("QueryMessage", unique_key=marker, topic=f"{TOPIC}-marker")[
            "messages"
        ]
    )
    with engine.connect() as conn:
        stubs = set(conn.execute(sa.select(tables.stub.c.message_id)).scalars())
    absent = {
        mid
        for mid in stubs
        if not on_slave.call("QueryMessage", unique_key=mid, topic=TOPIC)["messages"]
    }
    return stubs, absent


def _unconfirmed(engine: sa.Engine, tables: OutboxTables) -> set[str]:
    with engine.connect() as conn:
        return set(
            conn.execute(
                sa.select(tables.stub.c.message_id).where(tables.stub.c.status != "CONFIRMED")
            ).scalars()
        )


def _drain(consumer: SimpleConsumer, guard: IdempotencyGuard, handle: Any, until: Any) -> None:
    """Receive, consume under the guard and acknowledge until `until()` (60 s at most)."""
    deadline = time.monotonic() + 60
    while not until() and time.monotonic() < deadline:
        for msg in consumer.receive(max_messages=32):
            guard.consume(msg, GROUP, handle)
            consumer.ack(msg)


def _consume_then_resend_what_it_lacks(
    engine: sa.Engine,
    tables: OutboxTables,
    to_slave: Any,
    resender: Producer,
    absent: set[str],
) -> tuple[Counter[str], ResendWorker]:
    """Consume what the promoted slave holds, each confirmed under the guard: exactly the
    stubs it lacks are left unconfirmed. Past the expected latency one pass of the resend
    worker sends exactly those to it, and they are consumed. The times each message was
    handled, and the worker."""
    guard = IdempotencyGuard(engine, tables, None)
    handled: Counter[str] = Counter()

    def handle(message: Any) -> None:
        handled[message.message_id] += 1

    with SimpleConsumer(
        GROUP, {TOPIC: "*"}, transport=to_slave, await_duration_s=1, invisible_duration_s=15
    ) as consumer:
        _drain(consumer, guard, handle, lambda: _unconfirmed(engine, tables) <= absent)
        left = _unconfirmed(engine, tables)
        assert left == absent, (len(left), len(absent))

        time.sleep(LATENCY.total_seconds() + 0.5)  # past the expected latency
        # one pass of the resend worker sends exactly those to the promoted slave
        worker = ResendWorker(
            engine,
            tables,
            resender,
            policy=ResendPolicy(expected_latency=ExpectedLatency(LATENCY)),
        )
        worker.run_once()
        assert worker.metrics.resent == len(left), (worker.metrics.resent, len(left))
        _drain(consumer, guard, handle, lambda: not _unconfirmed(engine, tables))
    return handled, worker


def _assert_the_certificate_is_clean(
    spark: Any, db_url: str, table_prefix: str, stub_count: int
) -> None:
    """One run of the reconciliation: CLEAN, every stub confirmed, none twice."""
    options = ReconcileOptions(
        db_url=db_url,
        table_prefix=table_prefix,
        grace=LATENCY,
        expected_latency=ExpectedLatency(LATENCY),
        spark_conf={"spark.sql.shuffle.partitions": "2"},
    )
    after = reconcile(options, spark=spark).summary.certificate
    assert after.clean and after.unaccounted == 0, after
    assert after.confirmed == stub_count and after.duplicated == 0, after
