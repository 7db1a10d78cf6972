"""Copies whose queue is unknown (a send over gRPC records `queue_id` -1) and refused sends:
the reconciliation and the resend worker reach the same verdict on the same rows.

No committed offset can speak for a copy whose queue is unknown, so both apply the expected
latency (`outbox.latency.ExpectedLatency`): unconfirmed and unlogged once the stub is older
than its group's latency, the copy is lost (unaccounted; resend due). A stub escalated
because the broker refused it for good is manual, never backlogged.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

import pytest
import sqlalchemy as sa

from outbox import ExpectedLatency, OutboxTables, ResendPolicy, ResendWorker
from outbox.errors import REFUSED_PREFIX
from outbox.reconcile import ReconcileOptions, StubClass, reconcile
from reliable import Message, SendReceipt

from .conftest import ALL_BACKENDS
from .dataset import NOW

pytestmark = pytest.mark.spark

LATENCY = ExpectedLatency(timedelta(minutes=5), {"slow": timedelta(hours=1)})
OLD, NEW = NOW - timedelta(minutes=10), NOW - timedelta(minutes=1)


class ListSender:
    """Stands in for the broker: remembers what the worker sent."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def send(self, message: Message) -> SendReceipt:
        self.sent.append(message.message_id)
        return SendReceipt(message.message_id, message.topic, -1, 100 + len(self.sent))


def _stub(
    mid: str,
    *,
    groups: str = "billing",
    queue_id: int | None = -1,
    offset: int | None = 7,
    created=OLD,
    **extra: object,
) -> dict[str, object]:
    row: dict[str, object] = {
        "message_id": mid,
        "topic": "orders",
        "tags": None,
        "keys": None,
        "body": mid.encode(),
        "body_digest": hashlib.sha256(mid.encode()).hexdigest(),
        "headers": None,
        "expected_groups": groups,
        "status": "UNCONFIRMED",
        "send_count": 1 if offset is not None else 0,
        "max_sends": 16,
        "queue_id": queue_id,
        "queue_offset": offset,
        "next_resend_at": NOW,
        "created_at": created,
        "updated_at": created,
        "last_error": None,
        "escalated_at": None,
        "group_positions": None,
    }
    row.update(extra)
    return row


