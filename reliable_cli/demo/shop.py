"""The demo's business: an order service and an inventory that reserves stock.

One database holds the business tables and the outbox's tables, so an order row and its
`OrderCreated` stub commit together, and a stock reservation commits together with the
guard's confirmation row. `reservations` has one row per order (primary key): it is the
business effect the demo counts as "consumed once", and the stock columns must agree with it.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from outbox import Outbox, OutboxTables, declare_groups, utcnow
from reliable import Handler, Message, ReceivedMessage, dlq_handler, handler
from reliable_cli.demo.faults import OrderFate

if TYPE_CHECKING:
    from idempotency.guard import GuardEvent
    from reliable.idempotent import MessageGuard

TOPIC = "OrderCreated"
GROUP = "inventory"
SKUS = ("book", "pen", "lamp", "mug", "desk")


class PaymentDeclined(Exception):
    """The order's transaction is rolled back: neither the order nor its message exists."""


class InvalidOrder(Exception):
    """A poison message: its body is not an order; every delivery fails."""


class StockServiceDown(Exception):
    """A transient failure (the warehouse service timed out): retried later."""


class Shop:
    """The business tables and the outbox tables, under one table prefix."""

    def __init__(self, prefix: str = "demo_", *, topic: str = TOPIC, group: str = GROUP) -> None:
        self.prefix = prefix
        self.topic = topic  # the topic the orders are published to
        self.group = group  # the inventory consumers' group
        self.metadata = sa.MetaData()
        self.orders = sa.Table(
            f"{prefix}orders",
            self.metadata,
            sa.Column("order_id", sa.String(32), primary_key=True),
            sa.Column("sku", sa.String(32), nullable=False),
            sa.Column("quantity", sa.Integer, nullable=False),
            sa.Column("created_at", sa.DateTime, nullable=False),
        )
        self.stock = sa.Table(
            f"{prefix}stock",
            self.metadata,
            sa.Column("sku", sa.String(32), primary_key=True),
            sa.Column("available", sa.Integer, nullable=False),
            sa.Column("reserved", sa.Integer, nullable=False),
        )
        self.reservations = sa.Table(  # the consumer's effect: one row per order, once
            f"{prefix}reservations",
            self.metadata,
            sa.Column("order_id", sa.String(32), primary_key=True),
            sa.Column("sku", sa.String(32), nullable=False),
            sa.Column("quantity", sa.Integer, nullable=False),
            sa.Column("reserved_by", sa.String(64), nullable=False),
        )
        self.tables = OutboxTables(prefix=prefix)

    def create(self, engine: sa.Engine, stock_per_sku: int) -> None:
        """A fresh schema (drops what an earlier run with the same prefix left)."""
        self.tables.drop_all(engine)
        self.metadata.drop_all(engine)
        self.metadata.create_all(engine)
        self.tables.create_all(engine)
        declare_groups(
            engine, self.tables, self.topic, [self.group]
        )  # who must confirm OrderCreated
        with engine.begin() as conn:
            conn.execute(
                sa.insert(self.stock),
                [{"sku": s, "available": stock_per_sku, "reserved": 0} for s in SKUS],
            )

    # -- the order service ------------------------------------------------------------------
    def place_order(
        self, engine: sa.Engine, outbox: Outbox, fate: OrderFate, quantity: int
    ) -> bool:
        """Insert the order and publish `OrderCreated` in one transaction; False if the
        transaction rolled back (a declined payment: no order, no message)."""
        sku = SKUS[int(fate.order_id[-6:]) % len(SKUS)]
        if fate.poison:  # a client with a bug: the quantity is not a number
            body = json.dumps({"order_id": fate.order_id, "sku": sku, "quantity": "two"})
        else:
            body = json.dumps({"order_id": fate.order_id, "sku": sku, "quantity": quantity})
        try:
            with Session(engine) as session, session.begin():
                session.execute(
                    sa.insert(self.orders).values(
                        order_id=fate.order_id, sku=sku, quantity=quantity, created_at=utcnow()
                    )
                )
                outbox.publish(
                    session,
                    Message(
                        topic=self.topic, body=body.encode(), tags="created", keys=[fate.order_id]
                    ),
                )
                if fate.rolled_back:
                    raise PaymentDeclined(fate.order_id)
        except PaymentDeclined:
            return False
        return True


