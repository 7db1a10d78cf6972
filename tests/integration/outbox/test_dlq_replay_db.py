"""`reliable admin dlq replay --db URL` on a stopped store: the replayed messages' log rows
of the group lose their dead-letter mark (audited); a re-run replays and changes nothing;
the replay ledger survives reopening the store.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from broker.broker import Broker
from broker.store.message import Message
from idempotency.store import ConfirmStatus, GuardStore
from outbox import OutboxTables
from protocol.props import Prop
from reliable import ReceivedMessage
from reliable_cli import admin_ops, main
from tests.e2e.helpers import store_config


def dead_letters(store: Path, n: int) -> list[str]:
    """A stopped store whose group `billing` dead-lettered `n` messages of `orders`."""
    broker = Broker(store_config(store))
    broker.start()
    try:
        broker.create_topic("orders", queues=2)
        broker.create_group("billing", retry_max_times=0)
        ids = [f"MSG{i:04d}" for i in range(n)]
        for i, mid in enumerate(ids):
            broker.send_message(
                Message(topic="orders", body=b"x", queue_id=i % 2, properties={Prop.UNIQ_KEY: mid})
            )
        broker.store.wait_dispatched(timeout_s=10)
        got = broker.receive("billing", "orders", 32, 60_000, long_poll_ms=2_000)
        assert len(got) == n
        for entry in got:
            broker.forward_to_dlq("billing", "orders", entry.receipt_handle)
    finally:
        broker.shutdown()
    return ids


def test_replay_with_db_reopens_the_groups_log_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    ids = dead_letters(store, 4)
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    engine = sa.create_engine(url)
    tables = OutboxTables()
    tables.create_all(engine)
    log = tables.consumption_log
    with engine.begin() as conn:
        for i, mid in enumerate(ids):
            for group in ("billing", "shipping"):
                conn.execute(
                    sa.insert(log).values(
                        message_id=mid,
                        consumer_group=group,
                        topic="orders",
                        queue_id=i % 2,
                        queue_offset=i // 2,
                        created_at=sa.func.current_timestamp(),
                        dead_lettered_at=sa.func.current_timestamp(),
                    )
                )
    args = [
        "admin",
        "dlq",
        "replay",
        "--group",
        "billing",
        "--store",
        str(store),
        "--db",
        url,
        "--operator",
        "oncall",
        "--id",
        ids[0],
        "--id",
        ids[1],
        "--json",
    ]
    assert main(args) == 0
    out = capsys.readouterr()
    assert sorted(r["msg_id"] for r in json.loads(out.out)["replayed"]) == ids[:2]
    assert "2 dead-lettered row(s) of billing back in processing" in out.err

    def marked() -> set[tuple[str, str]]:
        with engine.connect() as conn:
            return {
                (r.message_id, r.consumer_group)
                for r in conn.execute(
                    sa.select(log.c.message_id, log.c.consumer_group).where(
                        log.c.dead_lettered_at.is_not(None)
                    )
                )
            }

    assert marked() == (
        {(m, "billing") for m in ids[2:]} | {(m, "shipping") for m in ids}
    )  # only the group's own rows
    assert main(args) == 0  # a re-run: nothing replayed, nothing changed
    again = json.loads(capsys.readouterr().out)
    assert again["replayed"] == [] and len(again["already_replayed"]) == 2
    assert (
        main(
            [
                "admin",
                "dlq",
                "list",
                "--group",
                "billing",
                "--pending",
                "--store",
                str(store),
                "--json",
            ]
        )
        == 0
    )
    pending = json.loads(capsys.readouterr().out)
    assert sorted(m["msg_id"] for m in pending["messages"]) == ids[2:]
    assert (pending["depth"], pending["replayed"], pending["pending"]) == (4, 2, 2)
    with engine.connect() as conn:
        actions = conn.execute(
            sa.text("select action, message_id from reliable_reconcile_audit order by id")
        ).all()
    assert [tuple(a) for a in actions] == [("DLQ_REPLAY", ids[0]), ("DLQ_REPLAY", ids[1])]
    engine.dispose()


def test_a_row_the_consumer_settles_before_the_marks_are_cleared_still_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fast consumer confirms a replayed message (its confirmation deletes the log row)
    between the broker's replay and the command clearing the marks: the command still
    reports, and audits, every row its replay brought back."""
    store = tmp_path / "store"
    ids = dead_letters(store, 3)
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    engine = sa.create_engine(url)
    tables = OutboxTables()
    tables.create_all(engine)
    guard = GuardStore(engine, tables)
    with engine.begin() as conn:
        for i, mid in enumerate(ids):
            conn.execute(
                sa.insert(tables.consumption_log).values(
                    message_id=mid,
                    consumer_group="billing",
                    topic="orders",
                    queue_id=i % 2,
                    queue_offset=i // 2,
                    created_at=sa.func.current_timestamp(),
                    dead_lettered_at=sa.func.current_timestamp(),
                )
            )
    replay = admin_ops._paced_replay

    def replay_then_consume(*args: Any, **kwargs: Any) -> Any:
        done = replay(*args, **kwargs)
        now = datetime.now(UTC).replace(tzinfo=None)
        for mid in ids[:2]:  # the consumer settles two of the three at once
            assert guard.claim(mid, "billing", "tok", now, now + timedelta(minutes=1))
            with engine.begin() as conn:
                seen = ReceivedMessage(mid, "%RETRY%billing", b"x", 0, 0)
                status = guard.confirm(conn, seen, "billing", "tok", "d", "OK", now)
                assert status is ConfirmStatus.CONFIRMED
        return done

    monkeypatch.setattr(admin_ops, "_paced_replay", replay_then_consume)
    args = ["admin", "dlq", "replay", "--group", "billing", "--store", str(store)]
    assert main([*args, "--db", url, "--operator", "oncall", "--json"]) == 0
    out = capsys.readouterr()
    assert sorted(r["msg_id"] for r in json.loads(out.out)["replayed"]) == ids
    assert "3 dead-lettered row(s) of billing back in processing" in out.err
    with engine.connect() as conn:
        left = conn.execute(sa.select(tables.consumption_log.c.message_id)).scalars().all()
        audited = conn.execute(
            sa.text("select message_id, reason from reliable_reconcile_audit order by id")
        ).all()
    assert left == [ids[2]]
    assert [a.message_id for a in audited] == ids
    assert [a.reason.endswith("(its consumer already took it)") for a in audited] == [
        True,
        True,
        False,
    ]
    engine.dispose()


def test_an_unreachable_database_stops_the_replay_before_anything_is_replayed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    dead_letters(store, 1)
    empty = tmp_path / "empty.db"
    empty.touch()  # a database without the outbox tables
    args = ["admin", "dlq", "replay", "--group", "billing", "--store", str(store)]
    assert main([*args, "--db", f"sqlite:///{empty}"]) == 4
    assert "--db" in capsys.readouterr().err
    assert main([*args, "--db", f"sqlite:///{tmp_path / 'typo.db'}"]) == 2  # no such file
    assert "no such SQLite database file" in capsys.readouterr().err
    assert main([*args, "--dry-run", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["would_replay"]) == 1
