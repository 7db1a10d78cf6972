"""The idempotency guard: its state machine, per message and consumer group.

docs/outbox.md draws the same diagram (tests/integration/idempotency/test_docs.py keeps
the two equal).

    deliver (message, group)
      │
      ▼
    1. Redis SET <prefix><group>:<id> "L:<token>" NX PX <lease>
      │ taken              │ not taken             │ Redis down (database alone)
      ▼                    ▼                       ▼
    2. one DB transaction: insert the consumption-log row (kept if already there), read
       the confirmation and the stub ─── DB down ──► release Redis ──► RECONSUME_LATER
      │                    │                       │
      ▼                    ▼                       ▼
    3. confirmation row for (id, group)? ── yes ──► delete log row, Redis "D:" ──► SUCCESS
      │ no                 │ no                    │ no     (known id, other body ──► reported)
      │                    └──► 4. held elsewhere ─┼────────────────────────► RECONSUME_LATER
      │                                            │          (or wait for its result)
      ▼                                            ▼
    DB lease, in 2's transaction: log row := token, unless another live lease
      │                                    └── held ──► RECONSUME_LATER
      ▼
    handler(session=S) ── raises ──► 6. roll back S; release DB lease and Redis key
      │                                 (compare-and-delete); re-raise
      ▼
    5. in S: delete the log row where it still carries token (this locks it)
         ── none ──► roll back ──► RECONSUME_LATER (fenced)
       insert confirmation (unique key; taken ──► roll back ──► SUCCESS, a duplicate)
       stub CONFIRMED once every expected group has confirmed
       commit S ── DB down ──► RECONSUME_LATER
      │
      ▼
    queue the Redis done mark (one thread writes many in one pipeline, later):
    "L:<token>" → "D:<token>" PX <ttl> (only while still ours) ──► SUCCESS

`Discard` from the handler: the handler's writes roll back, the confirmation is recorded
with outcome DISCARDED (so redeliveries are duplicates), and `Discard` is re-raised for the
caller to acknowledge. Redis unavailable: the database lease and confirmation alone (slower,
still exactly once). Database unavailable: never SUCCESS.

`prepare(batch, group)` takes steps 1 and 2 of a received batch together (PostgreSQL: one
Redis pipeline, one statement); `process` then starts each message from there.
"""

from __future__ import annotations

