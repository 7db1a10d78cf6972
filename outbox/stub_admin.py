"""An operator's view of and actions on stubs, audited: what `reliable outbox ...` runs, and
the one implementation of each action (`outbox.void_stub`, `outbox.requeue_stub`).

- `list_stubs`: stubs by status, age and topic, oldest first, bounded.
- `show_stub`: one stub with its confirmation and consumption-log rows and its audit rows.
- `void_stub`: status VOID: never resent; reconciliation counts it void, never lost.
- `requeue_stub`: due now, with a fresh send budget: `send_count` goes back to 0 and the
  escalation is cleared, as transaction-outbox's `unblock` does (the operator fixed the
  cause; keeping the count would re-escalate it after one send).
- `reopen_dead_lettered`: after a DLQ replay, the group's consumption-log rows of the
  replayed messages lose their dead-letter mark, so reconciliation counts them in
  processing (and confirmed once the group confirms), not dead-lettered; `dead_lettered`
  reads the marks before the replay, so that a row a fast consumer settled in between
  still counts as changed.

Every change writes one row to the repair audit table `<prefix>reconcile_audit`
(`outbox.reconcile.repair.audit_table`: run id, action, message id, group, reason,
before/after as JSON, time) in the same transaction as the change. Void and requeue act
only on UNCONFIRMED stubs; `StubNotFound` / `StubNotOpen` say why nothing changed.
"""

from __future__ import annotations

import enum
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from outbox.errors import OutboxError
from outbox.models import OutboxTables, StubStatus
from outbox.ports import utcnow
from outbox.reconcile.repair import audit_table

MAX_LIST = 1000
_STUB_FIELDS = (
    "message_id",
    "topic",
    "tags",
    "keys",
    "status",
    "send_count",
    "max_sends",
    "queue_id",
    "queue_offset",
    "broker_msg_id",
    "expected_groups",
    "next_resend_at",
    "escalated_at",
    "created_at",
    "updated_at",
    "last_error",
    "claimed_by",
    "group_positions",
)


class OperatorAction(enum.Enum):
    """What an operator did (the audit table's `action`)."""

    VOID = "OPERATOR_VOID"
    REQUEUE = "OPERATOR_REQUEUE"
    DLQ_REPLAY = "DLQ_REPLAY"  # a dead-lettered log row back in processing


class StubNotFound(OutboxError):
    """No stub has this message id."""

    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        super().__init__(f"no stub with message id {message_id!r}")


class StubNotOpen(OutboxError):
    """The stub is not UNCONFIRMED (already confirmed or void): the action does not apply."""

    def __init__(self, message_id: str, status: str) -> None:
        self.message_id = message_id
        self.status = status
        super().__init__(
            f"stub {message_id!r} is {status}; only UNCONFIRMED stubs can be voided or requeued"
        )


@dataclass(frozen=True)
class ActionResult:
    message_id: str
    action: OperatorAction
    run_id: str
    before: dict[str, Any]
    after: dict[str, Any]

    def to_json(self) -> dict[str, object]:
        return {
            "message_id": self.message_id,
            "action": self.action.value,
            "run_id": self.run_id,
            "before": self.before,
            "after": self.after,
        }


def _plain(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, bytes):
        return value.hex()
    return value


def _row(row: Any, fields: Sequence[str]) -> dict[str, Any]:
    m = row._mapping
    return {f: _plain(m[f]) for f in fields}


def list_stubs(
    engine: sa.Engine,
    tables: OutboxTables,
    *,
    status: str | None = None,
    older_than: timedelta | None = None,
    topic: str | None = None,
    limit: int = 50,
    now: datetime | None = None,
) -> tuple[list[dict[str, Any]], bool]:
    """(stubs, more): oldest first, at most `limit` (1..1000)."""
    if not 1 <= limit <= MAX_LIST:
        raise ValueError(f"limit must be 1..{MAX_LIST}")
    stub = tables.stub
    q = sa.select(*[stub.c[f] for f in _STUB_FIELDS])
    if status is not None:
        q = q.where(stub.c.status == StubStatus(status.upper()).value)
    if older_than is not None:
        q = q.where(stub.c.created_at < (now or utcnow()) - older_than)
    if topic is not None:
        q = q.where(stub.c.topic == topic)
    q = q.order_by(stub.c.created_at, stub.c.id).limit(limit + 1)
    with engine.connect() as conn:
        rows = [_row(r, _STUB_FIELDS) for r in conn.execute(q)]
    return rows[:limit], len(rows) > limit


