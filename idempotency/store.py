"""The guard's database side: consumption log, DB lease, confirmation (the final arbiter).

- consumption log row (message, group): written on receipt; carries the DB lease
  (`lease_token`, `lease_until`) of the worker processing it; deleted on confirmation.
- confirmation row (message, group): unique; written in the handler's own transaction,
  only while the log row still carries the confirming worker's token (fencing), so a worker
  whose lease was taken over cannot confirm, and two workers can never both confirm.
- stub (when it lives in the same database): CONFIRMED in that same transaction once every
  expected group has a confirmation.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, and_, delete, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from outbox.models import OutboxTables, StubStatus
from outbox.stubs import split_groups
from reliable.message import ReceivedMessage


class ConfirmStatus(enum.Enum):
    CONFIRMED = "confirmed"  # this worker's confirmation row is written
    FENCED = "fenced"  # the lease was taken over: not confirmed, roll back


@dataclass(frozen=True)
class Known:
    """What the database already knows about (message, group)."""

    confirmed: bool
    confirmation_digest: str | None
    stub_digest: str | None


class GuardStore:
    def __init__(self, engine: Engine, tables: OutboxTables) -> None:
        self.engine = engine
        self.tables = tables

    def _pk(self, message_id: str, group: str):  # type: ignore[no-untyped-def]
        log = self.tables.consumption_log.c
        return and_(log.message_id == message_id, log.consumer_group == group)

    def log_received(self, message: ReceivedMessage, group: str, now: datetime) -> None:
        """Step 1: the consumption log row (kept if an earlier delivery wrote it)."""
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    insert(self.tables.consumption_log).values(
                        message_id=message.message_id,
                        consumer_group=group,
                        topic=message.topic,
                        queue_id=message.queue_id,
                        queue_offset=message.queue_offset,
                        created_at=now,
                    )
                )
        except IntegrityError:
            pass  # already received once: the row (and maybe a lease) stays

    def known(self, message_id: str, group: str) -> Known:
        conf, stub = self.tables.confirmation.c, self.tables.stub.c
        with self.engine.connect() as conn:
            row = conn.execute(
                select(conf.body_digest).where(
                    conf.message_id == message_id, conf.consumer_group == group
                )
            ).first()
            stub_digest = conn.execute(
                select(stub.body_digest).where(stub.message_id == message_id)
            ).scalar()
        return Known(row is not None, row[0] if row else None, stub_digest)

    def claim(
        self, message_id: str, group: str, token: str, now: datetime, until: datetime
    ) -> bool:
        """The DB lease: taken when free or expired. False: someone else holds it."""
        log = self.tables.consumption_log.c
        with self.engine.begin() as conn:
            result = conn.execute(
                update(self.tables.consumption_log)
                .where(
                    self._pk(message_id, group),
                    or_(log.lease_token.is_(None), log.lease_until <= now),
                )
                .values(lease_token=token, lease_until=until)
            )
            return bool(result.rowcount == 1)

    def renew(self, message_id: str, group: str, token: str, until: datetime) -> bool:
        """Extend the DB lease while `token` holds it. False: it was taken over."""
        log = self.tables.consumption_log.c
        with self.engine.begin() as conn:
            result = conn.execute(
                update(self.tables.consumption_log)
                .where(
                    self._pk(message_id, group),
                    log.lease_token == token,
                )
                .values(lease_until=until)
            )
            return bool(result.rowcount == 1)

    def release(self, message_id: str, group: str, token: str) -> None:
        log = self.tables.consumption_log.c
        with self.engine.begin() as conn:
            conn.execute(
                update(self.tables.consumption_log)
                .where(
                    self._pk(message_id, group),
                    log.lease_token == token,
                )
                .values(lease_token=None, lease_until=None)
            )

    def forget_log(self, message_id: str, group: str) -> None:
        """A duplicate of a confirmed message: its log row has no purpose."""
        with self.engine.begin() as conn:
            conn.execute(delete(self.tables.consumption_log).where(self._pk(message_id, group)))

    def confirm(
        self,
        bind: Session | Connection,
        message: ReceivedMessage,
        group: str,
        token: str,
        digest: str,
        outcome: str,
        now: datetime,
    ) -> ConfirmStatus:
        """Step 5's writes, in the caller's transaction. IntegrityError: already confirmed.

        Lock order (log row, then stub row, then the inserts) is the same for every group,
        so two groups confirming one message serialise on the stub row instead of
        deadlocking on each other's new confirmation rows.
        """
        log = self.tables.consumption_log.c
        stub = self.tables.stub
        holder = bind.execute(
            select(log.lease_token).where(self._pk(message.message_id, group)).with_for_update()
        ).first()
        if holder is None or holder[0] != token:
            return ConfirmStatus.FENCED
        settled = bind.execute(
            select(stub.c.expected_groups, stub.c.status)
            .where(stub.c.message_id == message.message_id)
            .with_for_update()
        ).first()
        bind.execute(
            insert(self.tables.confirmation).values(
                message_id=message.message_id,
                consumer_group=group,
                topic=message.topic,
                fencing_token=token,
                confirmed_at=now,
                body_digest=digest,
                outcome=outcome,
            )
        )
        bind.execute(
            delete(self.tables.consumption_log).where(
                self._pk(message.message_id, group), log.lease_token == token
            )
        )
        if settled is not None and settled.status == StubStatus.UNCONFIRMED.value:
            self._confirm_stub(bind, message.message_id, split_groups(settled.expected_groups), now)
        return ConfirmStatus.CONFIRMED

    def _confirm_stub(
        self, bind: Session | Connection, message_id: str, expected: list[str], now: datetime
    ) -> None:
        """Mark the stub CONFIRMED when every expected group has a confirmation."""
        stub, conf = self.tables.stub, self.tables.confirmation
        done = set(
            bind.execute(
                select(conf.c.consumer_group)
                .where(conf.c.message_id == message_id)
                .with_for_update()
            ).scalars()
        )
        if set(expected) <= done:
            bind.execute(
                update(stub)
                .where(
                    stub.c.message_id == message_id,
                    stub.c.status == StubStatus.UNCONFIRMED.value,
                )
                .values(status=StubStatus.CONFIRMED.value, updated_at=now)
            )

    def mark_dead_lettered(
        self,
        message_id: str,
        group: str,
        topic: str,
        queue_id: int,
        queue_offset: int,
        now: datetime,
    ) -> None:
        """Upsert the (message, group) log row with `dead_lettered_at` (the first stamp
        stays). The position of a new row is the stub's when it has one, else the given."""
        log, stub = self.tables.consumption_log, self.tables.stub
        pending = and_(self._pk(message_id, group), log.c.dead_lettered_at.is_(None))
        with self.engine.begin() as conn:
            conn.execute(update(log).where(pending).values(dead_lettered_at=now))
            if (
                conn.execute(select(log.c.message_id).where(self._pk(message_id, group))).first()
                is not None
            ):
                return
            sent = conn.execute(
                select(stub.c.topic, stub.c.queue_id, stub.c.queue_offset).where(
                    stub.c.message_id == message_id
                )
            ).first()
            if sent is not None and sent.queue_id is not None and sent.queue_offset is not None:
                topic, queue_id, queue_offset = sent.topic, sent.queue_id, sent.queue_offset
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    insert(log).values(
                        message_id=message_id,
                        consumer_group=group,
                        topic=topic,
                        queue_id=queue_id,
                        queue_offset=queue_offset,
                        created_at=now,
                        dead_lettered_at=now,
                    )
                )
        except IntegrityError:  # a delivery wrote the row meanwhile: stamp it
            with self.engine.begin() as conn:
                conn.execute(update(log).where(pending).values(dead_lettered_at=now))

    def purge(self, before: datetime) -> int:
        """Delete confirmation rows confirmed before `before`; returns how many."""
        conf = self.tables.confirmation
        with self.engine.begin() as conn:
            return int(conn.execute(delete(conf).where(conf.c.confirmed_at < before)).rowcount)
