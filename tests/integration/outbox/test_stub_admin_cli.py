"""`reliable outbox list|show|void|requeue` on real databases: the operator's actions are
audited, a void stub is never resent by the resend worker, a requeued one is resent at once.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from outbox import Outbox, OutboxTables, ResendWorker, declare_groups, utcnow
from reliable import Message
from reliable_cli import main

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["outbox", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def as_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("db_url", BACKENDS, indirect=True)
def test_list_show_void_requeue_and_the_worker_never_resends_a_void_stub(
    engine: sa.Engine,
    tables: OutboxTables,
    sender: Any,
    offsets: Any,
    db_url: str,
    table_prefix: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = ("--db", db_url, "--table-prefix", table_prefix)
    for topic in ("ob-orders", "ob-other"):
        declare_groups(engine, tables, topic, ["inventory"])
        offsets.committed[("inventory", topic, 0)] = 10**9  # the group passed every copy
    outbox = Outbox(tables, sender)
    with Session(engine) as session, session.begin():
        ids = [
            outbox.publish(
                session, Message("ob-orders" if i < 3 else "ob-other", f"order {i}".encode())
            )
            for i in range(4)
        ]
    assert sender.counts() == {mid: 1 for mid in ids}
    stub = tables.stub
    old = utcnow() - timedelta(hours=2)
    with engine.begin() as conn:  # all four sent long ago, none confirmed; one escalated
        conn.execute(sa.update(stub).values(created_at=old, next_resend_at=old + timedelta(days=1)))
        conn.execute(
            sa.update(stub)
            .where(stub.c.message_id == ids[1])
            .values(send_count=16, escalated_at=old, last_error="broker unreachable")
        )

    listed = as_json(capsys, "list", *db)
    assert [s["message_id"] for s in listed["stubs"]] == ids and listed["more"] is False
    assert [
        s["message_id"]
        for s in as_json(capsys, "list", "--topic", "ob-orders", "--limit", "2", *db)["stubs"]
    ] == ids[:2]
    assert as_json(capsys, "list", "--older-than", "3h", *db)["stubs"] == []
    assert (
        len(as_json(capsys, "list", "--older-than", "1h", "--status", "unconfirmed", *db)["stubs"])
        == 4
    )
    code, text, _ = run(capsys, "list", *db)
    assert code == 0 and "MESSAGE ID" in text and "16/16" in text

    # void: refused without --yes; then VOID, never resent; a second void is refused
    assert run(capsys, "void", ids[0], *db)[0] == 2
    voided = as_json(
        capsys,
        "void",
        ids[0],
        "--yes",
        "--operator",
        "oncall",
        "--reason",
        "order cancelled by hand",
        *db,
    )
    assert (voided["before"]["status"], voided["after"]["status"]) == ("UNCONFIRMED", "VOID")
    code, _, err = run(capsys, "void", ids[0], "--yes", *db)
    assert code == 1 and "is VOID" in err
    assert run(capsys, "show", "no-such-id", *db)[0] == 1

    # requeue: the escalated stub is due now with a fresh send budget
    requeued = as_json(capsys, "requeue", ids[1], "--yes", "--operator", "oncall", *db)
    assert (requeued["before"]["send_count"], requeued["after"]["send_count"]) == (16, 0)
    shown = as_json(capsys, "show", ids[1], *db)
    assert shown["stub"]["send_count"] == 0 and shown["stub"]["escalated_at"] is None
    assert [a["action"] for a in shown["audit"]] == ["OPERATOR_REQUEUE"]
    assert "oncall" in shown["audit"][0]["reason"]
    voided_shown = as_json(capsys, "show", ids[0], *db)
    assert voided_shown["stub"]["status"] == "VOID"
    assert [a["action"] for a in voided_shown["audit"]] == ["OPERATOR_VOID"]
    assert "order cancelled by hand" in voided_shown["audit"][0]["reason"]

    # the void stub is due too: the worker still never sends it
    with engine.begin() as conn:
        conn.execute(sa.update(stub).where(stub.c.message_id == ids[0]).values(next_resend_at=old))
    worker = ResendWorker(engine, tables, sender, offsets=offsets)
    for _ in range(3):
        worker.run_once()
    counts = sender.counts()
    assert counts[ids[0]] == 1  # void: never again
    assert counts[ids[1]] == 2  # requeued: sent again at once
    assert counts[ids[2]] == counts[ids[3]] == 1  # not due yet
    assert as_json(capsys, "show", ids[0], *db)["stub"]["status"] == "VOID"
