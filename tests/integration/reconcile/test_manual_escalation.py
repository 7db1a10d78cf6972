"""A message the resend worker escalated to manual handling was not consumed: while one is
open the certificate is NOT CLEAN and `reliable reconcile` exits 5 (MANUAL_HANDLING), so a
cron job notices; once an operator resolved each (requeued and then confirmed, or voided),
the window is CLEAN and the exit code 0. Real database, real Spark, a real worker pass."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import sqlalchemy as sa

from outbox import LogNotifier, ResendWorker
from outbox.models import OutboxTables
from outbox.reconcile import StubClass
from reliable_cli import main
from reliable_cli.exit_codes import ExitCode

from .conftest import BACKENDS
from .dataset import NOW, Seeded

pytestmark = pytest.mark.spark


class _Passed:
    """The group's committed offset is past every stub: each unconfirmed one is lost."""

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        return 100


class _NeverCalled:
    def send(self, message: object) -> object:
        raise AssertionError("an exhausted stub is escalated, not sent")


def _reconcile(db_url: str, prefix: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(["reconcile", "--db", db_url, "--prefix", prefix])
    return rc, capsys.readouterr().out


@pytest.mark.parametrize("db_url", BACKENDS, indirect=True)
def test_an_open_escalation_is_not_clean_until_an_operator_resolves_it(
    spark, db_url, engine, table_prefix, capsys
):
    seeded = Seeded(OutboxTables(prefix=table_prefix))
    seeded.tg_rows.append({"topic": "orders", "consumer_group": "billing"})
    done = seeded.stub(StubClass.CONFIRMED, "orders", 0, 0, status="CONFIRMED", groups="billing")
    seeded.confirm(done, "billing", "orders")
    # two stubs that spent their 16 sends, due now: the worker escalates them
    spent = [
        seeded.stub(StubClass.EXHAUSTED, "orders", 0, off, groups="billing", send_count=16)
        for off in (1, 2)
    ]
    for row in seeded.stub_rows[1:]:
        row["next_resend_at"] = NOW - timedelta(minutes=1)
    seeded.insert(engine)
    tables = seeded.tables

    worker = ResendWorker(
        engine, tables, _NeverCalled(), offsets=_Passed(), notifier=LogNotifier(), clock=lambda: NOW
    )  # type: ignore[arg-type]
    assert worker.run_once().escalated == 2

    rc, out = _reconcile(db_url, table_prefix, capsys)
    assert rc == ExitCode.MANUAL_HANDLING == 5, out
    assert "zero-loss certificate [-inf, +inf): NOT CLEAN (2 awaiting manual handling)" in out
    assert "manual 2" in out and "unaccounted 0" in out
    assert main(["reconcile", "--db", db_url, "--prefix", table_prefix, "--json"]) == 5
    doc = json.loads(capsys.readouterr().out)
    assert doc["certificate"]["clean"] is False and doc["exit_code"] == 5

    # the operator voids one and requeues the other, which its group then confirms
    prefix = ["--db", db_url, "--table-prefix", table_prefix, "--yes"]
    assert main(["outbox", "void", spent[0], *prefix, "--reason", "order cancelled"]) == 0
    rc, out = _reconcile(db_url, table_prefix, capsys)
    assert rc == ExitCode.MANUAL_HANDLING and "NOT CLEAN (1 awaiting manual handling)" in out
    assert main(["outbox", "requeue", spent[1], *prefix]) == 0
    with engine.begin() as conn:
        conn.execute(
            sa.insert(tables.confirmation).values(
                message_id=spent[1], consumer_group="billing", topic="orders", confirmed_at=NOW
            )
        )
    capsys.readouterr()
    rc, out = _reconcile(db_url, table_prefix, capsys)
    assert rc == ExitCode.OK, out
    assert "zero-loss certificate [-inf, +inf): CLEAN" in out
    assert "manual 0" in out and "void 1" in out