import enum
import functools
import inspect
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import (
    DBAPIError,
    DisconnectionError,
    IntegrityError,
    InterfaceError,
    OperationalError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session

from idempotency.config import GuardConfig, MismatchPolicy
from idempotency.done_marks import DoneMarks
from idempotency.errors import BodyMismatch, NotADeadLetter
from idempotency.leases import Leases, RedisLike
from idempotency.renewals import Lease, Renewals
from idempotency.store import ConfirmStatus, GuardStore, Known
from outbox.models import ConfirmationOutcome, OutboxTables
from outbox.ports import Clock, utcnow
from outbox.schema import require_tables
from outbox.stubs import body_digest
from protocol.names import DLQ_GROUP_TOPIC_PREFIX, is_dlq_topic
from protocol.props import Prop
from reliable.message import ConsumeResult, ReceivedMessage
from reliable.outcomes import Discard

log = logging.getLogger(__name__)

DB_DOWN = (OperationalError, InterfaceError, DisconnectionError, PoolTimeout)

# properties every retry / dead-letter copy carries (broker/sendback.py, broker/pop.py):
# ORIGIN_MESSAGE_ID, the offset id of the first copy (set at the first send-back);
# DLQ_ORIGIN_MESSAGE_ID, the id of the copy that was dead-lettered; DLQ_ORIGIN_TOPIC and
# RETRY_TOPIC, the topic it was first sent to


def dead_letter_origin(message: ReceivedMessage, group: str | None = None) -> tuple[str, str, str]:
    """(original message id, group, original topic) of a copy read from `%DLQ%<group>`.

    The id is the one the guard keyed the group's deliveries by: the client-visible id
    (`UNIQ_KEY`), which every retry and dead-letter copy keeps; a message sent without one
    (its id is its offset id, different for every copy) falls back to ORIGIN_MESSAGE_ID,
    then DLQ_ORIGIN_MESSAGE_ID.
    """
    dlq_group = (
        message.topic.removeprefix(DLQ_GROUP_TOPIC_PREFIX) if is_dlq_topic(message.topic) else None
    )
    if group is None:
        group = dlq_group
    if not group or (dlq_group is not None and dlq_group != group):
        raise NotADeadLetter(message.topic, group)
    props = message.properties
    if message.offset_msg_id and message.message_id == message.offset_msg_id:
        original = (
            props.get(Prop.ORIGIN_MESSAGE_ID)
            or props.get(Prop.DLQ_ORIGIN_MESSAGE_ID)
            or message.message_id
        )
    else:
        original = message.message_id
    topic = props.get(Prop.DLQ_ORIGIN_TOPIC) or props.get(Prop.RETRY_TOPIC) or message.topic
    return original, group, topic


def _redis_errors() -> tuple[type[BaseException], ...]:
    import redis

    return (redis.RedisError, OSError)


class EventKind(enum.Enum):
    PROCESSED = "processed"  # the handler ran and its confirmation committed
    DUPLICATE = "duplicate"  # already confirmed: acknowledged without running the handler
    IN_PROGRESS = "in_progress"  # another worker holds it: RECONSUME_LATER
    FENCED = "fenced"  # this worker's lease was taken over: its work rolled back
    DISCARDED = "discarded"  # the handler raised Discard: recorded as done
    HANDLER_FAILED = "handler_failed"  # the handler raised: lease released, exception re-raised
    BODY_MISMATCH = "body_mismatch"  # a known id with another body
    REDIS_UNAVAILABLE = "redis_unavailable"  # fell back to the database alone
    DB_UNAVAILABLE = "db_unavailable"  # never acknowledged


@dataclass(frozen=True)
class GuardEvent:
    kind: EventKind
    message_id: str
    group: str
    detail: str = ""


@dataclass
class GuardStats:
    counts: dict[EventKind, int] = field(default_factory=dict)

    def add(self, kind: EventKind) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def __getitem__(self, kind: EventKind) -> int:
        return self.counts.get(kind, 0)


class _Fenced(Exception):
    pass


@dataclass(frozen=True)
class _Prepared:
    """Steps 1 and 2 of one message, taken with its received batch (`prepare`)."""

    token: str
    digest: str  # of the message's body
    held: bool | None
    known: Known
    claimed: bool
    start: datetime  # the guard's clock when the receipt was written
    at: float  # time.monotonic() of the same instant


class IdempotencyGuard:
    """Runs a handler at most once per (message id, consumer group), and at least once.

    redis: a redis-py client (give it `socket_timeout`/`socket_connect_timeout` so an
        unreachable Redis fails fast); None runs on the database alone.
    engine, tables: where the consumption log and confirmations live (the outbox tables);
        handlers get a `Session` on this engine so their writes commit with the confirmation.
    """

    def __init__(
        self,
        engine: Engine,
        tables: OutboxTables,
        redis: RedisLike | None,
        *,
        config: GuardConfig | None = None,
        clock: Clock = utcnow,
        sleep: Callable[[float], None] = time.sleep,
        on_event: Callable[[GuardEvent], None] | None = None,
    ) -> None:
        self.config = (config or GuardConfig()).validate()  # refuses short dedup windows
        # missing tables fail here, naming the fix (`TablesMissing`), not once per message
        require_tables(engine, tables, unreachable_ok=True)
        self.engine = engine
        self.tables = tables
        self.store = GuardStore(engine, tables)
        self.leases = (
            Leases(
                redis,
                self.config.key_prefix,
                _ms(self.config.lease.total_seconds()),
                _ms(self.config.ttl.total_seconds()),
            )
            if redis is not None
            else None
        )
        self.clock = clock
        self.sleep = sleep
        self.on_event = on_event
        self.stats = GuardStats()
        self._redis_errors = _redis_errors()
        self._renewals = Renewals(
            self.config.renew_lease, self.config.lease.total_seconds(), self._renew
        )
        # (message id, group) -> what `prepare` took for it, until `process` starts it
        self._prepared: dict[tuple[str, str], _Prepared] = {}
        self._prepared_lock = threading.Lock()
        self._marks = DoneMarks(self.leases, self._redis_errors) if self.leases else None

    # -- the decorator's entry point -------------------------------------------------------
    def process(
        self, message: ReceivedMessage, group: str, invoke: Callable[..., object]
    ) -> ConsumeResult:
        """Run `invoke(session=...)` once for (message, group); see the module docstring.

        Returns SUCCESS (processed, or a duplicate) or RECONSUME_LATER (in progress
        elsewhere, fenced, database down). Exceptions from `invoke` propagate unchanged after
        the lease is released; `Discard` propagates after the outcome is confirmed.
        """
        prepared = self._take_prepared(message, group) if self._prepared else None
        digest = body_digest(message.body) if prepared is None else prepared.digest
        token = prepared.token if prepared is not None else uuid.uuid4().hex
        key = self.leases.key(group, message.message_id) if self.leases else ""
        started = self.clock() if prepared is None else prepared.start
        deadline = (
            started + self.config.wait_for_result
            if self.config.wait_for_result is not None
            else None
        )
        first = True
        while True:
            if prepared is not None:  # steps 1 and 2 were taken with the received batch
                held, known, claimed = prepared.held, prepared.known, prepared.claimed
                prepared = None
            else:
                start = self.clock() if not first else started
                held = self._acquire(key, token, message, group)  # True, False, None (no Redis)
                try:
                    # steps 1 and 3 in one transaction: the log row (first pass), what the
                    # database knows, and the DB lease when it may be taken
                    known, claimed = _once_more_if_stale(
                        functools.partial(
                            self.store.receive,
                            message,
                            group,
                            token,
                            start,
                            start + self.config.lease,
                            log_receipt=first,
                            may_claim=functools.partial(self._may_claim, held, digest),
                        )
                    )
                except DB_DOWN as exc:
                    self._release_redis(key, token, held)
                    return self._later(EventKind.DB_UNAVAILABLE, message, group, str(exc))
            first = False
            self._check_body(known, digest, message, group, key, token, held)
            if known.confirmed:
                return self._duplicate(message, group, key, token, held)
            if claimed:
                return self._run(message, group, invoke, key, token, digest, held)
            self._release_redis(key, token, held)
            if deadline is None or self.clock() >= deadline:
                return self._later(EventKind.IN_PROGRESS, message, group)
            self.sleep(self.config.poll_interval.total_seconds())

    def prepare(self, messages: Sequence[ReceivedMessage], group: str) -> None:
        """Steps 1 and 2 for a received batch at once, before its messages reach `process`:
        one Redis pipeline of SET NX and one statement for all the receipts (PostgreSQL;
        elsewhere one transaction of two statements), instead of a round trip of each a
        message (for one message nothing is done here). `process` then starts each
        message from what was taken for it, unless it started more than half a lease
        later: then that lease is released and the message goes through both steps again.
        Never raises: what fails here is left to `process`."""
        with self._prepared_lock:  # one already prepared is left to `process`
            batch = [
                m
                for m in {m.message_id: m for m in messages}.values()
                if (m.message_id, group) not in self._prepared
            ]
        if len(batch) < 2:
            return
        now, at = self.clock(), time.monotonic()
        self._forget_stale(at)
        tokens = [uuid.uuid4().hex for _ in batch]
        keys = [self.leases.key(group, m.message_id) if self.leases else "" for m in batch]
        held: list[bool | None] = [None] * len(batch)
        if self.leases is not None:
            try:
                held = list(self.leases.acquire_many(keys, tokens))
            except self._redis_errors as exc:
                for m in batch:
                    self._emit(EventKind.REDIS_UNAVAILABLE, m, group, str(exc))
        digests = [body_digest(m.body) for m in batch]
        claims = [
            functools.partial(self._may_claim, h, d) for h, d in zip(held, digests, strict=True)
        ]
        try:
            received = _once_more_if_stale(
                functools.partial(
                    self.store.receive_many,
                    batch,
                    group,
                    tokens,
                    now,
                    now + self.config.lease,
                    claims,
                )
            )
        except Exception as exc:  # each message on its own, through both steps again
            if isinstance(exc, DB_DOWN):
                log.debug("batch receipt of %d messages failed: %r", len(batch), exc)
            else:
                log.warning("batch receipt of %d messages failed", len(batch), exc_info=True)
            for key, token, h in zip(keys, tokens, held, strict=True):
                self._release_redis(key, token, h)
            return
        with self._prepared_lock:
            for m, token, d, h, (known, claimed) in zip(
                batch, tokens, digests, held, received, strict=True
            ):
                self._prepared[(m.message_id, group)] = _Prepared(
                    token, d, h, known, claimed, now, at
                )

    def _take_prepared(self, message: ReceivedMessage, group: str) -> _Prepared | None:
        """What `prepare` took for (message, group), unless it is older than half a lease
        (then its leases are released and None: a renewal every lease/3 from now could come
        after the lease ran out)."""
        with self._prepared_lock:
            prepared = self._prepared.pop((message.message_id, group), None)
        if prepared is None:
            return None
        if time.monotonic() - prepared.at <= self.config.lease.total_seconds() / 2:
            return prepared
        key = self.leases.key(group, message.message_id) if self.leases else ""
        if prepared.claimed:
            self._release(message, group, key, prepared.token, prepared.held)
        else:
            self._release_redis(key, prepared.token, prepared.held)
        return None

    def _forget_stale(self, now: float) -> None:
        """Drop what was prepared for messages that never reached `process` (released by
        the consumer, or stopped) once their leases have run out."""
        lease = self.config.lease.total_seconds()
        with self._prepared_lock:
            stale = [k for k, p in self._prepared.items() if now - p.at > lease]
            for k in stale:
                del self._prepared[k]

    def _may_claim(self, held: bool | None, digest: str, known: Known) -> bool:
        """May this worker take the DB lease, given its Redis lease and what is known?"""
        return (
            held is not False
            and not known.confirmed
            and not (
                self.config.on_body_mismatch is MismatchPolicy.REJECT and _mismatched(known, digest)
            )
        )

    # -- dead letters ---------------------------------------------------------------------
    def mark_dead_lettered(self, message: ReceivedMessage, group: str | None = None) -> str:
        """Record that `group` gave up on a message: `message` is its copy read from
        `%DLQ%<group>` (`group` defaults to the one the topic names).

        Upserts the consumption-log row of (original message id, group) with
        `dead_lettered_at` (the first stamp stays), so reconciliation counts the message as
        dead-lettered (held for an operator) rather than in processing. Returns the original
        message id. `NotADeadLetter` for a message of another topic without a group; a
        database error propagates (the caller retries).
        """
        original, group, topic = dead_letter_origin(message, group)
        self.store.mark_dead_lettered(
            original, group, topic, message.queue_id, message.queue_offset, self.clock()
        )
        log.info("%s dead-lettered %s", group, original)
        return original

    # -- standalone use (no decorator) ---------------------------------------------------
    def consume(
        self, message: ReceivedMessage, group: str, handler: Callable[..., object]
    ) -> ConsumeResult:
        """Call `handler(message[, session=...])` under the guard and map its outcome.

        Returns normally: SUCCESS. `Discard`: SUCCESS (recorded as done). Any other
        exception (including `RetryLater`): logged, RECONSUME_LATER.
        """
        wants_session = _accepts(handler, "session")

        def invoke(**kwargs: Any) -> object:
            return handler(message, **({"session": kwargs["session"]} if wants_session else {}))

        try:
            return self.process(message, group, invoke)
        except Discard:
            return ConsumeResult.SUCCESS
        except BodyMismatch:
            log.error("message %s: body mismatch, not processed", message.message_id)
            return ConsumeResult.RECONSUME_LATER
        except Exception:
            log.exception("handler failed for message %s (group %s)", message.message_id, group)
            return ConsumeResult.RECONSUME_LATER

    def listener(
        self, group: str, handler: Callable[..., object]
    ) -> Callable[[ReceivedMessage], ConsumeResult]:
        """A transport listener `message -> ConsumeResult` running `handler` idempotently."""
        return lambda message: self.consume(message, group, handler)

    def purge(self) -> int:
        """Apply `db_retention`: delete confirmations older than it (none when unset).

        The retention was checked against the retry horizon at start-up, so a purged
        message can no longer be redelivered by the broker's retries or DLQ replay.
        """
        if self.config.db_retention is None:
            return 0
        return self.store.purge(self.clock() - self.config.db_retention)

    # -- steps -------------------------------------------------------------------------------
    def _renew(self, lease: Lease) -> bool:
        """Renew both leases; False once taken over (fencing refuses the confirmation)."""
        try:
            if lease.held and self.leases is not None:
                self.leases.renew(lease.key, lease.token)
            return self.store.renew(
                lease.message_id, lease.group, lease.token, self.clock() + self.config.lease
            )
        except Exception as exc:  # a failed renewal only shortens the lease
            log.warning("lease renewal of %s failed: %s", lease.message_id, exc)
            return True

    def _acquire(self, key: str, token: str, message: ReceivedMessage, group: str) -> bool | None:
        if self.leases is None:
            return None
        try:
            return self.leases.acquire(key, token)
        except self._redis_errors as exc:
            self._emit(EventKind.REDIS_UNAVAILABLE, message, group, str(exc))
            return None

    def _run(
        self,
        message: ReceivedMessage,
        group: str,
        invoke: Callable[..., object],
        key: str,
        token: str,
        digest: str,
        held: bool | None,
    ) -> ConsumeResult:
        session = Session(self.engine)
        try:
            tx = session.begin()
            try:
                with self._renewals.held(message.message_id, group, key, token, held):
                    invoke(session=session)
            except Discard:
                session.rollback()
                if (
                    self._finish_discard(message, group, key, token, digest, held)
                    is not ConsumeResult.SUCCESS
                ):
                    return ConsumeResult.RECONSUME_LATER  # not recorded: never acknowledge
                raise
            except BaseException as exc:
                session.rollback()
                self._release(message, group, key, token, held)
                self._emit(EventKind.HANDLER_FAILED, message, group, repr(exc))
                raise
            if session.get_transaction() is not tx:
                log.warning(
                    "handler for %s ended the guard's transaction itself: its writes "
                    "were not atomic with the confirmation",
                    message.message_id,
                )
            return self._confirm(
                session, message, group, key, token, digest, held, ConfirmationOutcome.SUCCESS
            )
        finally:
            session.close()

    def _confirm(
        self,
        session: Session,
        message: ReceivedMessage,
        group: str,
        key: str,
        token: str,
        digest: str,
        held: bool | None,
        outcome: ConfirmationOutcome,
    ) -> ConsumeResult:
        try:
            status = self.store.confirm(
                session, message, group, token, digest, outcome.value, self.clock()
            )
            if status is ConfirmStatus.FENCED:
                raise _Fenced
            session.commit()
        except _Fenced:
            session.rollback()
            return self._later(
                EventKind.FENCED,
                message,
                group,
                "lease taken over by another worker; work rolled back",
            )
        except IntegrityError:
            session.rollback()
            return self._duplicate(message, group, key, token, held)
        except DB_DOWN as exc:
            _quiet(session.rollback)
            self._release(message, group, key, token, held)
            return self._later(EventKind.DB_UNAVAILABLE, message, group, str(exc))
        self._mark_done(key, token, held)
        kind = (
            EventKind.PROCESSED if outcome is ConfirmationOutcome.SUCCESS else EventKind.DISCARDED
        )
        self._emit(kind, message, group)
        return ConsumeResult.SUCCESS

    def _finish_discard(
        self,
        message: ReceivedMessage,
        group: str,
        key: str,
        token: str,
        digest: str,
        held: bool | None,
    ) -> ConsumeResult:
        with Session(self.engine) as session:
            session.begin()
            return self._confirm(
                session, message, group, key, token, digest, held, ConfirmationOutcome.DISCARDED
            )

    def _duplicate(
        self, message: ReceivedMessage, group: str, key: str, token: str, held: bool | None
    ) -> ConsumeResult:
        try:
            self.store.forget_log(message.message_id, group)
        except DB_DOWN as exc:  # confirmed is confirmed: acknowledging is still right
            log.warning("could not delete the log row of %s: %s", message.message_id, exc)
        self._mark_done(key, token, held)
        self._emit(EventKind.DUPLICATE, message, group)
        return ConsumeResult.SUCCESS

    def _check_body(
        self,
        known: Any,
        digest: str,
        message: ReceivedMessage,
        group: str,
        key: str,
        token: str,
        held: bool | None,
    ) -> None:
        for source, known_digest in (
            ("confirmation", known.confirmation_digest),
            ("stub", known.stub_digest),
        ):
            if known_digest and known_digest != digest:
                error = BodyMismatch(message.message_id, group, known_digest, digest, source)
                self._emit(EventKind.BODY_MISMATCH, message, group, str(error))
                if self.config.on_body_mismatch is MismatchPolicy.REJECT:
                    self._release_redis(key, token, held)
                    raise error

    def _release(
        self, message: ReceivedMessage, group: str, key: str, token: str, held: bool | None
    ) -> None:
        try:
            self.store.release(message.message_id, group, token)
        except DB_DOWN as exc:  # the DB lease expires by itself
            log.warning("could not release the DB lease of %s: %s", message.message_id, exc)
        self._release_redis(key, token, held)

    def _release_redis(self, key: str, token: str, held: bool | None) -> None:
        if held and self.leases is not None:
            try:
                self.leases.release(key, token)
            except self._redis_errors as exc:  # the key expires by itself
                log.warning("could not release Redis lease %s: %s", key, exc)

    def _mark_done(self, key: str, token: str, held: bool | None) -> None:
        """Written by `DoneMarks`' thread: the confirmation already decides."""
        if self._marks is not None and held is not False:
            # held None: Redis was down at the start; the mark is set if it is back
            self._marks.add(key, token, bool(held))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the Redis done mark of every message confirmed so far is written
        (True), or `timeout` seconds passed (False). Nothing depends on it: a message's
        confirmation decides, its mark only spares a later copy's lease."""
        return True if self._marks is None else self._marks.flush(timeout)

    def _later(
        self, kind: EventKind, message: ReceivedMessage, group: str, detail: str = ""
    ) -> ConsumeResult:
        self._emit(kind, message, group, detail)
        return ConsumeResult.RECONSUME_LATER

    def _emit(
        self, kind: EventKind, message: ReceivedMessage, group: str, detail: str = ""
    ) -> None:
        self.stats.add(kind)
        if kind in (EventKind.DB_UNAVAILABLE, EventKind.FENCED, EventKind.BODY_MISMATCH):
            log.warning("%s %s/%s %s", kind.value, group, message.message_id, detail)
        if self.on_event is not None:
            self.on_event(GuardEvent(kind, message.message_id, group, detail))


_T = TypeVar("_T")


def _once_more_if_stale(step: Callable[[], _T]) -> _T:
    """Run `step`; if it failed on a pooled connection found dead (the database restarted
    since it was opened), once more on a fresh one. Engines then need no `pool_pre_ping`,
    a round trip on every checkout. The step is one transaction that rolled back."""
    try:
        return step()
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        log.info("a pooled database connection was dead (%s); retrying on a new one", exc)
        return step()


def _mismatched(known: Known, digest: str) -> bool:
    return bool(
        (known.confirmation_digest and known.confirmation_digest != digest)
        or (known.stub_digest and known.stub_digest != digest)
    )


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _accepts(fn: Callable[..., object], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _quiet(fn: Callable[[], object]) -> None:
    try:
        fn()
    except Exception as exc:  # the connection is gone; nothing left to roll back
        log.debug("ignored during cleanup: %s", exc)


__all__ = ["EventKind", "GuardEvent", "GuardStats", "IdempotencyGuard"]
