"""An outbox publish while the broker's disk is full: recorded, then resent once space is back.

The after-commit send must not block the committing code on flow-control backoff: a full
disk is "service not available", so the producer (default settings) tries its other queues
at once and gives up. The stub keeps the reason in `last_error`; the resend worker sends it
when the disk is below the watermark again, exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import reliable
from broker.broker import Broker
from outbox import Outbox, OutboxTables, ResendWorker, StubStatus
from reliable import Message, Producer
from tests.e2e.helpers import Disk, fill, running_broker, wait_until

TOPIC = "OrderCreated"


@pytest.fixture
def disk() -> Disk:
    return Disk()


@pytest.fixture
def broker(tmp_path: Path, disk: Disk) -> Iterator[Broker]:
    with running_broker(tmp_path / "store", disk_usage=disk) as b:
        yield b


def stored(broker: Broker) -> list[bytes]:
    return [
        m.body
        for q in range(broker.route(TOPIC).read_queue_nums)
        for m in broker.pull_message("probe", TOPIC, q, 0, 32).messages
    ]


def stub_row(engine: sa.Engine, tables: OutboxTables, message_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(tables.stub).where(tables.stub.c.message_id == message_id)
        ).one()


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_publish_on_a_full_disk_records_the_error_and_is_resent_when_space_is_back(
    engine: sa.Engine, tables: OutboxTables, broker: Broker, disk: Disk, clock: Any
) -> None:  # conftest.Clock
    slept: list[float] = []
    transport = reliable.connect("embedded", broker=broker)
    with Producer(transport, sleep=slept.append) as producer:  # default retry settings
        broker.create_topic(TOPIC)
        outbox = Outbox(tables, producer, clock=clock)
        fill(broker, disk, 0.95)
        with Session(engine) as session, session.begin():
            message_id = outbox.publish(session, Message(TOPIC, b"order-1", keys=["o-1"]))
        assert not any(slept)  # the committing thread never waited on flow control
        row = stub_row(engine, tables, message_id)
        assert row.status == StubStatus.UNCONFIRMED.value and row.queue_offset is None
        assert row.last_error and "DISK_FULL" in row.last_error
        assert row.next_resend_at == clock.now + outbox.config.retry_after_failure

        worker = ResendWorker(engine, tables, producer, clock=clock)
        clock.advance(seconds=11)
        assert worker.run_once().resent == 0  # still full: the worker records it too
        row = stub_row(engine, tables, message_id)
        assert row.queue_offset is None and "DISK_FULL" in row.last_error

        fill(broker, disk, 0.6)  # space is back
        clock.advance(hours=1)
        assert worker.run_once().resent == 1
        row = stub_row(engine, tables, message_id)
        assert row.last_error is None
        assert row.queue_offset is not None and row.broker_msg_id
        wait_until(lambda: len(stored(broker)) >= 1, 10, "the resent message to be dispatched")
        assert stored(broker) == [b"order-1"]
        clock.advance(seconds=1)
        assert worker.run_once().resent == 0  # sent once: not due again for a while
        assert stored(broker) == [b"order-1"]