class Inventory:
    """The inventory consumers' handlers, with counters a person (and a test) can check."""

    def __init__(self, shop: Shop, engine: sa.Engine, fates: dict[str, OrderFate]) -> None:
        self.shop = shop
        self.engine = engine
        self.fates = fates
        self._lock = threading.Lock()
        self.runs = 0  # handler invocations (what the guard let through)
        self.failures: Counter[str] = Counter()  # message id -> failed runs
        self.retried: set[str] = set()  # message ids delivered again after a failure
        self.dead_lettered: set[str] = set()

    def handlers(self, guard: MessageGuard, **options: Any) -> tuple[Handler, Handler]:
        """The reserving handler (idempotent through `guard`) and the dead-letter handler."""

        @handler(self.shop.topic, group=self.shop.group, idempotent=guard, **options)
        def reserve_stock(message: ReceivedMessage, session: Session) -> None:
            self._count_run(message)
            order = json.loads(message.body)
            fate = self.fates.get(str(order.get("order_id")))
            if not isinstance(order.get("quantity"), int):
                raise InvalidOrder(
                    f"order {order.get('order_id')}: quantity "
                    f"{order.get('quantity')!r} is not a number"
                )
            if fate is not None and message.reconsume_times < fate.failures:
                raise StockServiceDown(f"warehouse timed out for {fate.order_id}")
            updated = session.execute(
                sa.update(self.shop.stock)
                .where(
                    self.shop.stock.c.sku == order["sku"],
                    self.shop.stock.c.available >= order["quantity"],
                )
                .values(
                    available=self.shop.stock.c.available - order["quantity"],
                    reserved=self.shop.stock.c.reserved + order["quantity"],
                )
            )
            if updated.rowcount != 1:  # type: ignore[attr-defined]
                raise StockServiceDown(f"no stock row for {order['sku']}")
            session.execute(
                sa.insert(self.shop.reservations).values(
                    order_id=order["order_id"],
                    sku=order["sku"],
                    quantity=order["quantity"],
                    reserved_by=threading.current_thread().name[:64],
                )
            )

        @dlq_handler(self.shop.group, **options)
        def dead_letters(message: ReceivedMessage) -> None:
            self.mark_dead_lettered(
                message.message_id, message.topic, message.queue_id, message.queue_offset
            )

        return reserve_stock, dead_letters

    def _count_run(self, message: ReceivedMessage) -> None:
        with self._lock:
            self.runs += 1
            if message.reconsume_times > 0:
                self.retried.add(message.message_id)

    def count_failure(self, message_id: str) -> None:
        with self._lock:
            self.failures[message_id] += 1

    def mark_dead_lettered(
        self, message_id: str, topic: str, queue_id: int, queue_offset: int
    ) -> None:
        """Stamp the group's consumption-log row: the message is held in `%DLQ%inventory`
        for an operator, which reconciliation counts as accounted for (not in processing)."""
        log = self.shop.tables.consumption_log
        now = utcnow()
        with self.engine.begin() as conn:
            done = conn.execute(
                sa.update(log)
                .where(log.c.message_id == message_id, log.c.consumer_group == self.shop.group)
                .values(dead_lettered_at=now)
            ).rowcount
            if not done:
                conn.execute(
                    sa.insert(log).values(
                        message_id=message_id,
                        consumer_group=self.shop.group,
                        topic=self.shop.topic,
                        queue_id=queue_id,
                        queue_offset=queue_offset,
                        created_at=now,
                        dead_lettered_at=now,
                    )
                )
        with self._lock:
            self.dead_lettered.add(message_id)


def counting_listener(
    inventory: Inventory, guard_event: Callable[[GuardEvent], None] | None = None
) -> Callable[[GuardEvent], None]:
    """A guard `on_event` callback that counts handler failures per message."""

    def on_event(event: GuardEvent) -> None:
        if getattr(event.kind, "value", "") == "handler_failed":
            inventory.count_failure(event.message_id)
        if guard_event is not None:
            guard_event(event)

    return on_event