def show_stub(engine: sa.Engine, tables: OutboxTables, message_id: str) -> dict[str, Any]:
    """The stub, its confirmation and consumption-log rows, and its audit rows."""
    stub, conf, log = tables.stub, tables.confirmation, tables.consumption_log
    audit = audit_table(tables.metadata, tables.prefix, tables.schema)
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(*[stub.c[f] for f in _STUB_FIELDS]).where(stub.c.message_id == message_id)
        ).first()
        if row is None:
            raise StubNotFound(message_id)
        confirmations = [
            _row(r, ("consumer_group", "topic", "confirmed_at", "outcome"))
            for r in conn.execute(
                sa.select(conf).where(conf.c.message_id == message_id).order_by(conf.c.confirmed_at)
            )
        ]
        logs = [
            _row(
                r,
                (
                    "consumer_group",
                    "topic",
                    "queue_id",
                    "queue_offset",
                    "created_at",
                    "lease_until",
                    "dead_lettered_at",
                ),
            )
            for r in conn.execute(
                sa.select(log).where(log.c.message_id == message_id).order_by(log.c.created_at)
            )
        ]
        audits: list[dict[str, Any]] = []
        if sa.inspect(conn).has_table(audit.name, schema=tables.schema):
            audits = [
                _row(
                    r,
                    (
                        "run_id",
                        "action",
                        "consumer_group",
                        "reason",
                        "before",
                        "after",
                        "changed_at",
                    ),
                )
                for r in conn.execute(
                    sa.select(audit).where(audit.c.message_id == message_id).order_by(audit.c.id)
                )
            ]
    return {
        "stub": _row(row, _STUB_FIELDS),
        "confirmations": confirmations,
        "consumption_log": logs,
        "audit": audits,
    }


def _act(
    engine: sa.Engine,
    tables: OutboxTables,
    message_id: str,
    action: OperatorAction,
    values: dict[str, Any],
    reason: str,
    run_id: str | None,
    now: datetime,
) -> ActionResult:
    stub = tables.stub
    audit = audit_table(tables.metadata, tables.prefix, tables.schema)
    audit.create(engine, checkfirst=True)
    watched = ("status", "send_count", "next_resend_at", "escalated_at", "last_error")
    run = run_id or uuid.uuid4().hex
    with engine.begin() as conn:
        current = conn.execute(
            sa.select(*[stub.c[f] for f in watched])
            .where(stub.c.message_id == message_id)
            .with_for_update()
        ).first()
        if current is None:
            raise StubNotFound(message_id)
        before = _row(current, watched)
        if current.status != StubStatus.UNCONFIRMED.value:
            raise StubNotOpen(message_id, current.status)
        conn.execute(
            sa.update(stub)
            .where(stub.c.message_id == message_id, stub.c.status == StubStatus.UNCONFIRMED.value)
            .values(**values, updated_at=now)
        )
        after = {**before, **{k: _plain(v) for k, v in values.items() if k in watched}}
        conn.execute(
            sa.insert(audit).values(
                run_id=run,
                action=action.value,
                message_id=message_id,
                consumer_group=None,
                reason=reason,
                before=json.dumps(before, sort_keys=True),
                after=json.dumps(after, sort_keys=True),
                changed_at=now,
            )
        )
    return ActionResult(message_id, action, run, before, after)


def void_stub(
    engine: sa.Engine,
    tables: OutboxTables,
    message_id: str,
    *,
    operator: str,
    reason: str = "voided by an operator",
    run_id: str | None = None,
    now: datetime | None = None,
) -> ActionResult:
    """Status VOID: the resend worker never sends it again."""
    at = now or utcnow()
    text = f"{reason} ({operator})"
    return _act(
        engine,
        tables,
        message_id,
        OperatorAction.VOID,
        {"status": StubStatus.VOID.value, "last_error": text[:2000], "claimed_by": None},
        text,
        run_id,
        at,
    )


