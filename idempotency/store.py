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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    bindparam,
    delete,
    insert,
    literal,
    null,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import BindParameter

from idempotency import pg
from outbox.autocommit import autocommit
from outbox.models import OutboxTables, StubStatus
from outbox.prepared import Prepared
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


_UNKNOWN = Known(confirmed=False, confirmation_digest=None, stub_digest=None)


def _log_row(
    message: ReceivedMessage, group: str, now: datetime, token: str | None, until: datetime
) -> dict[str, Any]:
    """A consumption-log row of a first delivery, carrying `token`'s lease (none: None)."""
    return {
        "message_id": message.message_id,
        "consumer_group": group,
        "topic": message.topic,
        "queue_id": message.queue_id,
        "queue_offset": message.queue_offset,
        "created_at": now,
        "lease_token": token,
        "lease_until": until if token is not None else None,
    }


def _by_source(
    rows: Iterable[Any],
) -> tuple[dict[str, str | None], dict[str, str | None], set[str]]:
    """A batch receipt's rows (src, message id, digest): the confirmations' digests
    (src 1), the stubs' (2), and the ids of the log rows (3: inserted, or found)."""
    confirmed: dict[str, str | None] = {}
    stubs: dict[str, str | None] = {}
    logged: set[str] = set()
    for src, mid, digest in rows:
        if src == 1:
            confirmed[mid] = digest
        elif src == 2:
            stubs[mid] = digest
        elif src == 3:
            logged.add(mid)
    return confirmed, stubs, logged


