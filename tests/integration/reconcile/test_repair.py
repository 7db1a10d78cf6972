"""Repair, then a resend worker pass, then a second reconciliation: nothing is lost.

The resend pass is the outbox's own `ResendWorker`; its sender appends to a real table
standing for the broker's queues (offsets continue after the highest one in use), and both
the worker and the job read the same committed-offset snapshot.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from outbox.models import OutboxTables
from outbox.reconcile import (
    LogClass,
    ReconcileOptions,
    RepairAction,
    RepairOptions,
    StubClass,
    audit_table,
    reconcile,
)
from outbox.reconcile.repair import Repairer
from outbox.stub_admin import void_stub
from outbox.worker import ResendWorker
from reliable import Message, SendReceipt

from .conftest import BACKENDS
from .dataset import NOW, build

pytestmark = pytest.mark.spark

SNAPSHOT = {
    "offsetTable": {
        "orders@billing": {"0": 21, "1": 51},
        "audit@g2": {"0": 6},
        "%RETRY%g2@g2": {"0": 0},
    }
}


class QueueSender:
    """Sends into a real table of (topic, queue, offset): queue 0, next offset after the
    highest in use (the stubs' own offsets count as in use)."""

    def __init__(self, engine: sa.Engine, prefix: str, heads: dict[str, int]) -> None:
        md = sa.MetaData()
        self.engine = engine
        self.table = sa.Table(
            f"{prefix}queue",
            md,
            sa.Column("topic", sa.String(128), primary_key=True),
            sa.Column("queue_offset", sa.BigInteger, primary_key=True),
            sa.Column("message_id", sa.String(64), nullable=False),
        )
        md.create_all(engine)
        self.heads = heads

    def send(self, message: Message) -> SendReceipt:
        t = self.table
        with self.engine.begin() as conn:
            top = conn.execute(
                sa.select(sa.func.max(t.c.queue_offset)).where(t.c.topic == message.topic)
            ).scalar()
            offset = self.heads.get(message.topic, 0) if top is None else top + 1
            conn.execute(
                sa.insert(t).values(
                    topic=message.topic, queue_offset=offset, message_id=message.message_id
                )
            )
        return SendReceipt(
            message_id=message.message_id, topic=message.topic, queue_id=0, queue_offset=offset
        )


class SnapshotOffsets:
    def __init__(self, doc: dict[str, dict[str, dict[str, int]]]) -> None:
        self.doc = doc["offsetTable"]

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.doc.get(f"{topic}@{group}", {}).get(str(queue_id))


def _stub_fields(engine: sa.Engine, tables: OutboxTables, ids: set[str]) -> dict[str, object]:
    s = tables.stub
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(s.c.message_id, s.c.next_resend_at).where(s.c.message_id.in_(ids))
        ).all()
    return {r.message_id: r.next_resend_at for r in rows}


