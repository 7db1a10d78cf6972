"""A dead letter replayed by an operator is reflected by reconciliation: replayed and then
confirmed it is CONFIRMED; replayed and not confirmed yet it is IN_PROCESSING (the group's
log row lost its dead-letter mark, `outbox.stub_admin.reopen_dead_lettered`), never LOST;
not replayed it stays DEAD_LETTERED.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from outbox import OutboxTables
from outbox.reconcile import ReconcileOptions, StubClass, reconcile
from outbox.stub_admin import reopen_dead_lettered

from .dataset import NOW

pytestmark = pytest.mark.spark


def test_replayed_dead_letters_classify_as_confirmed_or_in_processing(
    spark, sqlite_url, table_prefix
):  # type: ignore[no-untyped-def]
    engine = sa.create_engine(sqlite_url)
    tables = OutboxTables(prefix=table_prefix)
    tables.create_all(engine)
    sent = NOW - timedelta(hours=1)
    dead = NOW - timedelta(minutes=50)
    ids = ["replayed-confirmed", "replayed-pending", "still-dead"]
    with engine.begin() as conn:
        for i, mid in enumerate(ids):
            conn.execute(
                sa.insert(tables.stub).values(
                    message_id=mid,
                    topic="orders",
                    body=b"x",
                    body_digest="d",
                    expected_groups="billing",
                    status="UNCONFIRMED",
                    send_count=1,
                    max_sends=16,
                    queue_id=0,
                    queue_offset=i,
                    created_at=sent,
                    updated_at=sent,
                )
            )
            conn.execute(
                sa.insert(tables.consumption_log).values(
                    message_id=mid,
                    consumer_group="billing",
                    topic="orders",
                    queue_id=0,
                    queue_offset=i,
                    created_at=sent,
                    dead_lettered_at=dead,
                )
            )

    before = reconcile(
        ReconcileOptions(db_url=sqlite_url, table_prefix=table_prefix), spark=spark, now=NOW
    ).summary.stubs
    assert before[StubClass.DEAD_LETTERED.value] == 3

    # the operator replays two of them (`reliable admin dlq replay --db ...`)
    assert reopen_dead_lettered(engine, tables, "billing", ids[:2], operator="oncall", now=NOW) == 2
    assert (
        reopen_dead_lettered(engine, tables, "billing", ids[:2], operator="oncall", now=NOW) == 0
    )  # a re-run changes nothing
    # the group processes the first copy and confirms it (what the guard writes)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(tables.confirmation).values(
                message_id=ids[0],
                consumer_group="billing",
                topic="orders",
                confirmed_at=NOW,
                outcome="SUCCESS",
            )
        )
        conn.execute(
            sa.delete(tables.consumption_log).where(tables.consumption_log.c.message_id == ids[0])
        )

    after = reconcile(
        ReconcileOptions(db_url=sqlite_url, table_prefix=table_prefix), spark=spark, now=NOW
    ).summary.stubs
    assert (
        after[StubClass.CONFIRMED.value],
        after[StubClass.IN_PROCESSING.value],
        after[StubClass.DEAD_LETTERED.value],
        after[StubClass.LOST.value],
    ) == (1, 1, 1, 0)
    with engine.connect() as conn:
        audit = conn.execute(
            sa.text(
                f"select action, message_id, consumer_group from {table_prefix}reconcile_audit "
                "order by id"
            )
        ).all()
    assert [tuple(r) for r in audit] == [
        ("DLQ_REPLAY", ids[0], "billing"),
        ("DLQ_REPLAY", ids[1], "billing"),
    ]
    engine.dispose()
