"""What the demo says when its flow does not settle: which messages, and where they are."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import sqlalchemy as sa

from outbox import StubStatus
from outbox.adapters import TransportOffsets
from reliable import Message, Producer, connect
from reliable_cli.demo.flow import DemoOptions, _Run
from reliable_cli.demo.shop import GROUP, TOPIC
from reliable_cli.demo.tally import unsettled


def test_a_flow_that_did_not_settle_names_its_messages_and_lagging_queues(
    tmp_path: Path,
) -> None:
    db_url = f"sqlite:///{tmp_path / 'demo.db'}"
    run = _Run(DemoOptions(orders=1), 1, db_url, tmp_path / "store", lambda line: None)
    engine = sa.create_engine(db_url)
    run.shop.create(engine, stock_per_sku=10)
    t = run.shop.tables
    now = dt.datetime(2026, 1, 1)
    stub = {
        "topic": TOPIC,
        "body": b"{}",
        "body_digest": "d",
        "created_at": now,
        "updated_at": now,
        "queue_id": None,
        "queue_offset": None,
        "last_error": None,
    }
    with engine.begin() as conn:
        conn.execute(
            sa.insert(t.stub),
            [
                # sent, then seen by the group, and never confirmed
                {
                    **stub,
                    "message_id": "M-SEEN",
                    "status": StubStatus.UNCONFIRMED.value,
                    "send_count": 1,
                    "queue_id": 2,
                    "queue_offset": 7,
                },
                # its send failed
                {
                    **stub,
                    "message_id": "M-UNSENT",
                    "status": StubStatus.UNCONFIRMED.value,
                    "send_count": 0,
                    "last_error": "broker unreachable",
                },
                # settled: confirmed, or dead-lettered
                {
                    **stub,
                    "message_id": "M-DONE",
                    "status": StubStatus.CONFIRMED.value,
                    "send_count": 1,
                },
                {
                    **stub,
                    "message_id": "M-DLQ",
                    "status": StubStatus.UNCONFIRMED.value,
                    "send_count": 1,
                },
            ],
        )
        log = {
            "consumer_group": GROUP,
            "topic": TOPIC,
            "queue_id": 2,
            "created_at": now,
            "lease_until": None,
            "dead_lettered_at": None,
        }
        conn.execute(
            sa.insert(t.consumption_log),
            [
                {**log, "message_id": "M-SEEN", "queue_offset": 7, "lease_until": now},
                {**log, "message_id": "M-DLQ", "queue_offset": 8, "dead_lettered_at": now},
            ],
        )
    transport = connect("embedded", store_dir=tmp_path / "store")
    transport.start()
    try:
        with Producer(transport) as producer:
            for _ in range(3):
                producer.send(Message(TOPIC, b"x"))
        offsets = TransportOffsets(transport)
        deadline = time.monotonic() + 10
        while sum(offsets.max_offset(TOPIC, q) or 0 for q in range(8)) < 3:  # dispatched
            assert time.monotonic() < deadline, "the sends never reached their queues"
            time.sleep(0.05)
        lines = unsettled(engine, run.shop, offsets)
    finally:
        transport.close()
        engine.dispose()
    named = [line for line in lines if "message M-" in line]
    assert len(named) == 2, lines
    assert "message M-SEEN: stub UNCONFIRMED, 1 send(s), last to queue 2 offset 7" in named[0]
    assert f"in the log at {TOPIC} queue 2 offset 7" in named[0]
    assert "message M-UNSENT: stub UNCONFIRMED, 0 send(s), last to no send recorded" in named[1]
    assert "never in the group's log; last error: broker unreachable" in named[1]
    behind = [line for line in lines if "the group committed" in line]
    # nobody consumed the three messages: every queue that holds one is named, with its end
    assert behind and all(f"unsettled: {TOPIC} queue" in line for line in behind)
    assert sum(int(line.split(": ")[2].split()[0]) for line in behind) == 3
    assert all(line.endswith("the group committed nothing") for line in behind)
