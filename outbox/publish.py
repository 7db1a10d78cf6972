"""Publishing through the outbox: the stub commits with the business rows; the send follows.

Two entry points, both impossible to send for uncommitted data:

- `Outbox.publish(session, message)`: for an ORM `Session`. The stub is inserted in the
  session's transaction at once; the message is sent from the session's `after_commit`
  event, so it goes out only if that very transaction commits. A rollback (of the whole
  transaction, or of the savepoint the stub was published in) drops it. A session joined
  to a transaction it does not own (`Session(bind=connection)` inside
  `connection.begin()`) commits nothing itself: then nothing is sent at its "commit", and
  the resend worker sends the stub once the enclosing transaction committed it.
- `Outbox.begin(engine_or_connection)`: for Core. A context manager that owns the
  transaction: `with outbox.begin(conn) as tx: conn.execute(...); tx.publish(message)`.
  It commits at the end of the block and sends only after that commit succeeded.

Why events rather than asking users to call `send()` after `commit()`: a forgotten call, or
one placed before the commit, would lose or invent messages. Here the send is tied to the
commit by SQLAlchemy itself. If the process dies between commit and send, or the send
fails, the stub is already committed and the resend worker sends it when it is due.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, event, func, insert, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, SessionTransaction

from outbox.autocommit import autocommit
from outbox.background import BackgroundSends
from outbox.errors import DuplicateMessageId, NoActiveTransaction, OutboxMisuse, is_permanent
from outbox.models import OutboxTables
from outbox.ports import Clock, Sender, utcnow
from outbox.prepared import Prepared
from outbox.registry import expected_groups, expected_groups_sql
from outbox.stubs import ArrayUpdates, check_sendable, stub_values
from protocol.limits import DEFAULT_MAX_BODY_SIZE
from reliable.message import Message, SendReceipt, SendStatus

log = logging.getLogger(__name__)

_PENDING = "reliable.outbox.pending"  # session.info key: messages waiting for the commit
_UNSET: Any = object()


@dataclass(frozen=True)
class OutboxConfig:
    """Publishing policy.

    max_sends: total send attempts (the first one included) before escalation.
    resend_after: after a successful send, when the resend worker first looks at the stub;
        it must cover normal consumer lag (the worker also checks committed offsets).
    retry_after_failure: after a failed first send (or none at all), when it becomes due.
    send_after_commit: send right after the commit (default). False: never send from the
        committing thread; stubs are due at once and the resend worker sends them (a pure
        polling outbox: commits never wait for the broker).
    max_body_size: the broker's body limit in bytes: `publish` refuses a bigger body before
        anything is written (`InvalidStub`), since no send could ever succeed. None: the
        sender's own `max_body_size` when it has one, else 4 MiB (the broker's default).
        0 turns the check off.
    send_in_background: hand the send that follows each commit to one thread per
        `Outbox` (`outbox.background`): `commit()` returns after the commit alone, and the
        thread sends waiting messages together and records their receipts in one
        transaction. `Outbox.flush()` waits for it. Off (default): `commit()` returns
        after the send and its record.
    background_capacity: messages that may wait for the background thread; more are left
        to the resend worker (due `retry_after_failure` after their commit), never blocking
        a commit.
    background_batch: messages the background thread sends and records together at most.
    background_linger: how long a batch shorter than `background_batch` waits for more
        commits before the thread sends it (as Kafka's `linger.ms`): one record of many
        receipts instead of one transaction for each, at the price of at most this much
        more commit-to-broker latency. `Outbox.flush()` and `close()` do not wait for it.
    """

    max_sends: int = 16
    resend_after: timedelta = timedelta(minutes=5)
    retry_after_failure: timedelta = timedelta(seconds=10)
    send_after_commit: bool = True
    max_body_size: int | None = None
    send_in_background: bool = False
    background_capacity: int = 10_000
    background_batch: int = 128
    background_linger: timedelta = timedelta(milliseconds=5)


@dataclass
class _Pending:
    outbox: Outbox
    message: Message
    connection: Connection
    transaction: SessionTransaction | None


class Outbox:
    """Transactional publish over one set of outbox tables and one `Sender`."""

    def __init__(
        self,
        tables: OutboxTables,
        sender: Sender,
        *,
        config: OutboxConfig | None = None,
        clock: Clock = utcnow,
    ) -> None:
        self.tables = tables
        self.sender = sender
        self.config = config or OutboxConfig()
        self.clock = clock
        # the per-publish statements, built once (bound parameters, compiled once). The
        # stub's INSERT is `inline()`: no RETURNING of the new row's id, which nothing
        # reads, and whose result row SQLAlchemy set up on every publish (a fifth of a
        # publishing thread's CPU under the profiler)
        self._plain_insert = insert(tables.stub).inline()
        self._insert_with_groups: dict[str, Any] = {}
        stub = tables.stub
        record = (
            update(stub)
            .where(stub.c.message_id == bindparam("b_mid"))
            .values(send_count=stub.c.send_count + 1)
        )
        failed = ("last_error", "next_resend_at", "updated_at")
        sent = ("queue_id", "queue_offset", "broker_msg_id", *failed)
        self._record_sent = record.values({k: bindparam(k) for k in sent})
        self._record_failed = record.values({k: bindparam(k) for k in failed})
        # PostgreSQL: the record's commit does not wait for the WAL flush, asked for inside
        # the UPDATE itself (set_config(..., is_local) lasts until the commit, here the
        # statement's own): no SET LOCAL round trip
        self._unflushed = func.set_config("synchronous_commit", "off", True).is_not(None)
        # planned once per connection (`Prepared`): the plan cost PostgreSQL about as
        # much as the UPDATE
        self._record_sent_pg = Prepared(self._record_sent.where(self._unflushed))
        self._record_failed_pg = Prepared(self._record_failed.where(self._unflushed))
        self._record_many = ArrayUpdates(
            stub, "message_id", also={"send_count": stub.c.send_count + 1}, where=self._unflushed
        )
        self._background: BackgroundSends | None = None
        self._starting = threading.Lock()

    # -- ORM Session ---------------------------------------------------------------------
    def publish(self, session: Session, message: Message, *, max_sends: int | None = None) -> str:
        """Add the stub to the session's transaction; send after it commits. Returns the id."""
        conn = session.connection()  # begins the transaction if none is active
        self._insert(conn, message, max_sends)
        _listen(session)
        tx = session.get_nested_transaction() or session.get_transaction()
        session.info.setdefault(_PENDING, []).append(_Pending(self, message, conn, tx))
        return message.message_id

    # -- Core Connection -----------------------------------------------------------------
    @contextmanager
    def begin(self, bind: Engine | Connection) -> Iterator[OutboxTransaction]:
        """Own a transaction on `bind`; commit at the end of the block, then send."""
        if isinstance(bind, Engine):
            with bind.connect() as conn, self.begin(conn) as tx:
                yield tx
            return
        if bind.in_transaction():
            raise OutboxMisuse(
                "the connection is already in a transaction; pass a connection "
                "outside one (or an Engine) so the outbox can own the commit"
            )
        trans = bind.begin()
        tx = OutboxTransaction(self, bind)
        try:
            yield tx
        except BaseException:
            if trans.is_active:
                trans.rollback()
            raise
        finally:
            tx._open = False
        if not trans.is_active:
            raise OutboxMisuse(
                "the transaction was ended inside the `begin` block; nothing "
                "was sent (committed stubs are sent by the resend worker)"
            )
        trans.commit()
        if self.config.send_after_commit and tx._messages:
            self._after_commit(bind.engine, tx._messages)

    # -- shared --------------------------------------------------------------------------
    @property
    def max_body_size(self) -> int | None:
        """The body limit `publish` enforces (None: no check)."""
        limit = self.config.max_body_size
        if limit is None:
            limit = getattr(self.sender, "max_body_size", None)
            if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
                limit = DEFAULT_MAX_BODY_SIZE
        return limit or None

    def _insert(self, conn: Connection, message: Message, max_sends: int | None) -> None:
        """The stub's INSERT in `conn`'s transaction. Where the database can aggregate the
        topic's groups in order (PostgreSQL), they are read inside the INSERT: one
        statement, no SELECT of the registry before it."""
        with_groups = self._insert_with_groups.get(conn.dialect.name, _UNSET)
        if with_groups is _UNSET:
            groups = expected_groups_sql(self.tables, conn.dialect.name)
            # planned once per connection (`Prepared`): the plan cost PostgreSQL about
            # as much as the INSERT itself
            with_groups = (
                None
                if groups is None
                else Prepared(insert(self.tables.stub).values(expected_groups=groups).inline())
            )
            self._insert_with_groups[conn.dialect.name] = with_groups
        try:
            if with_groups is None:
                conn.execute(self._plain_insert, self._row(conn, message, max_sends))
            else:
                row = self._row(None, message, max_sends)
                del row["expected_groups"]
                row["eg_topic"] = message.topic
                with_groups.execute(conn, row)
        except IntegrityError as exc:
            raise DuplicateMessageId(message.message_id) from exc

    def _row(
        self, conn: Connection | None, message: Message, max_sends: int | None
    ) -> dict[str, Any]:
        # what can never be sent is refused before the stub joins the transaction
        check_sendable(message, self.max_body_size)  # before any query
        now = self.clock()
        return stub_values(
            message,
            expected_groups=()
            if conn is None
            else expected_groups(conn, self.tables, message.topic),
            max_sends=self.config.max_sends if max_sends is None else max_sends,
            now=now,
            next_resend_at=now
            + (self.config.retry_after_failure if self.config.send_after_commit else timedelta(0)),
            max_body_size=self.max_body_size,
        )

    def flush(self, timeout: float | None = None) -> bool:
        """With `send_in_background`: wait until every message committed so far is sent
        and its receipt recorded (True), or `timeout` seconds passed (False). Without it
        there is never anything to wait for."""
        return True if self._background is None else self._background.flush(timeout)

    @property
    def left_to_resend_worker(self) -> int:
        """With `send_in_background`: messages its thread did not take since it started
        (the queue full, or closed); the resend worker sends them when due."""
        return 0 if self._background is None else self._background.refused

    def close(self, timeout: float | None = None) -> bool:
        """Flush, then stop the background thread (it starts again at the next commit)."""
        background, self._background = self._background, None
        return True if background is None else background.close(timeout)

    def _after_commit(self, engine: Engine, messages: list[Message]) -> None:
        """The send that follows a commit: now, or handed to the background thread."""
        if not self.config.send_in_background:
            for message in messages:
                self._send_many(engine, [message])
            return
        with self._starting:
            if self._background is None:
                self._background = BackgroundSends(
                    self._send_many,
                    capacity=self.config.background_capacity,
                    batch_size=self.config.background_batch,
                    name=self.tables.stub.name,
                    linger_s=self.config.background_linger.total_seconds(),
                )
            background = self._background
        background.submit(engine, messages)

    def _send_many(self, engine: Engine, messages: list[Message]) -> None:
        """Send committed messages (pipelined when the sender has `send_async` and there
        are several) and write every result on its stub in one transaction. Never raises:
        the commit happened, and a failure leaves the stub to the resend worker."""
        send_async = getattr(self.sender, "send_async", None)
        if len(messages) > 1 and callable(send_async):
            started = [_attempt(send_async, m) for m in messages]  # all in flight first
            results = [(None, error) if error else _attempt(f.result) for f, error in started]
        else:
            results = [_attempt(self.sender.send, m) for m in messages]
        outcomes = [self._outcome(m, r, e) for m, (r, e) in zip(messages, results, strict=True)]
        self._record(engine, outcomes)

    def _outcome(
        self, message: Message, receipt: SendReceipt | None, exc: Exception | None
    ) -> dict[str, Any]:
        """The values a send's result writes on its stub."""
        now = self.clock()
        values: dict[str, Any]
        if receipt is None:
            assert exc is not None
            if is_permanent(exc):
                # no retry can succeed: due now, so the resend worker escalates it at once
                log.error(
                    "outbox: send of %s refused after commit (%s); the resend worker "
                    "will escalate it",
                    message.message_id,
                    exc,
                )
                retry_at = now
            else:
                log.warning(
                    "outbox: send of %s failed after commit (%s); the resend worker will retry it",
                    message.message_id,
                    exc,
                )
                retry_at = now + self.config.retry_after_failure
            values = {
                "last_error": f"{type(exc).__name__}: {exc}"[:2000],
                "next_resend_at": retry_at,
            }
        else:
            values = {
                "queue_id": receipt.queue_id,
                "queue_offset": receipt.queue_offset,
                "broker_msg_id": receipt.offset_msg_id,
                "last_error": None
                if receipt.status is SendStatus.SEND_OK
                else receipt.status.value,
                "next_resend_at": now + self.config.resend_after,
            }
        values["updated_at"] = now
        values["b_mid"] = message.message_id
        return values

    def _record(self, engine: Engine, outcomes: list[dict[str, Any]]) -> None:
        """Write send results on their stubs, in one transaction (on PostgreSQL one
        statement per kind of result)."""
        try:
            # Each UPDATE is correct alone, so each commits alone (`autocommit`: on
            # PostgreSQL one round trip, no BEGIN/COMMIT). The record is a hint for the
            # resend worker, never the guarantee (the stub committed with the business rows
            # is): on PostgreSQL its commit does not wait for the WAL flush. Lost in a
            # server crash, it reads as a send never recorded: the stub is due after
            # retry_after_failure and resent, the consumer's guard absorbing the copy.
            with autocommit(engine) as conn:
                pg = conn.dialect.name == "postgresql"
                # a receipt's values carry its queue position (`_outcome`), a failure's not
                sent = [v for v in outcomes if "queue_id" in v]
                failed = [v for v in outcomes if "queue_id" not in v]
                if pg and len(outcomes) > 1:
                    for batch in (sent, failed):
                        if batch:
                            self._record_many_pg(conn, batch)
                    return
                if pg:  # one outcome
                    (self._record_sent_pg if sent else self._record_failed_pg).execute(
                        conn, outcomes[0]
                    )
                    return
                if sent:
                    conn.execute(self._record_sent, sent)
                if failed:
                    conn.execute(self._record_failed, failed)
        except SQLAlchemyError as exc:
            log.warning(
                "outbox: could not record the send of %s (%s); the resend worker "
                "will look at it when due",
                ", ".join(v["b_mid"] for v in outcomes[:5]) + (" ..." if len(outcomes) > 5 else ""),
                exc,
            )

    def _record_many_pg(self, conn: Connection, outcomes: list[dict[str, Any]]) -> None:
        keys = tuple(k for k in outcomes[0] if k != "b_mid")
        batch = [{"b_message_id": v["b_mid"], **{f"v_{k}": v[k] for k in keys}} for v in outcomes]
        self._record_many.execute(conn, keys, batch)


def _attempt(call: Callable[..., Any], *args: Any) -> tuple[Any, Exception | None]:
    """`call(*args)` as (result, None), or (None, the exception it raised)."""
    try:
        return call(*args), None
    except Exception as exc:
        return None, exc


class OutboxTransaction:
    """The handle `Outbox.begin` yields: publish messages in the owned transaction."""

    def __init__(self, outbox: Outbox, connection: Connection) -> None:
        self.outbox = outbox
        self.connection = connection
        self._messages: list[Message] = []
        self._open = True

    def publish(self, message: Message, *, max_sends: int | None = None) -> str:
        if not self._open or not self.connection.in_transaction():
            raise NoActiveTransaction("publish inside the `with outbox.begin(...)` block")
        self.outbox._insert(self.connection, message, max_sends)
        self._messages.append(message)
        return message.message_id


# -- session events ----------------------------------------------------------------------
_listening = threading.Lock()


def _listen(session: Session) -> None:
    """Hook the session events once for the process, on the `Session` class, instead of
    on each session (a listener registered per transaction cost more than the stub's own
    INSERT): sessions without pending messages pass through at the cost of a dict lookup."""
    if event.contains(Session, "after_commit", _after_commit):
        return
    with _listening:
        if not event.contains(Session, "after_commit", _after_commit):
            event.listen(Session, "after_soft_rollback", _after_soft_rollback)
            event.listen(Session, "after_commit", _after_commit)


def _after_commit(session: Session) -> None:
    if _PENDING not in session.info or session.in_nested_transaction():
        return  # nothing published, or a savepoint was released: not committed yet
    pending: list[_Pending] = session.info.pop(_PENDING, [])
    ready: dict[tuple[Outbox, Engine], list[Message]] = {}
    for item in pending:
        if item.connection.in_transaction():
            # The session joined a transaction it does not own (Session(bind=connection)
            # inside connection.begin()): its "commit" committed nothing yet. Sending now
            # could announce data that still rolls back; the committed stub is sent by the
            # resend worker instead.
            log.info(
                "outbox: %s not sent at session commit: the enclosing transaction is "
                "still open; the resend worker will send it",
                item.message.message_id,
            )
            continue
        if item.outbox.config.send_after_commit:
            ready.setdefault((item.outbox, item.connection.engine), []).append(item.message)
    for (outbox, engine), messages in ready.items():
        outbox._after_commit(engine, messages)


def _after_soft_rollback(session: Session, previous: SessionTransaction) -> None:
    pending: list[_Pending] = session.info.get(_PENDING, [])
    if pending:
        session.info[_PENDING] = [p for p in pending if not _within(p.transaction, previous)]


def _within(tx: SessionTransaction | None, ended: SessionTransaction) -> bool:
    while tx is not None:
        if tx is ended:
            return True
        tx = tx.parent
    return False


__all__ = ["Outbox", "OutboxConfig", "OutboxTransaction"]
