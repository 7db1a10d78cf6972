"""The resend worker: finds stubs whose message was lost and sends them again.

One pass (`run_once`):

1. Claim a batch of due stubs (`outbox.claim`): UNCONFIRMED, not escalated,
   `next_resend_at <= now`.
2. For each, work out the expected groups still missing (no confirmation row). A group
   with a consumption-log row is processing the message (the broker redelivers to it), so
   it is not a resend target. All groups confirmed: the stub is marked CONFIRMED.
3. A missing group has *lost* the message when it provably passed it: the group's
   committed offset on the queue the copy was sent to is beyond the copy's offset (the
   watermark; never the log's max offset, which an empty log or out-of-order commits would
   falsify). A stub never sent, or whose offset the broker no longer holds (`QueueBounds`),
   is lost for every missing group. A copy whose queue is unknown (a send over gRPC) is
   lost once the stub is older than the group's expected latency (`outbox.latency`, the
   reconciliation's rule too). Otherwise the group is backlogged: no resend, look again
   after `recheck_after`.
4. Lost and `send_count >= max_sends`: escalate through the `Notifier`, once. A send the
   broker refuses for good (`outbox.errors.is_permanent`) is escalated at once.
5. Lost otherwise: send again: to the topic when every expected group lost it, else only
   to each lost group (its retry topic `%RETRY%<group>`, original topic in `RETRY_TOPIC`):
   through `send_to_group` when the sender is a `GroupSender` whose broker accepts it; to
   the whole topic when it does not (an Apache RocketMQ proxy: the groups that had it get a
   copy their idempotency guard absorbs; logged, counted in `topic_fallbacks`); a plain
   `Sender` is sent the retry-topic copy itself.
   `send_count + 1`; `next_resend_at` from the backoff policy (a tenacity wait).
6. Finalise every claimed row in one transaction, guarded by the claim token.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from typing import Any

import tenacity
from sqlalchemy import Engine, bindparam, or_, select, update
from sqlalchemy.engine import RowMapping

from outbox.claim import ClaimStrategy, claim_batch, strategy_for
from outbox.errors import REFUSED_PREFIX, is_permanent
from outbox.latency import ExpectedLatency
from outbox.models import OutboxTables, StubStatus
from outbox.notify import Escalation, LogNotifier, Notifier
from outbox.ports import (
    PROPERTY_RETRY_TOPIC,
    PROPERTY_SEND_COUNT,
    Clock,
    OffsetSource,
    QueueBounds,
    Sender,
    retry_topic,
    utcnow,
)
from outbox.stubs import ArrayUpdates, message_from_stub, split_groups

log = logging.getLogger(__name__)

Wait = Callable[[tenacity.RetryCallState], float]


@dataclass(frozen=True)
class ResendPolicy:
    """How the worker paces itself. Waits are tenacity wait policies (composable values).

    backoff: delay before the next look at a stub after its n-th send (n = attempt number).
    recheck_after: delay before looking again at a backlogged or in-progress stub.
    error_backoff: delay after a failed send or notification.
    claim_ttl: how long a claim hides stubs from other workers (a dead worker's claim
        expires after it).
    stale_log_after: a consumption-log row means "that group is on it" (no resend) until
        it is this old with no live lease: by then the retry ladder (4 h 46 min) is over,
        so the message sits in the DLQ or its consumer is gone, and the stub goes on to
        resends and, at max_sends, escalation.
    expected_latency: how long each group may take to confirm a copy whose queue is
        unknown (a send over gRPC): older than that, unconfirmed and unlogged, it is lost.
        Reconciliation applies the same rule (`ReconcileOptions.expected_latency`).
    """

    batch_size: int = 200
    backoff: Wait = field(
        default_factory=lambda: tenacity.wait_exponential(multiplier=60, min=60, max=3600)
    )
    recheck_after: timedelta = timedelta(minutes=1)
    error_backoff: Wait = field(
        default_factory=lambda: tenacity.wait_exponential(multiplier=10, min=10, max=600)
    )
    claim_ttl: timedelta = timedelta(minutes=5)
    stale_log_after: timedelta = timedelta(hours=6)
    expected_latency: ExpectedLatency = field(default_factory=ExpectedLatency)

    def delay(self, wait: Wait, attempt: int) -> timedelta:
        state = tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.attempt_number = max(1, attempt)
        return timedelta(seconds=float(wait(state)))


@dataclass
class Metrics:
    """Counters over the worker's life (or one pass)."""

    passes: int = 0
    selected: int = 0
    resent: int = 0
    escalated: int = 0
    errors: int = 0
    backlogged: int = 0
    confirmed: int = 0
    refused: int = 0  # the broker refused the message itself: escalated at once
    group_resends: int = 0  # copies sent to one group alone (its retry topic)
    # stubs resent to the whole topic because the broker does not accept per-group resends
    topic_fallbacks: int = 0

    def add(self, other: Metrics) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class _Plan:
    """What one claimed row ends as (the values written when finalising)."""

    row: RowMapping
    values: dict[str, Any]
    # a whole-topic resend in flight (`send_async`): settled before finalising
    pending: _InFlight | None = None


