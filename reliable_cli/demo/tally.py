"""The demo's figures, each read from where its effect lives (the stub, log, confirmation,
order, reservation and stock tables, the broker's offsets), and the checks that they add
up; and, for a flow that did not settle, what it left behind.

What each figure counts: the module docstring of `reliable_cli.demo.flow`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa

from outbox import StubStatus
from outbox.adapters import TransportOffsets
from reliable.naming import retry_topic
from reliable_cli.demo.faults import FaultPlan
from reliable_cli.demo.shop import GROUP, TOPIC, Shop

UNSETTLED_SHOWN = 10  # stubs a flow that did not settle names


@dataclass
class Summary:
    """The figures a person checks at the end."""

    seed: int
    topic: str = TOPIC  # the topic and group this run used (its own, against a shared broker)
    group: str = GROUP
    published: int = 0
    poison: int = 0
    rolled_back: int = 0
    consumed_once: int = 0
    handler_runs: int = 0
    retried: int = 0
    dead_lettered: int = 0
    dropped: int = 0
    duplicated: int = 0
    duplicates_absorbed: int = 0
    resent: int = 0
    unaccounted: int = 0
    reconciled: bool = False
    settled: bool = False
    elapsed_s: float = 0.0
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        return [
            f"published       {self.published:>6}  orders committed with their message "
            f"(+{self.poison} poison, {self.rolled_back} rolled back: nothing sent)",
            f"consumed once   {self.consumed_once:>6}  stock reservations, one per order",
            f"handler runs    {self.handler_runs:>6}  (duplicates absorbed by the guard: "
            f"{self.duplicates_absorbed})",
            f"retried         {self.retried:>6}  messages retried through the delay levels",
            f"dead-lettered   {self.dead_lettered:>6}  poison messages in %DLQ%{self.group}",
            f"resent          {self.resent:>6}  by the resend worker ({self.dropped} sends "
            f"dropped after acknowledgement, {self.duplicated} sent twice)",
            f"unaccounted     {self.unaccounted:>6}"
            + ("  (reconciliation's verdict)" if self.reconciled else ""),
        ]


def _dead_lettered(conn: sa.Connection, shop: Shop) -> int:
    """Stubs the group's `%DLQ%` handler marked dead-lettered in its consumption log."""
    log = shop.tables.consumption_log
    return int(
        conn.execute(
            sa.select(sa.func.count())
            .select_from(log)
            .where(log.c.consumer_group == shop.group, log.c.dead_lettered_at.is_not(None))
        ).scalar_one()
    )


def accounted(engine: sa.Engine, shop: Shop) -> int:
    """Stubs confirmed by the inventory group or held in its DLQ."""
    t = shop.tables
    with engine.connect() as conn:
        confirmed = conn.execute(
            sa.select(sa.func.count())
            .select_from(t.stub)
            .where(t.stub.c.status == StubStatus.CONFIRMED.value)
        ).scalar_one()
        dead = _dead_lettered(conn, shop)
    return int(confirmed) + dead


def count(engine: sa.Engine, shop: Shop, plan: FaultPlan, s: Summary) -> None:
    """Published, poison, consumed once and dead-lettered, from the tables."""
    t = shop.tables
    poison_ids = {f.order_id for f in plan.fates if f.poison}
    with engine.connect() as conn:
        keys = conn.execute(sa.select(t.stub.c["keys"])).scalars().all()
        s.poison = sum(1 for k in keys if k in poison_ids)
        s.published = len(keys) - s.poison
        s.consumed_once = int(
            conn.execute(sa.select(sa.func.count()).select_from(shop.reservations)).scalar_one()
        )
        s.dead_lettered = _dead_lettered(conn, shop)


def unaccounted_in_db(engine: sa.Engine, shop: Shop) -> int:
    """Without a reconciliation: stubs neither confirmed nor dead-lettered."""
    t = shop.tables
    dead = sa.select(t.consumption_log.c.message_id).where(
        t.consumption_log.c.consumer_group == shop.group,
        t.consumption_log.c.dead_lettered_at.is_not(None),
    )
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count())
                .select_from(t.stub)
                .where(
                    t.stub.c.status != StubStatus.CONFIRMED.value,
                    t.stub.c.message_id.not_in(dead),
                )
            ).scalar_one()
        )