@pytest.mark.parametrize("db_url", ALL_BACKENDS, indirect=True)
def test_worker_and_certificate_agree_on_copies_whose_queue_is_unknown(
    spark, db_url, engine, table_prefix
):
    tables = OutboxTables(prefix=table_prefix)
    tables.create_all(engine)
    expected = {
        "lost-old": StubClass.LOST,  # gRPC send, older than the latency, nobody confirmed
        "backlog-young": StubClass.BACKLOGGED,  # younger than the latency
        "backlog-slow-group": StubClass.BACKLOGGED,  # its group may take an hour
        "confirmed": StubClass.CONFIRMED,
        "in-processing": StubClass.IN_PROCESSING,  # the group logged it: it is on it
        # a known queue, but no offset or log row says how far the group got: the
        # latency decides there too, so silence never reads as "still coming"
        "known-queue-old": StubClass.LOST,
        "known-queue-young": StubClass.BACKLOGGED,
        "retry-copy-lost": StubClass.LOST,  # its retry-topic copy's queue is unknown
        "refused": StubClass.EXHAUSTED,  # the broker refused it: manual at once
    }
    rows = [
        _stub("lost-old"),
        _stub("backlog-young", created=NEW),
        _stub("backlog-slow-group", groups="slow"),
        _stub("confirmed"),
        _stub("in-processing"),
        _stub("known-queue-old", queue_id=0, offset=3),
        _stub("known-queue-young", queue_id=0, offset=4, created=NEW),
        _stub(
            "retry-copy-lost",
            queue_id=0,
            offset=1,
            send_count=2,
            group_positions=json.dumps({"billing": ["%RETRY%billing", -1, 2]}),
        ),
        _stub(
            "refused",
            queue_id=None,
            offset=None,
            created=NEW,
            escalated_at=NEW,
            last_error=f"{REFUSED_PREFIX}BadRequest: bad_request: body too large",
        ),
    ]
    with engine.begin() as conn:
        conn.execute(sa.insert(tables.stub), rows)
        conn.execute(
            sa.insert(tables.confirmation),
            [
                {
                    "message_id": "confirmed",
                    "consumer_group": "billing",
                    "topic": "orders",
                    "confirmed_at": NEW,
                }
            ],
        )
        conn.execute(
            sa.insert(tables.consumption_log),
            [
                {
                    "message_id": "in-processing",
                    "consumer_group": "billing",
                    "topic": "orders",
                    "queue_id": 2,
                    "queue_offset": 9,
                    "created_at": NEW,
                }
            ],
        )

    result = reconcile(
        ReconcileOptions(db_url=db_url, table_prefix=table_prefix, expected_latency=LATENCY),
        spark=spark,
        now=NOW,
    )
    s = result.summary
    assert s.stubs == {c.value: sum(1 for v in expected.values() if v is c) for c in StubClass}
    cert = s.certificate
    assert not cert.clean
    named = {u.message_id: u for u in cert.unaccounted_messages}
    assert set(named) == {m for m, c in expected.items() if c is StubClass.LOST}
    assert named["lost-old"].missing_groups == "billing"
    assert named["lost-old"].reason == (
        "not confirmed by billing within the expected latency (queue unknown)"
    )
    assert named["known-queue-old"].reason == (
        "not confirmed by billing within the expected latency (no offset for the group)"
    )
    assert cert.manual == 1 and cert.backlogged == 3

    # the resend worker, at the same moment with the same latency, resends exactly those
    sender = ListSender()
    worker = ResendWorker(
        engine, tables, sender, clock=lambda: NOW, policy=ResendPolicy(expected_latency=LATENCY)
    )
    metrics = worker.run_once()
    assert sorted(sender.sent) == sorted(named)
    assert (metrics.resent, metrics.backlogged, metrics.confirmed) == (3, 4, 1)


def test_the_latency_comes_from_the_command_line(capsys) -> None:
    from reliable_cli import build_parser
    from reliable_cli.reconcile import options_from, run

    db_url = "sqlite:///unused.db"
    args = build_parser().parse_args(
        [
            "reconcile",
            "--db",
            db_url,
            "--expected-latency",
            "30",
            "--group-latency",
            "slow=3600",
            "--group-latency",
            "fast=1.5",
        ]
    )
    latency = options_from(args).expected_latency
    assert latency == ExpectedLatency(
        timedelta(seconds=30), {"slow": timedelta(hours=1), "fast": timedelta(seconds=1.5)}
    )
    bad = build_parser().parse_args(["reconcile", "--db", db_url, "--group-latency", "x"])
    assert run(bad) == 2
    assert "expected GROUP=SECONDS" in capsys.readouterr().err


def test_worker_and_reconcile_agree_out_of_the_box() -> None:
    """A user who sets no latency anywhere gets one rule: `reliable worker resend`,
    `reliable reconcile`, `ResendPolicy()` and `ReconcileOptions()` share the default, so a
    copy the worker resends as lost is the copy the certificate counts unaccounted."""
    from outbox.latency import DEFAULT_EXPECTED_LATENCY
    from reliable_cli import build_parser
    from reliable_cli.reconcile import options_from

    parser = build_parser()
    resend = parser.parse_args(
        ["worker", "resend", "--db", "sqlite:///unused.db", "--sender", "app:sender"]
    )
    worker_cli = ExpectedLatency.parse(resend.expected_latency, resend.group_latency)
    reconcile_cli = options_from(
        parser.parse_args(["reconcile", "--db", "sqlite:///unused.db"])
    ).expected_latency
    default = ExpectedLatency(DEFAULT_EXPECTED_LATENCY)
    assert worker_cli == reconcile_cli == default
    assert ResendPolicy().expected_latency == ReconcileOptions().expected_latency == default
