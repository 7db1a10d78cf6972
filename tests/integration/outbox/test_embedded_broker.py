"""The outbox, the guard and the resend worker wired to the real embedded broker.

Two consumer groups read `OrderCreated`; the billing consumer acknowledges one message
without processing it (a lost message: its committed offset passes the message, no
confirmation). The resend worker, watching the broker's committed offsets, resends that
message through `%RETRY%billing` only; billing then processes it once, inventory never
sees it twice, and every stub ends CONFIRMED.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import reliable
from idempotency import GuardConfig, IdempotencyGuard
from outbox import (
    Outbox,
    OutboxTables,
    ResendPolicy,
    ResendWorker,
    StubStatus,
    declare_groups,
    utcnow,
)
from outbox.adapters import TransportOffsets
from reliable import ConsumeResult, Message, Producer, ReceivedMessage, Worker, handler
from reliable.outcomes import RetryLater
from tests.e2e.helpers import FAST, broker_config, stays, store_config, wait_until

TOPIC = "OrderCreated"


@pytest.mark.redis
@pytest.mark.parametrize(
    "db_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_lost_message_is_resent_to_the_missing_group_only(
    engine: sa.Engine, tables: OutboxTables, redis_client, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    transport = reliable.connect(
        "embedded", store_config=store_config(tmp_path / "store"), broker_config=broker_config()
    )
    transport.start()
    declare_groups(engine, tables, TOPIC, ["inventory", "billing"])
    guard = IdempotencyGuard(
        engine, tables, redis_client, config=GuardConfig(key_prefix=f"it:{tmp_path.name}:")
    )
    seen: dict[str, Counter[str]] = {"inventory": Counter(), "billing": Counter()}
    lock = threading.Lock()
    lost: list[str] = []

    @handler(TOPIC, group="inventory", idempotent=guard, **FAST)
    def reserve(message: ReceivedMessage, session: Session) -> None:
        with lock:
            seen["inventory"][message.message_id] += 1

    def record_billing(message: ReceivedMessage, session: Session) -> None:
        with lock:
            seen["billing"][message.message_id] += 1

    @handler(TOPIC, group="billing", **FAST)
    def bill(message: ReceivedMessage) -> None:
        with lock:
            if not lost and message.body == b"order 2":
                lost.append(message.message_id)
                return  # acknowledged, never processed: the message is lost for billing
        if guard.consume(message, "billing", record_billing) is not ConsumeResult.SUCCESS:
            raise RetryLater()

    try:
        with Producer(transport) as producer, Worker(reserve, bill, transport=transport):
            outbox = Outbox(tables, producer)
            with Session(engine) as session, session.begin():
                ids = [
                    outbox.publish(session, Message(topic=TOPIC, body=f"order {i}".encode()))
                    for i in range(3)
                ]
            wait_until(
                lambda: len(seen["inventory"]) == 3 and len(seen["billing"]) == 2,
                what="both groups consumed",
            )
            worker = ResendWorker(
                engine,
                tables,
                producer,
                offsets=TransportOffsets(transport),
                bounds=TransportOffsets(transport),
                clock=lambda: utcnow() + timedelta(hours=1),
                policy=ResendPolicy(recheck_after=timedelta(0)),
            )
            # the committed offset reaches the broker within a persist interval: poll
            wait_until(
                lambda: worker.run_once().resent == 1 or worker.metrics.resent >= 1,
                what="the resend of the lost message",
            )
            wait_until(lambda: seen["billing"][lost[0]] == 1, what="billing got the resend")
            assert stays(lambda: seen["inventory"] == Counter(dict.fromkeys(ids, 1)), 1.0)
            assert seen["billing"] == Counter(dict.fromkeys(ids, 1))
            assert worker.metrics.resent == 1
        with engine.connect() as conn:
            statuses = dict(
                conn.execute(sa.select(tables.stub.c.message_id, tables.stub.c.status)).all()
            )
        assert statuses == dict.fromkeys(ids, StubStatus.CONFIRMED.value)
    finally:
        transport.close()