def check(engine: sa.Engine, shop: Shop, plan: FaultPlan, s: Summary, initial: int) -> None:
    """The counts must add up, and no effect may have been applied twice (`initial`: each
    SKU's stock before the run). Each disagreement is added to `s.problems`."""
    t = shop.tables
    committed = [f for f in plan.fates if not f.rolled_back]
    with engine.connect() as conn:
        orders = {r.order_id: r for r in conn.execute(sa.select(shop.orders))}
        reserved = conn.execute(sa.select(shop.reservations)).all()
        stock = conn.execute(sa.select(shop.stock)).all()
        confirmations = int(
            conn.execute(
                sa.select(sa.func.count())
                .select_from(t.confirmation)
                .where(t.confirmation.c.consumer_group == shop.group)
            ).scalar_one()
        )
    if len(orders) != len(committed) or s.rolled_back != len(plan.fates) - len(committed):
        s.problems.append(f"{len(orders)} order rows for {len(committed)} committed orders")
    if s.published + s.poison != len(committed):
        s.problems.append(f"{s.published + s.poison} stubs for {len(committed)} orders")
    if s.consumed_once != s.published:
        s.problems.append(f"consumed once {s.consumed_once} != published {s.published}")
    if confirmations != s.consumed_once:
        s.problems.append(f"{confirmations} confirmations for {s.consumed_once} reservations")
    if s.dead_lettered != s.poison:
        s.problems.append(f"dead-lettered {s.dead_lettered} != poison {s.poison}")
    if s.resent < s.dropped:
        s.problems.append(f"resent {s.resent} < dropped {s.dropped}")
    for r in reserved:
        order = orders.get(r.order_id)
        if order is None or (order.sku, order.quantity) != (r.sku, r.quantity):
            s.problems.append(f"reservation {r.order_id} matches no order")
    by_sku: dict[str, int] = {}
    for r in reserved:
        by_sku[r.sku] = by_sku.get(r.sku, 0) + r.quantity
    for row in stock:
        if row.reserved != by_sku.get(row.sku, 0) or row.available + row.reserved != initial:
            s.problems.append(
                f"stock of {row.sku}: reserved {row.reserved}, reservations "
                f"{by_sku.get(row.sku, 0)} (an effect applied twice?)"
            )


def unsettled(engine: sa.Engine, shop: Shop, offsets: TransportOffsets | None) -> list[str]:
    """What a flow that did not settle left behind: each stub neither confirmed nor
    dead-lettered (its sends, where its last send landed, the group's log row), and each
    queue the group has not consumed to its end."""
    t = shop.tables
    log = t.consumption_log
    with engine.connect() as conn:
        stubs = conn.execute(
            sa.select(
                t.stub.c.message_id,
                t.stub.c.status,
                t.stub.c.send_count,
                t.stub.c.queue_id,
                t.stub.c.queue_offset,
                t.stub.c.last_error,
                log.c.topic,
                log.c.queue_id.label("log_queue"),
                log.c.queue_offset.label("log_offset"),
                log.c.lease_until,
                log.c.dead_lettered_at,
            )
            .select_from(
                t.stub.outerjoin(
                    log,
                    sa.and_(
                        log.c.message_id == t.stub.c.message_id,
                        log.c.consumer_group == shop.group,
                    ),
                )
            )
            .where(
                t.stub.c.status != StubStatus.CONFIRMED.value,
                log.c.dead_lettered_at.is_(None),
            )
            .order_by(t.stub.c.created_at)
            .limit(UNSETTLED_SHOWN + 1)
        ).all()
    lines = []
    for r in stubs[:UNSETTLED_SHOWN]:
        landed = (
            f"queue {r.queue_id} offset {r.queue_offset}"
            if r.queue_id is not None
            else "no send recorded"
        )
        seen = (
            f"in the log at {r.topic} queue {r.log_queue} offset {r.log_offset}"
            f" (lease until {r.lease_until})"
            if r.log_queue is not None
            else "never in the group's log"
        )
        error = f"; last error: {r.last_error}" if r.last_error else ""
        lines.append(
            f"unsettled: message {r.message_id}: stub {r.status}, {r.send_count} send(s), "
            f"last to {landed}; {seen}{error}"
        )
    if len(stubs) > UNSETTLED_SHOWN:
        lines.append(f"unsettled: ... and more (the first {UNSETTLED_SHOWN} shown)")
    for topic, queue, end, done in behind(offsets, shop.topic, shop.group):
        lines.append(
            f"unsettled: {topic} queue {queue}: {end} message(s), the group "
            f"committed {done if done is not None else 'nothing'}"
        )
    return lines


def behind(
    offsets: TransportOffsets | None, topic_name: str, group: str
) -> Iterator[tuple[str, int, int, int | None]]:
    """(topic, queue, its end, the group's committed offset) of each queue of the topic and
    of the group's retry topic that the group has not consumed to its end; none when the
    broker answers no offsets (a remote one)."""
    if offsets is None:
        return
    for topic in (topic_name, retry_topic(group)):
        for queue in range(8):
            end = offsets.max_offset(topic, queue)
            if end is None or end <= 0:
                continue
            done = offsets.committed_offset(group, topic, queue)
            if done is None or done < end:
                yield topic, queue, end, done
