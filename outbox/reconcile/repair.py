"""Repair: mark lost stubs due for immediate resend, close stale log rows; audited.

The candidates come from the classified DataFrame, streamed to the driver one partition at
a time (`toLocalIterator`), never collected whole. Writes go through SQLAlchemy in batches,
one transaction per batch; each batch re-checks the condition in the database before
changing a row, so a row that moved on since the read (resent, confirmed, reprocessed) is
left alone, and re-running a repair changes nothing twice:

    MARK_RESEND_DUE   stub UNCONFIRMED with next_resend_at NULL or later than now
                      -> next_resend_at = now, updated_at = now (one already due is
                      counted as such, not as skipped)
    CLOSE_STALE_LOG   log row whose group has a confirmation row, or whose stub is
                      CONFIRMED -> deleted (its content is kept in the audit row)

Every change writes one row to the audit table `<prefix>reconcile_audit` in the same
transaction. A rate limit (changes per second) paces the batches; time and sleep are
injected.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from outbox.reconcile.classes import LogClass, RepairAction, StubClass
from outbox.reconcile.errors import RepairFailed

if TYPE_CHECKING:
    import sqlalchemy as sa
    from pyspark.sql import DataFrame

    from outbox.models import OutboxTables


@dataclass(frozen=True)
class RepairOptions:
    """How a repair runs."""

    dry_run: bool = False
    batch_size: int = 500
    rate_limit: float | None = None  # changes per second; None = unpaced
    limit: int | None = None  # at most this many changes in one run
    window_only: bool = True  # repair only rows inside the certificate's window


@dataclass
class RepairReport:
    """What a repair did (or, dry, would do)."""

    run_id: str
    dry_run: bool
    marked_due: int = 0
    closed_stale: int = 0
    already_due: int = 0  # lost stubs whose resend was already due (nothing to change)
    skipped: int = 0  # candidates that moved on since the read (confirmed, voided, gone)
    batches: int = 0
    sample: list[dict[str, Any]] = field(default_factory=list)  # first changes, for people


def audit_table(metadata: sa.MetaData, prefix: str, schema: str | None = None) -> sa.Table:
    """The audit table: one row per change a repair made."""
    import sqlalchemy as sa

    name = f"{prefix}reconcile_audit"
    existing = metadata.tables.get(f"{schema}.{name}" if schema else name)
    if existing is not None:
        return existing
    return sa.Table(
        name,
        metadata,
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("message_id", sa.String(64), nullable=False),
        sa.Column("consumer_group", sa.String(128), nullable=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("before", sa.Text, nullable=True),  # JSON of the changed fields / row
        sa.Column("after", sa.Text, nullable=True),
        sa.Column("changed_at", sa.DateTime(timezone=False), nullable=False),
        sa.Index(f"{prefix}ix_audit_run", "run_id"),
        schema=schema,
    )


def candidates(messages: DataFrame, window_only: bool) -> DataFrame:
    """Rows to repair: (action, message_id, consumer_group, reason), lost stubs first."""
    from pyspark.sql import functions as F

    m = messages.where(F.col("in_window")) if window_only else messages
    # lost on the evidence (a stub unaccounted only because a repair marked it due is
    # awaiting its resend's confirmation: marking it again would change nothing)
    lost = m.where((F.col("stub_class") == StubClass.LOST.value) & F.col("resend_due")).select(
        F.lit(RepairAction.MARK_RESEND_DUE.value).alias("action"),
        "message_id",
        F.lit(None).cast("string").alias("consumer_group"),
        "reason",
    )
    stale = messages.where(F.col("has_stub") & (F.size("logs") > 0)).select(
        "message_id",
        "status_confirmed",
        "confirmed_groups",
        "in_window",
        F.explode("logs").alias("l"),
    )
    if window_only:
        stale = stale.where(F.col("in_window"))
    stale = stale.where(
        F.col("status_confirmed") | F.array_contains("confirmed_groups", F.col("l.consumer_group"))
    ).select(
        F.lit(RepairAction.CLOSE_STALE_LOG.value).alias("action"),
        "message_id",
        F.col("l.consumer_group").alias("consumer_group"),
        F.lit(f"{LogClass.STALE.value}: group confirmed; log row left behind").alias("reason"),
    )
    return lost.unionByName(stale)


class Repairer:
    """Applies repair actions in audited, re-checked batches."""

    def __init__(
        self,
        engine: sa.Engine,
        tables: OutboxTables,
        run_id: str,
        options: RepairOptions,
        now: Callable[[], datetime],
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.tables = tables
        self.audit = audit_table(tables.metadata, tables.prefix, tables.schema)
        self.run_id = run_id
        self.options = options
        self.now = now
        self.sleep = sleep
        self.monotonic = monotonic
        self.report = RepairReport(run_id=run_id, dry_run=options.dry_run)

    def run(self, rows: Iterable[tuple[str, str, str | None, str]]) -> RepairReport:
        if not self.options.dry_run:
            self.audit.create(self.engine, checkfirst=True)
        started = self.monotonic()
        done = 0
        size = self.options.batch_size
        if self.options.rate_limit:  # about one batch a second, never one large burst
            size = max(1, min(size, int(self.options.rate_limit)))
        for batch in _batches(rows, size, self.options.limit):
            try:
                changed = self._apply(batch)
            except Exception as exc:
                raise RepairFailed(done, f"{type(exc).__name__}: {exc}") from exc
            done += changed
            self.report.batches += 1
            if self.options.rate_limit and changed:
                # pace: `done` changes may take no less than done / rate seconds
                ahead = done / self.options.rate_limit - (self.monotonic() - started)
                if ahead > 0:
                    self.sleep(ahead)
        return self.report

    def _apply(self, batch: list[tuple[str, str, str | None, str]]) -> int:
        import sqlalchemy as sa

        now = self.now()
        stub, log, conf = self.tables.stub, self.tables.consumption_log, self.tables.confirmation
        lost = {
            mid: reason
            for action, mid, _g, reason in batch
            if action == RepairAction.MARK_RESEND_DUE.value
        }
        stale = [
            (mid, grp, reason)
            for action, mid, grp, reason in batch
            if action == RepairAction.CLOSE_STALE_LOG.value
        ]
        audit: list[dict[str, Any]] = []
        with self.engine.begin() as conn:
            if lost:
                open_cond = sa.and_(
                    stub.c.message_id.in_(list(lost)), stub.c.status == "UNCONFIRMED"
                )
                due_cond = sa.and_(
                    open_cond, sa.or_(stub.c.next_resend_at.is_(None), stub.c.next_resend_at > now)
                )
                still_open = conn.execute(
                    sa.select(stub.c.message_id, stub.c.next_resend_at).where(open_cond)
                ).all()
                rows = [r for r in still_open if r.next_resend_at is None or r.next_resend_at > now]
                ids = [r.message_id for r in rows]
                if ids and not self.options.dry_run:
                    conn.execute(
                        sa.update(stub)
                        .where(due_cond)
                        .where(stub.c.message_id.in_(ids))
                        .values(next_resend_at=now, updated_at=now)
                    )
                for r in rows:
                    audit.append(
                        self._audit(
                            RepairAction.MARK_RESEND_DUE,
                            r.message_id,
                            None,
                            lost[r.message_id],
                            {"next_resend_at": _iso(r.next_resend_at)},
                            {"next_resend_at": _iso(now)},
                            now,
                        )
                    )
                self.report.marked_due += len(rows)
                self.report.already_due += len(still_open) - len(rows)
                self.report.skipped += len(lost) - len(still_open)
            for mid, grp, reason in stale:
                confirmed = sa.or_(
                    sa.exists().where(
                        conf.c.message_id == log.c.message_id,
                        conf.c.consumer_group == log.c.consumer_group,
                    ),
                    sa.exists().where(
                        stub.c.message_id == log.c.message_id, stub.c.status == "CONFIRMED"
                    ),
                )
                cond = sa.and_(log.c.message_id == mid, log.c.consumer_group == grp, confirmed)
                row = conn.execute(sa.select(log).where(cond)).mappings().first()
                if row is None:
                    self.report.skipped += 1
                    continue
                if not self.options.dry_run:
                    conn.execute(sa.delete(log).where(cond))
                audit.append(
                    self._audit(
                        RepairAction.CLOSE_STALE_LOG,
                        mid,
                        grp,
                        reason,
                        {k: _iso(v) for k, v in row.items()},
                        None,
                        now,
                    )
                )
                self.report.closed_stale += 1
            if audit and not self.options.dry_run:
                conn.execute(sa.insert(self.audit), audit)
        room = 20 - len(self.report.sample)
        if room > 0:
            self.report.sample.extend(
                {k: v for k, v in a.items() if k not in ("run_id", "changed_at")}
                for a in audit[:room]
            )
        return len(audit)

    def _audit(
        self,
        action: RepairAction,
        mid: str,
        grp: str | None,
        reason: str,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        now: datetime,
    ) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "action": action.value,
            "message_id": mid,
            "consumer_group": grp,
            "reason": reason or action.value,
            "before": json.dumps(before, sort_keys=True) if before else None,
            "after": json.dumps(after, sort_keys=True) if after else None,
            "changed_at": now,
        }


def _iso(value: object) -> object:
    return value.isoformat(sep=" ") if isinstance(value, datetime) else value


def _batches(
    rows: Iterable[tuple[str, str, str | None, str]], size: int, limit: int | None
) -> Iterator[list[tuple[str, str, str | None, str]]]:
    batch: list[tuple[str, str, str | None, str]] = []
    for taken, row in enumerate(rows):
        if limit is not None and taken >= limit:
            break
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch
