"""Dead letters on record: `@dlq_handler(group, mark_dead_letters=guard)` stamps
`consumption_log.dead_lettered_at` for (original message id, group), which reconciliation
reads to tell a dead-lettered message from one still being processed.

Real broker (embedded), real Redis, SQLite and PostgreSQL; the handler always fails, so the
message walks the real retry ladder (fast delay levels) into `%DLQ%<group>`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import reliable
from idempotency import GuardConfig, IdempotencyGuard, NotADeadLetter, dead_letter_origin
from outbox import Outbox, OutboxTables, declare_groups
from reliable import (
    ConfigurationError,
    Message,
    Producer,
    ReceivedMessage,
    Transport,
    Worker,
    dlq_handler,
    handler,
)
from tests.e2e.helpers import FAST, broker_config, stays, store_config, wait_until

TOPIC = "OrderPlaced"


@pytest.fixture
def transport(tmp_path: Path) -> Iterator[Transport]:
    t = reliable.connect(
        "embedded", store_config=store_config(tmp_path / "store"), broker_config=broker_config()
    )
    t.start()
    yield t
    t.close()


def log_rows(engine: sa.Engine, tables: OutboxTables) -> list[Any]:
    log = tables.consumption_log
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(
                    log.c.message_id, log.c.consumer_group, log.c.topic, log.c.dead_lettered_at
                )
            ).all()
        )


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_a_dead_letter_is_stamped_for_its_group_by_original_id(
    engine: sa.Engine,
    tables: OutboxTables,
    redis_client: Any,
    key_prefix: str,
    transport: Transport,
) -> None:
    guard = IdempotencyGuard(
        engine, tables, redis_client, config=GuardConfig(key_prefix=key_prefix)
    )
    declare_groups(engine, tables, TOPIC, ["billing", "audit"])
    attempts: list[str] = []
    dead: list[ReceivedMessage] = []
    stamped_before: list[object] = []
    audited: list[str] = []
    lock = threading.Lock()

    @handler(TOPIC, group="billing", idempotent=guard, max_reconsume_times=1, **FAST)
    def bill(message: ReceivedMessage) -> None:
        with lock:
            attempts.append(message.message_id)
        raise RuntimeError("payment provider rejects this order")

    @handler(TOPIC, group="audit", idempotent=guard, **FAST)
    def audit(message: ReceivedMessage) -> None:
        with lock:
            audited.append(message.message_id)

    @dlq_handler("billing", mark_dead_letters=guard, **FAST)
    def billing_dead_letters(message: ReceivedMessage) -> None:
        log = tables.consumption_log.c
        with engine.connect() as conn:  # stamped before this function runs
            stamped = conn.execute(
                sa.select(log.dead_lettered_at).where(log.consumer_group == "billing")
            ).scalar()
        with lock:
            stamped_before.append(stamped)
            dead.append(message)

    with (
        Producer(transport) as producer,
        Worker(bill, audit, billing_dead_letters, transport=transport),
    ):
        outbox = Outbox(tables, producer)
        with sa.orm.Session(engine) as session, session.begin():
            message_id = outbox.publish(session, Message(TOPIC, b"order 7", keys=["o-7"]))
        wait_until(lambda: len(dead) == 1 and len(audited) == 1, 20, "the dead letter")
        assert stays(lambda: len(dead) == 1, 0.3)

    assert attempts == [message_id, message_id]  # first delivery + 1 retry, then the DLQ
    assert dead[0].topic == "%DLQ%billing" and dead[0].message_id == message_id
    assert stamped_before[0] is not None
    rows = log_rows(engine, tables)
    # billing: one row, keyed by the original id and group, dead-lettered; audit confirmed
    # (its row deleted); nothing for the DLQ consumer's own group
    assert [(r.message_id, r.consumer_group, r.topic) for r in rows] == [
        (message_id, "billing", TOPIC)
    ]
    assert rows[0].dead_lettered_at is not None


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_marking_without_a_prior_delivery_inserts_the_row_once(
    engine: sa.Engine, tables: OutboxTables, redis_client: Any, key_prefix: str
) -> None:
    guard = IdempotencyGuard(
        engine, tables, redis_client, config=GuardConfig(key_prefix=key_prefix)
    )
    copy = ReceivedMessage(
        message_id="M1",
        topic="%DLQ%billing",
        body=b"x",
        queue_id=0,
        queue_offset=3,
        offset_msg_id="OFF-DLQ",
        properties={"DLQ_ORIGIN_TOPIC": TOPIC, "ORIGIN_MESSAGE_ID": "OFF-1"},
    )
    assert guard.mark_dead_lettered(copy) == "M1"
    first = log_rows(engine, tables)
    assert guard.mark_dead_lettered(copy, "billing") == "M1"  # redelivered: no change
    assert log_rows(engine, tables) == first
    assert [(r.message_id, r.consumer_group, r.topic) for r in first] == [("M1", "billing", TOPIC)]
    with pytest.raises(NotADeadLetter):
        guard.mark_dead_lettered(copy, "shipping")  # another group's DLQ
    with pytest.raises(NotADeadLetter):
        guard.mark_dead_lettered(ReceivedMessage("M2", TOPIC, b"x", 0, 0))


def test_original_id_of_a_copy_sent_without_a_client_id() -> None:
    # no UNIQ_KEY: the copy's id is its own offset id; the first copy's is ORIGIN_MESSAGE_ID
    copy = ReceivedMessage(
        message_id="OFF-DLQ",
        topic="%DLQ%billing",
        body=b"x",
        queue_id=0,
        queue_offset=0,
        offset_msg_id="OFF-DLQ",
        properties={
            "ORIGIN_MESSAGE_ID": "OFF-1",
            "DLQ_ORIGIN_MESSAGE_ID": "OFF-RETRY",
            "RETRY_TOPIC": TOPIC,
        },
    )
    assert dead_letter_origin(copy) == ("OFF-1", "billing", TOPIC)


def test_mark_dead_letters_is_checked_at_declaration() -> None:
    with pytest.raises(ConfigurationError):

        @handler(TOPIC, group="billing", mark_dead_letters=True)
        def not_a_dlq(message: ReceivedMessage) -> None: ...

    with pytest.raises(ConfigurationError):

        @dlq_handler("billing", mark_dead_letters=object())
        def no_guard(message: ReceivedMessage) -> None: ...