def _count(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


@pytest.mark.parametrize("db_url", BACKENDS, indirect=True)
def test_repair_then_resend_leaves_nothing_lost(
    spark, db_url, engine, table_prefix, tmp_path: Path
):
    seeded = build(table_prefix, orders_groups="billing")
    seeded.insert(engine)
    tables = seeded.tables
    snapshot = tmp_path / "consumerOffset.json"
    snapshot.write_text(json.dumps(SNAPSHOT))
    lost = seeded.stubs[StubClass.LOST]
    base = ReconcileOptions(db_url=db_url, table_prefix=table_prefix, offsets=str(snapshot))

    def run(**repair: object):  # type: ignore[no-untyped-def]
        return reconcile(
            ReconcileOptions(
                **{**base.__dict__, "repair": True, "repair_options": RepairOptions(**repair)}
            ),
            spark=spark,
            now=NOW,
        )

    # dry run: reports, changes nothing
    dry = run(dry_run=True, batch_size=3).repair
    assert dry is not None and (dry.marked_due, dry.closed_stale) == (6, 2)
    assert set(_stub_fields(engine, tables, lost).values()) == {None}
    assert _count(engine, tables.consumption_log) == len(seeded.log_rows)
    assert not sa.inspect(engine).has_table(f"{table_prefix}reconcile_audit")

    # repair: in batches, audited
    first = run(batch_size=3)
    rep = first.repair
    assert rep is not None and (rep.marked_due, rep.closed_stale, rep.batches) == (6, 2, 3)
    assert set(_stub_fields(engine, tables, lost).values()) == {NOW}
    assert _count(engine, tables.consumption_log) == len(seeded.log_rows) - 2
    audit = audit_table(sa.MetaData(), table_prefix)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(audit.c.run_id, audit.c.action, audit.c.message_id)).all()
    assert {r.run_id for r in rows} == {first.run_id}
    assert {r.message_id for r in rows if r.action == RepairAction.MARK_RESEND_DUE.value} == lost
    stale = {mid for mid, _group in seeded.logs[LogClass.STALE]}
    assert {r.message_id for r in rows if r.action == RepairAction.CLOSE_STALE_LOG.value} == stale

    # re-running changes nothing more: the lost stubs are still lost (their evidence was
    # kept), and already due; nothing moved on since the read
    again = run(batch_size=3).repair
    assert again is not None and (again.marked_due, again.closed_stale) == (0, 0)
    assert (again.already_due, again.skipped) == (6, 0)
    assert _count(engine, audit) == 8

    # the resend worker picks up exactly what was marked due
    heads = {"orders": 27, "audit": 8}
    sender = QueueSender(engine, table_prefix, heads)
    worker = ResendWorker(
        engine, tables, sender, offsets=SnapshotOffsets(SNAPSHOT), clock=lambda: NOW
    )
    metrics = worker.run_once()
    assert metrics.resent == 6

    # resent, not confirmed yet: still unaccounted (a repair marked them due), though no
    # longer lost on the evidence (the new copies are ahead of every group)
    resent = reconcile(ReconcileOptions(**base.__dict__), spark=spark, now=NOW)
    assert not resent.summary.certificate.clean
    assert {(u.message_id, u.reason) for u in resent.summary.certificate.unaccounted_messages} == {
        (mid, "marked due by a repair; not confirmed since") for mid in lost
    }
    stub = tables.stub
    with engine.begin() as conn:  # the consumers confirm the resent copies
        conn.execute(sa.update(stub).where(stub.c.message_id.in_(lost)).values(status="CONFIRMED"))

    report = f"{table_prefix}reconcile_report"
    after = reconcile(
        ReconcileOptions(**{**base.__dict__, "report_table": report}), spark=spark, now=NOW
    )
    s = after.summary
    assert s.stubs[StubClass.LOST.value] == 0
    assert s.stubs[StubClass.CONFIRMED.value] == len(seeded.stubs[StubClass.CONFIRMED]) + 6
    assert s.stubs[StubClass.EXHAUSTED.value] == 2
    assert s.log_rows["STALE"] == 0
    # nothing is lost any more, but two escalations await an operator: not clean yet
    cert = after.summary.certificate
    assert (cert.unaccounted, cert.manual, cert.clean) == (0, 2, False)
    assert cert.verdict == "NOT CLEAN (2 awaiting manual handling)"
    with engine.connect() as conn:  # detail rows appended through JDBC, run id on each
        detail = conn.execute(
            sa.text(
                f'SELECT run_id, class, COUNT(*) FROM "{report}" '
                "WHERE kind = 'stub' GROUP BY run_id, class"
            )
        ).all()
    assert {r[0] for r in detail} == {after.run_id}
    assert {r[1]: r[2] for r in detail} == {
        k: v for k, v in s.stubs.items() if v and k not in ("CONFIRMED", "VOID")
    }

    # an operator voids both escalated messages: the window is clean
    for mid in seeded.stubs[StubClass.EXHAUSTED]:
        assert void_stub(engine, tables, mid, operator="oncall").after["status"] == "VOID"
    resolved = reconcile(ReconcileOptions(**base.__dict__), spark=spark, now=NOW)
    assert resolved.summary.certificate.clean
    assert resolved.summary.certificate.verdict == "CLEAN"


def test_rate_limit_paces_batches(sqlite_url, table_prefix):
    seeded = build(table_prefix)
    engine = sa.create_engine(sqlite_url)
    seeded.insert(engine)
    clock = {"t": 0.0}
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock["t"] += seconds

    lost = sorted(seeded.stubs[StubClass.LOST])
    repairer = Repairer(
        engine,
        seeded.tables,
        "run-1",
        RepairOptions(batch_size=2, rate_limit=4.0),
        now=lambda: NOW,
        sleep=sleep,
        monotonic=lambda: clock["t"],
    )
    report = repairer.run((RepairAction.MARK_RESEND_DUE.value, mid, None, "lost") for mid in lost)
    assert (report.marked_due, report.batches) == (6, 3)
    # 6 changes at 4 per second take 1.5 s: the pacing slept exactly that long
    assert sleeps == [0.5, 0.5, 0.5]
    # a candidate that moved on (confirmed meanwhile) is skipped, not changed
    s = seeded.tables.stub
    with engine.begin() as conn:
        conn.execute(
            sa.update(s)
            .where(s.c.message_id == lost[0])
            .values(status="CONFIRMED", next_resend_at=None)
        )
    again = Repairer(engine, seeded.tables, "run-2", RepairOptions(), now=lambda: NOW)
    report = again.run([(RepairAction.MARK_RESEND_DUE.value, lost[0], None, "lost")])
    assert (report.marked_due, report.skipped) == (0, 1)
