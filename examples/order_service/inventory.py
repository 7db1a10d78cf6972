"""The inventory consumer: reserves stock once per order, however often it is delivered.

The guard hands the handler a `Session`; the stock update and the guard's confirmation row
commit in that one transaction, so a crash anywhere leaves either both or neither.
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from sqlalchemy.orm import Session

from examples.order_service.schema import GROUP, TOPIC, reservations, stock
from idempotency import IdempotencyGuard
from reliable import Discard, Handler, ReceivedMessage, handler


def inventory_handler(guard: IdempotencyGuard, **options: object) -> Handler:
    @handler(TOPIC, group=GROUP, idempotent=guard, **options)
    def reserve_stock(message: ReceivedMessage, session: Session) -> None:
        order = json.loads(message.body)
        updated = session.execute(
            sa.update(stock)
            .where(stock.c.sku == order["sku"], stock.c.available >= order["quantity"])
            .values(
                available=stock.c.available - order["quantity"],
                reserved=stock.c.reserved + order["quantity"],
            )
        )
        if updated.rowcount == 0:
            raise Discard(f"no stock for order {order['order_id']}")  # done, never retried
        session.execute(
            sa.insert(reservations).values(
                order_id=order["order_id"], sku=order["sku"], quantity=order["quantity"]
            )
        )

    return reserve_stock
