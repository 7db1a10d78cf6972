"""Operator actions on stubs (manual handling after an escalation).

- `void(engine, tables, message_id)`: the message must never be resent (e.g. the order it
  announced was cancelled by hand); the stub leaves every resend and reconciliation count
  as VOID.
- `requeue(engine, tables, message_id)`: the cause of an escalation was fixed; the stub
  gets a fresh send budget and is due now.

Both act only on UNCONFIRMED stubs and return whether a stub was changed.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Engine, update

from outbox.models import OutboxTables, StubStatus
from outbox.ports import utcnow


def void(
    engine: Engine,
    tables: OutboxTables,
    message_id: str,
    *,
    reason: str = "voided by an operator",
    now: datetime | None = None,
) -> bool:
    stub = tables.stub
    with engine.begin() as conn:
        result = conn.execute(
            update(stub)
            .where(
                stub.c.message_id == message_id,
                stub.c.status == StubStatus.UNCONFIRMED.value,
            )
            .values(
                status=StubStatus.VOID.value,
                last_error=reason[:2000],
                claimed_by=None,
                updated_at=now or utcnow(),
            )
        )
        return bool(result.rowcount == 1)


def requeue(
    engine: Engine, tables: OutboxTables, message_id: str, *, now: datetime | None = None
) -> bool:
    stub = tables.stub
    at = now or utcnow()
    with engine.begin() as conn:
        result = conn.execute(
            update(stub)
            .where(
                stub.c.message_id == message_id,
                stub.c.status == StubStatus.UNCONFIRMED.value,
            )
            .values(
                escalated_at=None, send_count=0, next_resend_at=at, claimed_by=None, updated_at=at
            )
        )
        return bool(result.rowcount == 1)