class GuardStore:
    def __init__(self, engine: Engine, tables: OutboxTables) -> None:
        self.engine = engine
        self.tables = tables
        # the per-message statements, built once: bound parameters, compiled once per
        # connection's dialect (SQLAlchemy's statement cache), no expression building per
        # message
        log, conf, stub = tables.consumption_log, tables.confirmation, tables.stub
        mid: BindParameter[str] = bindparam("mid")
        grp: BindParameter[str] = bindparam("grp")
        tok: BindParameter[str] = bindparam("tok")
        on_log = and_(log.c.message_id == mid, log.c.consumer_group == grp)
        self._known_sql = union_all(
            select(literal(1).label("src"), conf.c.body_digest).where(
                conf.c.message_id == mid, conf.c.consumer_group == grp
            ),
            select(literal(2).label("src"), stub.c.body_digest).where(stub.c.message_id == mid),
        )
        self._insert_log_sql = insert(log)
        self._insert_log_unless_sql: dict[str, Any] = {
            "postgresql": pg_insert(log).on_conflict_do_nothing(),
            "sqlite": sqlite_insert(log).on_conflict_do_nothing(),
        }
        self._claim_sql = (
            update(log)
            .where(
                on_log,
                or_(
                    log.c.lease_token.is_(None),
                    log.c.lease_until <= bindparam("now"),
                    log.c.lease_token == tok,  # the same attempt again: re-entrant
                ),
            )
            .values(lease_token=tok, lease_until=bindparam("until"))
        )
        self._fence_sql = delete(log).where(on_log, log.c.lease_token == tok)
        self._unclaim_sql = (
            update(log)
            .where(on_log, log.c.lease_token == tok)
            .values(lease_token=None, lease_until=None)
        )
        # planned once per connection (`Prepared`): their planning cost more than their
        # work. Not the batch receipt: its generic plan (an array of unknown length) ran
        # ten times slower than planning it for each batch's values
        self._receive_pg_sql = Prepared(pg.receive_one(tables, self._known_sql))
        self._receive_many_pg_sql = pg.receive_many(tables)
        # elsewhere: what the database knows of a batch and which of its log rows exist,
        # in one read (src 1 the confirmation's digest, 2 the stub's, 3 a log row)
        mids: BindParameter[Any] = bindparam("mids", expanding=True)
        self._known_many_sql = union_all(
            select(literal(1).label("src"), conf.c.message_id, conf.c.body_digest).where(
                conf.c.consumer_group == grp, conf.c.message_id.in_(mids)
            ),
            select(literal(2), stub.c.message_id, stub.c.body_digest).where(
                stub.c.message_id.in_(mids)
            ),
            select(literal(3), log.c.message_id, null()).where(
                log.c.consumer_group == grp, log.c.message_id.in_(mids)
            ),
        )
        self._stub_lock_sql = (
            select(stub.c.expected_groups, stub.c.status)
            .where(stub.c.message_id == mid)
            .with_for_update()
        )
        self._insert_conf_sql = insert(conf)
        self._confirm_pg_sql = Prepared(pg.confirm(tables))
        self._confirm_stub_sql = (
            update(stub)
            .where(stub.c.message_id == mid, stub.c.status == StubStatus.UNCONFIRMED.value)
            .values(status=StubStatus.CONFIRMED.value, updated_at=bindparam("now"))
        )
        # elsewhere than PostgreSQL: the stub CONFIRMED when it expects this group alone,
        # locking it (one statement where a SELECT ... FOR UPDATE and an UPDATE were two);
        # no row: no stub, settled already, or other groups expected (then looked at)
        self._settle_alone_sql = self._confirm_stub_sql.where(pg.expects_only(tables, grp))

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
        with self.engine.connect() as conn:
            return self._known(conn, message_id, group)

    def _known(self, conn: Connection, message_id: str, group: str) -> Known:
        """The confirmation's and the stub's digests, one round trip."""
        confirmed, conf_digest, stub_digest = False, None, None
        for src, digest in conn.execute(self._known_sql, {"mid": message_id, "grp": group}):
            if src == 1:
                confirmed, conf_digest = True, digest
            else:
                stub_digest = digest
        return Known(confirmed, conf_digest, stub_digest)

    def receive(
        self,
        message: ReceivedMessage,
        group: str,
        token: str,
        now: datetime,
        until: datetime,
        *,
        log_receipt: bool,
        may_claim: Callable[[Known], bool],
    ) -> tuple[Known, bool]:
        """Steps 1 and 3 in one short transaction (on PostgreSQL, statements that each
        commit alone; one connection checkout):
        what the database knows, the consumption-log row (when `log_receipt`; kept if an
        earlier delivery wrote it) and, when `may_claim(known)`, the DB lease.

        Returns (known, claimed). Same outcome as `log_received`, `known` and `claim` one
        after the other, which it replaces on the hot path."""
        if log_receipt and self.engine.dialect.name == "postgresql":
            # each of its statements is correct alone: one round trip each, no BEGIN/COMMIT
            with autocommit(self.engine) as conn:
                return self._receive_pg(conn, message, group, token, now, until, may_claim)
        with self.engine.begin() as conn:
            known = self._known(conn, message.message_id, group)
            claim = may_claim(known)
            claimed = False
            if log_receipt:  # a new row is free: it is born with this worker's lease
                row = _log_row(message, group, now, token if claim else None, until)
                claimed = self._insert_log(conn, row) and claim
            if claim and not claimed:
                result = conn.execute(
                    self._claim_sql,
                    {
                        "mid": message.message_id,
                        "grp": group,
                        "tok": token,
                        "now": now,
                        "until": until,
                    },
                )
                claimed = result.rowcount == 1
        return known, claimed

    def _receive_pg(
        self,
        conn: Connection,
        message: ReceivedMessage,
        group: str,
        token: str,
        now: datetime,
        until: datetime,
        may_claim: Callable[[Known], bool],
    ) -> tuple[Known, bool]:
        """`receive` on PostgreSQL, first delivery: the log row is inserted, born with the
        lease when a message nobody knows could be claimed (`may_claim` of an unknown one),
        in the statement that reads what the database knows; then, only where that
        reading forbids the lease, it is taken back, or, for an existing row, claimed as
        elsewhere. Each statement commits alone (`autocommit`): the common case is one
        round trip instead of three (BEGIN, the statement, COMMIT). A lease taken back by
        the second statement was held for that instant only: another delivery that saw it
        is told "held elsewhere" and retried, as it would have waited for a commit."""
        hopeful = may_claim(_UNKNOWN)
        mid = message.message_id
        confirmed, conf_digest, stub_digest, inserted = False, None, None, False
        for src, digest in self._receive_pg_sql.execute(
            conn,
            {
                "mid": mid,
                "grp": group,
                "topic": message.topic,
                "qid": message.queue_id,
                "qoff": message.queue_offset,
                "now": now,
                "ltok": token if hopeful else None,
                "luntil": until if hopeful else None,
            },
        ):
            if src == 1:
                confirmed, conf_digest = True, digest
            elif src == 2:
                stub_digest = digest
            elif src == 3:
                inserted = True
        known = Known(confirmed, conf_digest, stub_digest)
        claimed = self._settle_receipt(
            conn, mid, group, token, now, until, known, inserted, hopeful, may_claim
        )
        return known, claimed

    def receive_many(
        self,
        messages: Sequence[ReceivedMessage],
        group: str,
        tokens: Sequence[str],
        now: datetime,
        until: datetime,
        may_claim: Sequence[Callable[[Known], bool]],
    ) -> list[tuple[Known, bool]]:
        """`receive` (first delivery) of a received batch. On PostgreSQL one statement for
        all of it: every log row, born with its lease where `may_claim` of an unknown message
        allows it, and what the database knows of each; then, per message and only where
        that reading forbids the lease or the row existed, what `receive` does next.
        Elsewhere one transaction: one read of what is known and which log rows exist,
        one INSERT of the missing rows (each born with its lease where `may_claim`
        allows), a claim of each existing row that may be claimed. The messages' ids are
        distinct. Returns (known, claimed) of each, in order. A log row another worker
        inserted meanwhile fails the batch (IntegrityError): its caller takes each
        message on its own."""
        if self.engine.dialect.name != "postgresql":
            return self._receive_many_elsewhere(messages, group, tokens, now, until, may_claim)
        hopeful = [claim(_UNKNOWN) for claim in may_claim]
        mids = [m.message_id for m in messages]
        params = {
            "mids": mids,
            "grp": group,
            "topics": [m.topic for m in messages],
            "qids": [m.queue_id for m in messages],
            "qoffs": [m.queue_offset for m in messages],
            "ltoks": [tok if hope else None for tok, hope in zip(tokens, hopeful, strict=True)],
            "now": now,
            "luntil": until,
        }
        with autocommit(self.engine) as conn:
            confirmed, stub_digests, inserted = _by_source(
                conn.execute(self._receive_many_pg_sql, params)
            )
            out: list[tuple[Known, bool]] = []
            for i, mid in enumerate(mids):
                known = Known(mid in confirmed, confirmed.get(mid), stub_digests.get(mid))
                claimed = self._settle_receipt(
                    conn,
                    mid,
                    group,
                    tokens[i],
                    now,
                    until,
                    known,
                    mid in inserted,
                    hopeful[i],
                    may_claim[i],
                )
                out.append((known, claimed))
        return out

    def _receive_many_elsewhere(
        self,
        messages: Sequence[ReceivedMessage],
        group: str,
        tokens: Sequence[str],
        now: datetime,
        until: datetime,
        may_claim: Sequence[Callable[[Known], bool]],
    ) -> list[tuple[Known, bool]]:
        """`receive_many` on MySQL, MariaDB and SQLite (see there)."""
        mids = [m.message_id for m in messages]
        with self.engine.begin() as conn:
            confirmed, stub_digests, logged = _by_source(
                conn.execute(self._known_many_sql, {"mids": mids, "grp": group})
            )
            out: list[tuple[Known, bool]] = []
            born: list[dict[str, Any]] = []
            for message, token, claim in zip(messages, tokens, may_claim, strict=True):
                mid = message.message_id
                known = Known(mid in confirmed, confirmed.get(mid), stub_digests.get(mid))
                may = claim(known)
                if mid in logged:
                    claimed = may and bool(
                        conn.execute(
                            self._claim_sql,
                            {"mid": mid, "grp": group, "tok": token, "now": now, "until": until},
                        ).rowcount
                        == 1
                    )
                else:  # a new row is free: born with this worker's lease when it may take it
                    born.append(_log_row(message, group, now, token if may else None, until))
                    claimed = may
                out.append((known, claimed))
            if born:  # one statement (PyMySQL writes an executemany INSERT as one)
                conn.execute(self._insert_log_sql, born)
        return out

    def _settle_receipt(
        self,
        conn: Connection,
        mid: str,
        group: str,
        token: str,
        now: datetime,
        until: datetime,
        known: Known,
        inserted: bool,
        hopeful: bool,
        may_claim: Callable[[Known], bool],
    ) -> bool:
        """After a receipt on PostgreSQL: a lease the row was born with taken back when
        what the database knows forbids it, or an existing row's lease claimed. Claimed?"""
        claim = may_claim(known)
        keys = {"mid": mid, "grp": group, "tok": token}
        if inserted and hopeful and not claim:
            conn.execute(self._unclaim_sql, keys)  # known after all: no lease
        if not claim:
            return False
        if inserted:
            return hopeful
        result = conn.execute(self._claim_sql, {**keys, "now": now, "until": until})
        return bool(result.rowcount == 1)

    def _insert_log(self, conn: Connection, row: dict[str, Any]) -> bool:
        """Insert the log row unless one exists; True when this call inserted it.

        PostgreSQL and SQLite: `ON CONFLICT DO NOTHING`, one statement. MySQL and MariaDB
        (InnoDB): a plain insert, whose duplicate-key error rolls back that statement
        alone and leaves the transaction open (`INSERT IGNORE` would also turn other
        errors into warnings). Elsewhere a savepoint around the insert."""
        unless = self._insert_log_unless_sql.get(conn.dialect.name)
        if unless is not None:
            return bool(conn.execute(unless, row).rowcount == 1)
        if conn.dialect.name in ("mysql", "mariadb"):
            try:
                conn.execute(self._insert_log_sql, row)
            except IntegrityError:
                return False
            return True
        try:
            with conn.begin_nested():
                conn.execute(self._insert_log_sql, row)
        except IntegrityError:
            return False
        return True

    def claim(
        self, message_id: str, group: str, token: str, now: datetime, until: datetime
    ) -> bool:
        """The DB lease: taken when free or expired. False: someone else holds it."""
        log = self.tables.consumption_log.c
        with autocommit(self.engine) as conn:
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
        with autocommit(self.engine) as conn:
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
        with autocommit(self.engine) as conn:
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
        with autocommit(self.engine) as conn:
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
        conn = bind.connection() if isinstance(bind, Session) else bind
        mid = message.message_id
        # the fencing check and the log row's deletion in one statement: it locks the row
        # and deletes it only while it still carries this worker's token
        if conn.dialect.name == "postgresql":  # one round trip; the stub CONFIRMED if
            # this group completes it
            done = self._confirm_pg_sql.execute(
                conn,
                {
                    "mid": mid,
                    "grp": group,
                    "tok": token,
                    "conf_topic": message.topic,
                    "now": now,
                    "digest": digest,
                    "conf_outcome": outcome,
                },
            ).first()
            if done is None:
                return ConfirmStatus.FENCED
            settled = done if done.status is not None else None
        else:
            if (
                conn.execute(self._fence_sql, {"mid": mid, "grp": group, "tok": token}).rowcount
                != 1
            ):
                return ConfirmStatus.FENCED
            alone = {"mid": mid, "grp": group, "now": now}
            if conn.execute(self._settle_alone_sql, alone).rowcount == 1:
                settled = None  # CONFIRMED now: nothing left to look at
            else:
                settled = conn.execute(self._stub_lock_sql, {"mid": mid}).first()
            conn.execute(
                self._insert_conf_sql,
                {
                    "message_id": mid,
                    "consumer_group": group,
                    "topic": message.topic,
                    "fencing_token": token,
                    "confirmed_at": now,
                    "body_digest": digest,
                    "outcome": outcome,
                },
            )
        # still UNCONFIRMED (elsewhere than PostgreSQL, or other groups expected): look
        if settled is not None and settled.status == StubStatus.UNCONFIRMED.value:
            expected = split_groups(settled.expected_groups)
            if set(expected) <= {group}:  # this confirmation completes it: no need to look
                conn.execute(self._confirm_stub_sql, {"mid": mid, "now": now})
            else:
                self._confirm_stub(conn, mid, expected, now)
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