@dataclass
class _InFlight:
    future: Future[Any]
    lost: list[str]
    attempt: int


class ResendWorker:
    """Resends lost stubs; safe to run as many of these at once as wanted."""

    def __init__(
        self,
        engine: Engine,
        tables: OutboxTables,
        sender: Sender,
        *,
        offsets: OffsetSource | None = None,
        bounds: QueueBounds | None = None,
        notifier: Notifier | None = None,
        policy: ResendPolicy | None = None,
        clock: Clock = utcnow,
        claim: ClaimStrategy | None = None,
        name: str | None = None,
    ) -> None:
        self.engine = engine
        self.tables = tables
        self.sender = sender
        self.offsets = offsets
        self.bounds = bounds
        self.notifier = notifier or LogNotifier()
        self.policy = policy or ResendPolicy()
        self.clock = clock
        self.claim = claim
        self.name = name or f"resend-{uuid.uuid4().hex[:8]}"
        self.metrics = Metrics()
        self._fallback_logged = False
        self._finalise_pg = ArrayUpdates(tables.stub, "id")

    # -- loop ------------------------------------------------------------------------------
    def run(
        self,
        stop: threading.Event,
        *,
        interval: float = 1.0,
        on_pass: Callable[[Metrics], None] | None = None,
    ) -> Metrics:
        """Run passes until `stop` is set (e.g. by SIGTERM); a pass is never cut in half."""
        while not stop.is_set():
            try:
                result = self.run_once()
            except Exception as exc:  # the next pass retries (a database outage, ...)
                log.warning(
                    "resend worker %s: pass failed, retrying in %ss: %r",
                    self.name,
                    interval,
                    exc,
                    exc_info=log.isEnabledFor(logging.DEBUG),
                )
                self.metrics.errors += 1
                result = Metrics(errors=1)
            if on_pass is not None:
                on_pass(result)
            if result.selected < self.policy.batch_size:
                stop.wait(interval)
        return self.metrics

    def run_once(self) -> Metrics:
        """One claim-send-finalise pass over at most `batch_size` stubs."""
        now = self.clock()
        token = f"{self.name}:{uuid.uuid4().hex}"
        with self.engine.begin() as conn:
            rows = claim_batch(
                conn,
                self.tables,
                token=token,
                now=now,
                until=now + self.policy.claim_ttl,
                limit=self.policy.batch_size,
                strategy=self.claim,
            )
        result = Metrics(passes=1, selected=len(rows))
        if rows:
            confirmed, in_log = self._progress([r["message_id"] for r in rows])
            plans = [
                self._safely(
                    row,
                    confirmed.get(row["message_id"], set()),
                    in_log.get(row["message_id"], set()),
                    result,
                )
                for row in rows
            ]
            # the batch's whole-topic resends went out together (pipelined); their
            # receipts now, in claim order
            plans = [self._settle(plan, result) if plan.pending else plan for plan in plans]
            self._finalise(plans, token)
        self.metrics.add(result)
        return result

    # -- one stub --------------------------------------------------------------------------
    def _progress(self, ids: list[str]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
        conf, logt = self.tables.confirmation, self.tables.consumption_log
        confirmed: dict[str, set[str]] = {}
        in_log: dict[str, set[str]] = {}
        with self.engine.connect() as conn:
            for mid, grp in conn.execute(
                select(conf.c.message_id, conf.c.consumer_group).where(conf.c.message_id.in_(ids))
            ):
                confirmed.setdefault(mid, set()).add(grp)
            stale = self.clock() - self.policy.stale_log_after
            for mid, grp in conn.execute(
                select(logt.c.message_id, logt.c.consumer_group).where(
                    logt.c.message_id.in_(ids),
                    or_(logt.c.created_at > stale, logt.c.lease_until > self.clock()),
                )
            ):
                in_log.setdefault(mid, set()).add(grp)
        return confirmed, in_log

    def _safely(
        self, row: RowMapping, confirmed: set[str], in_log: set[str], result: Metrics
    ) -> _Plan:
        """`_handle`, but one stub's failure (an unreachable offset source, a bad row) only
        postpones that stub; the rest of the batch goes on and every claim is released."""
        try:
            return self._handle(row, confirmed, in_log, result)
        except Exception as exc:
            result.errors += 1
            log.warning("resend worker %s: stub %s failed: %s", self.name, row["message_id"], exc)
            return _Plan(
                row,
                {
                    "next_resend_at": self.clock()
                    + self.policy.delay(self.policy.error_backoff, 1),
                    "last_error": f"{type(exc).__name__}: {exc}"[:2000],
                },
            )

    def _handle(
        self, row: RowMapping, confirmed: set[str], in_log: set[str], result: Metrics
    ) -> _Plan:
        now = self.clock()
        expected = split_groups(row["expected_groups"])
        if expected:
            missing = [g for g in expected if g not in confirmed]
        else:  # no declared groups: one confirmation by anyone confirms it
            missing = [] if confirmed else [""]
        if not missing:
            result.confirmed += 1
            return _Plan(row, {"status": StubStatus.CONFIRMED.value})
        if not expected and in_log:
            missing = []  # some group is processing it (and none is declared to wait for)
        lost = [g for g in missing if g not in in_log and self._lost(row, g)]
        if not lost:
            result.backlogged += 1
            return _Plan(row, {"next_resend_at": now + self.policy.recheck_after})
        if row["send_count"] >= row["max_sends"]:
            return self._escalate(row, lost, result)
        to_topic = not expected or set(lost) == set(expected)
        return self._resend(row, lost, to_topic=to_topic, result=result)

    def _lost(self, row: RowMapping, group: str) -> bool:
        """True when `group` provably cannot receive the last copy any more."""
        if row["queue_offset"] is None:
            return True  # never sent (or the send result was never recorded): due by age
        positions: dict[str, list[Any]] = json.loads(row["group_positions"] or "{}")
        topic, queue_id, offset = positions.get(
            group, [row["topic"], row["queue_id"], row["queue_offset"]]
        )
        if queue_id is None or queue_id < 0 or offset is None or offset < 0:
            # where the copy landed is unknown (an Apache RocketMQ proxy names no queue; a
            # delayed message is not in its queue yet): no watermark can prove it passed or
            # pending, so it is lost once older than the group's expected latency
            return self._overdue(row, group)
        if self.bounds is not None:
            high = self.bounds.max_offset(topic, queue_id)
            if high is not None and high <= offset:
                return True  # the broker no longer holds that offset
        if not group:
            return False
        if self.offsets is None:
            # the queue is known but nothing can say how far the group got: the expected
            # latency decides, as the certificate without committed offsets does, so
            # silence never reads as "still coming"
            return self._overdue(row, group)
        committed = self.offsets.committed_offset(group, topic, queue_id)
        return committed is not None and committed > offset  # none yet: not reached

    def _overdue(self, row: RowMapping, group: str) -> bool:
        """The stub is older than `group`'s expected latency (the age rule)."""
        latency = self.policy.expected_latency.for_group(group)
        return bool(row["created_at"] <= self.clock() - latency)

    def _resend(
        self, row: RowMapping, lost: list[str], *, to_topic: bool, result: Metrics
    ) -> _Plan:
        attempt = row["send_count"] + 1
        message = message_from_stub(row)
        message = replace(
            message, properties={**message.properties, PROPERTY_SEND_COUNT: str(attempt)}
        )
        values: dict[str, Any] = {"send_count": attempt}
        positions: dict[str, list[Any]] = json.loads(row["group_positions"] or "{}")
        try:
            # the broker may refuse per-group resends (an Apache RocketMQ proxy): then the
            # whole topic; the groups that had it get a copy their idempotency guard absorbs
            fallback = not to_topic and (per_group := self._per_group()) is False
            send_async = getattr(self.sender, "send_async", None)
            if to_topic and callable(send_async):
                # in flight with the rest of the batch; `_settle` writes its receipt
                return _Plan(row, values, _InFlight(send_async(message), lost, attempt))
            if to_topic or fallback:
                receipt = self.sender.send(message)
                values.update(
                    queue_id=receipt.queue_id,
                    queue_offset=receipt.queue_offset,
                    broker_msg_id=receipt.offset_msg_id,
                )
                positions = {}
                if fallback:
                    result.topic_fallbacks += 1
                    self._log_fallback(row["message_id"], lost)
            else:
                for group in lost:
                    if per_group:
                        receipt = self.sender.send_to_group(message, group)  # type: ignore[attr-defined]
                    else:  # a plain Sender: the retry-topic copy itself
                        receipt = self.sender.send(
                            replace(
                                message,
                                topic=retry_topic(group),
                                properties={
                                    **message.properties,
                                    PROPERTY_RETRY_TOPIC: message.topic,
                                },
                            )
                        )
                    positions[group] = [receipt.topic, receipt.queue_id, receipt.queue_offset]
                    result.group_resends += 1
        except Exception as exc:
            if is_permanent(exc):
                return self._refused(row, lost, exc, attempt, result)
            result.errors += 1
            log.warning("resend of %s failed: %s", row["message_id"], exc)
            values.update(
                last_error=f"{type(exc).__name__}: {exc}"[:2000],
                next_resend_at=self.clock() + self.policy.delay(self.policy.error_backoff, attempt),
            )
        else:
            result.resent += 1
            values.update(
                last_error=None,
                next_resend_at=self.clock() + self.policy.delay(self.policy.backoff, attempt),
            )
        values["group_positions"] = json.dumps(positions, sort_keys=True) if positions else None
        return _Plan(row, values)

    def _settle(self, plan: _Plan, result: Metrics) -> _Plan:
        """The receipt (or failure) of a whole-topic resend sent with `send_async`:
        the same values `_resend` writes for a send it waited for."""
        assert plan.pending is not None
        row, values, pending = plan.row, dict(plan.values), plan.pending
        try:
            receipt = pending.future.result()
        except Exception as exc:
            if is_permanent(exc):
                return self._refused(row, pending.lost, exc, pending.attempt, result)
            result.errors += 1
            log.warning("resend of %s failed: %s", row["message_id"], exc)
            values.update(
                last_error=f"{type(exc).__name__}: {exc}"[:2000],
                next_resend_at=self.clock()
                + self.policy.delay(self.policy.error_backoff, pending.attempt),
            )
        else:
            result.resent += 1
            values.update(
                queue_id=receipt.queue_id,
                queue_offset=receipt.queue_offset,
                broker_msg_id=receipt.offset_msg_id,
                last_error=None,
                next_resend_at=self.clock()
                + self.policy.delay(self.policy.backoff, pending.attempt),
            )
        values["group_positions"] = None  # a copy to the whole topic: one position again
        return _Plan(row, values)

    def _per_group(self) -> bool | None:
        """Whether the sender's broker accepts per-group resends (a `GroupSender` asks it);
        None for a plain `Sender`, which is sent the retry-topic copy itself."""
        probe = getattr(self.sender, "can_send_to_group", None)
        if not callable(probe) or not callable(getattr(self.sender, "send_to_group", None)):
            return None
        return bool(probe())

    def _log_fallback(self, message_id: str, lost: list[str]) -> None:
        if not self._fallback_logged:
            self._fallback_logged = True
            log.warning(
                "resend worker %s: the broker does not accept per-group resends (an Apache "
                "RocketMQ proxy refuses %%RETRY%% topics): messages some groups lost are "
                "resent to the whole topic; the groups that had them absorb the copy with "
                "their idempotency guard",
                self.name,
            )
        log.info(
            "resend of %s to the whole topic for %s: per-group resends not accepted",
            message_id,
            ",".join(lost),
        )

    def _refused(
        self, row: RowMapping, lost: list[str], exc: BaseException, attempt: int, result: Metrics
    ) -> _Plan:
        """The broker refused the message itself: no resend can succeed. Escalate now (once),
        instead of retrying until max_sends."""
        error = f"{REFUSED_PREFIX}{type(exc).__name__}: {exc}"[:2000]
        log.error("resend of %s refused for good: %s", row["message_id"], exc)
        result.refused += 1
        plan = self._escalate(row, lost, result, last_error=error, refused=True, send_count=attempt)
        plan.values.setdefault("last_error", error)
        plan.values["send_count"] = attempt
        return plan

    def _escalate(
        self,
        row: RowMapping,
        lost: list[str],
        result: Metrics,
        *,
        last_error: str | None = None,
        refused: bool = False,
        send_count: int | None = None,
    ) -> _Plan:
        escalation = Escalation(
            message_id=row["message_id"],
            topic=row["topic"],
            send_count=row["send_count"] if send_count is None else send_count,
            max_sends=row["max_sends"],
            missing_groups=tuple(g for g in lost if g),
            created_at=row["created_at"],
            last_error=last_error or row["last_error"],
            refused=refused,
        )
        try:
            self.notifier.notify(escalation)
        except Exception as exc:
            result.errors += 1
            log.warning("escalation of %s not delivered: %s", row["message_id"], exc)
            return _Plan(
                row,
                {
                    "next_resend_at": self.clock()
                    + self.policy.delay(self.policy.error_backoff, 1),
                    "last_error": str(exc)[:2000],
                },
            )
        result.escalated += 1
        return _Plan(row, {"escalated_at": self.clock()})

    def _finalise(self, plans: list[_Plan], token: str) -> None:
        """Write every plan, in one transaction, on the rows still claimed by `token`.

        The claim is checked once for the batch (`SELECT ... FOR UPDATE` of the batch's ids
        still carrying the token: the rows stay ours until the commit); each row is then
        updated by its primary key alone. Checking the token in every row's UPDATE let the
        planner pick the claim index, whose entries for one token are the whole batch: a
        scan of the batch per row, quadratic in the batch size."""
        stub = self.tables.stub
        now = self.clock()
        with self.engine.begin() as conn:
            ours = set(
                conn.execute(
                    select(stub.c.id)
                    .where(stub.c.id.in_([plan.row["id"] for plan in plans]))
                    .where(stub.c.claimed_by == token)
                    .with_for_update()
                ).scalars()
            )
            groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
            for plan in plans:
                if plan.row["id"] not in ours:
                    continue  # the claim expired and another worker took the row
                values = {**plan.values, "claimed_by": None, "updated_at": now}
                params = {f"v_{k}": v for k, v in values.items()}
                params["b_id"] = plan.row["id"]
                groups.setdefault(tuple(sorted(values)), []).append(params)
            # without row locks (SQLite: one writer, no FOR UPDATE) the token is checked
            # again in each UPDATE; there the primary key is always the row's lookup
            recheck = (self.claim or strategy_for(conn)) is ClaimStrategy.ATOMIC_UPDATE
            for keys, batch in groups.items():
                if conn.dialect.name == "postgresql":
                    self._finalise_pg.execute(conn, keys, batch)
                    continue
                stmt = (
                    update(stub)
                    .where(stub.c.id == bindparam("b_id"))
                    .values({k: bindparam(f"v_{k}") for k in keys})
                )
                if recheck:
                    stmt = stmt.where(stub.c.claimed_by == token)
                conn.execute(stmt, batch)


def describe(metrics: Metrics | Mapping[str, int]) -> str:
    data = metrics.as_dict() if isinstance(metrics, Metrics) else dict(metrics)
    return " ".join(f"{k}={v}" for k, v in data.items())