def requeue_stub(
    engine: sa.Engine,
    tables: OutboxTables,
    message_id: str,
    *,
    operator: str,
    reason: str = "requeued by an operator",
    run_id: str | None = None,
    now: datetime | None = None,
) -> ActionResult:
    """Due now with a fresh send budget (send_count 0, escalation cleared)."""
    at = now or utcnow()
    return _act(
        engine,
        tables,
        message_id,
        OperatorAction.REQUEUE,
        {"send_count": 0, "escalated_at": None, "next_resend_at": at, "claimed_by": None},
        f"{reason} ({operator})",
        run_id,
        at,
    )


def dead_lettered(
    engine: sa.Engine, tables: OutboxTables, group: str, message_ids: Sequence[str]
) -> dict[str, datetime]:
    """The group's dead-lettered log rows among these messages: message id -> its stamp.

    Read before a DLQ replay and handed to `reopen_dead_lettered`: a consumer may settle
    a replayed message (its confirmation deletes the log row) before the marks are
    cleared, and the replay still changed that row."""
    log = tables.consumption_log
    ids = list(dict.fromkeys(message_ids))
    found: dict[str, datetime] = {}
    with engine.connect() as conn:
        for i in range(0, len(ids), 500):
            for row in conn.execute(
                sa.select(log.c.message_id, log.c.dead_lettered_at).where(
                    log.c.consumer_group == group,
                    log.c.message_id.in_(ids[i : i + 500]),
                    log.c.dead_lettered_at.is_not(None),
                )
            ):
                found[row.message_id] = row.dead_lettered_at
    return found


def reopen_dead_lettered(
    engine: sa.Engine,
    tables: OutboxTables,
    group: str,
    message_ids: Sequence[str],
    *,
    operator: str,
    run_id: str | None = None,
    now: datetime | None = None,
    marked_before: Mapping[str, datetime] | None = None,
) -> int:
    """Clear `dead_lettered_at` on the group's log rows of these messages (they were
    replayed from the DLQ); returns how many rows the replay brought back.

    `marked_before` (`dead_lettered`, read before the replay): a row marked then and no
    longer marked now was already taken by the group's consumer (confirmed, so its row
    is gone, or cleared); it counts and is audited too, since the replay changed it.
    """
    log = tables.consumption_log
    audit = audit_table(tables.metadata, tables.prefix, tables.schema)
    audit.create(engine, checkfirst=True)
    at = now or utcnow()
    run = run_id or uuid.uuid4().hex
    before = marked_before or {}
    changed = 0
    ids = list(dict.fromkeys(message_ids))
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        with engine.begin() as conn:
            marked = conn.execute(
                sa.select(log.c.message_id, log.c.dead_lettered_at)
                .where(
                    log.c.consumer_group == group,
                    log.c.message_id.in_(chunk),
                    log.c.dead_lettered_at.is_not(None),
                )
                .with_for_update()
            ).all()
            still = {m.message_id for m in marked}
            taken = [(mid, before[mid]) for mid in chunk if mid in before and mid not in still]
            if not marked and not taken:
                continue
            if marked:
                conn.execute(
                    sa.update(log)
                    .where(log.c.consumer_group == group, log.c.message_id.in_(still))
                    .values(dead_lettered_at=None)
                )
            reason = f"replayed from the dead-letter queue by {operator}"
            conn.execute(
                sa.insert(audit),
                [
                    {
                        "run_id": run,
                        "action": OperatorAction.DLQ_REPLAY.value,
                        "message_id": mid,
                        "consumer_group": group,
                        "reason": reason + note,
                        "before": json.dumps({"dead_lettered_at": _plain(stamp)}),
                        "after": json.dumps({"dead_lettered_at": None}),
                        "changed_at": at,
                    }
                    for mid, stamp, note in sorted(
                        [(m.message_id, m.dead_lettered_at, "") for m in marked]
                        + [(mid, stamp, " (its consumer already took it)") for mid, stamp in taken]
                    )
                ],
            )
            changed += len(marked) + len(taken)
    return changed
