"""Claiming due stubs so several resend workers never handle the same stub at once.

A claim is one short transaction that stamps the chosen rows with the worker's claim token
(`claimed_by`) and pushes `next_resend_at` forward by the claim TTL, so no other worker sees
them as due; the worker then sends outside any lock and finalises each row with
`... WHERE id = :id AND claimed_by = :token`. A worker that dies mid-batch leaves its claim to
expire: its rows become due again after the TTL.

How the rows are picked depends on what the database offers (capabilities, not dialect
checks scattered through the worker):

- `SKIP_LOCKED` (PostgreSQL, MySQL 8, MariaDB 10.6+): `SELECT ... FOR UPDATE SKIP LOCKED`,
  so concurrent workers take disjoint batches without waiting for each other. Where the
  database has `UPDATE ... RETURNING` (PostgreSQL), the pick is a subquery of the stamping
  UPDATE, which returns the claimed rows: one statement.
- `FOR_UPDATE` (older MariaDB/MySQL): plain `FOR UPDATE`; a second worker waits, then sees
  the pushed `next_resend_at` and skips those rows.
- `ATOMIC_UPDATE` (SQLite: one writer at a time): a single
  `UPDATE ... WHERE id IN (SELECT ... LIMIT n)`; the statement runs under the database
  write lock, so two workers' claims serialise and never overlap.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import ColumnElement, Connection, and_, literal, select, update
from sqlalchemy.engine import RowMapping

from outbox.errors import UnsupportedDatabase
from outbox.models import OutboxTables, StubStatus


class ClaimStrategy(enum.Enum):
    SKIP_LOCKED = "skip_locked"
    FOR_UPDATE = "for_update"
    ATOMIC_UPDATE = "atomic_update"


def strategy_for(conn: Connection) -> ClaimStrategy:
    dialect = conn.dialect
    name = dialect.name
    if name == "postgresql":
        return ClaimStrategy.SKIP_LOCKED
    if name in ("mysql", "mariadb"):
        version = tuple(dialect.server_version_info or ())
        is_maria = bool(getattr(dialect, "is_mariadb", False))
        floor = (10, 6) if is_maria else (8, 0)
        return ClaimStrategy.SKIP_LOCKED if version >= floor else ClaimStrategy.FOR_UPDATE
    if name == "sqlite":
        return ClaimStrategy.ATOMIC_UPDATE
    raise UnsupportedDatabase(name)


def due_clause(tables: OutboxTables, now: datetime) -> ColumnElement[bool]:
    """UNCONFIRMED, not escalated, and due: `next_resend_at <= now` (`>` would select only
    the stubs not yet due)."""
    s = tables.stub.c
    # the status as a literal, never a parameter: it is the predicate of the partial
    # `ix_stub_resend` (`outbox.models`), which the planner uses only when it can prove it
    return and_(
        s.status == literal(StubStatus.UNCONFIRMED.value, literal_execute=True),
        s.next_resend_at <= now,
        s.escalated_at.is_(None),
    )


def claim_batch(
    conn: Connection,
    tables: OutboxTables,
    *,
    token: str,
    now: datetime,
    until: datetime,
    limit: int,
    strategy: ClaimStrategy | None = None,
) -> Sequence[RowMapping]:
    """Claim up to `limit` due stubs for `token` in the caller's transaction; return them."""
    stub = tables.stub
    strategy = strategy or strategy_for(conn)
    picked = (
        select(stub.c.id)
        .where(due_clause(tables, now))
        # oldest due first, in the order the (status, next_resend_at) index yields: a claim
        # reads its batch and stops (a tie-break on id made PostgreSQL sort every due row
        # on each pass, quadratic over a sweep); the claimed rows are returned by id
        .order_by(stub.c.next_resend_at)
        .limit(limit)
    )
    stamp = {"claimed_by": token, "next_resend_at": until}
    if strategy is not ClaimStrategy.ATOMIC_UPDATE and conn.dialect.update_returning:
        # PostgreSQL: pick, lock, stamp and read back in one statement (the queue idiom
        # `UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING`): one round
        # trip and one pass over the due rows instead of three
        locked = picked.with_for_update(skip_locked=strategy is ClaimStrategy.SKIP_LOCKED)
        claimed = (
            conn.execute(
                update(stub)
                .where(stub.c.id.in_(locked.scalar_subquery()))
                .values(**stamp)
                .returning(*stub.c)
            )
            .mappings()
            .all()
        )
        return sorted(claimed, key=lambda row: row["id"])
    if strategy is ClaimStrategy.ATOMIC_UPDATE:
        conn.execute(update(stub).where(stub.c.id.in_(picked.scalar_subquery())).values(**stamp))
    else:
        locked = picked.with_for_update(skip_locked=strategy is ClaimStrategy.SKIP_LOCKED)
        ids = list(conn.execute(locked).scalars())
        if not ids:
            return []
        conn.execute(update(stub).where(stub.c.id.in_(ids)).values(**stamp))
    return (
        conn.execute(select(stub).where(stub.c.claimed_by == token).order_by(stub.c.id))
        .mappings()
        .all()
    )
