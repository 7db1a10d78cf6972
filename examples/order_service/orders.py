"""The order service: the order row and its `OrderCreated` message commit together."""

from __future__ import annotations

import json

import sqlalchemy as sa
from sqlalchemy.orm import Session

from examples.order_service.schema import TOPIC, orders
from outbox import Outbox
from reliable import Message


def create_order(session: Session, outbox: Outbox, sku: str, quantity: int) -> int:
    """Insert the order and publish `OrderCreated` in the caller's transaction.

    The message is sent after the caller commits; if the transaction rolls back, neither
    the order nor the message exists.
    """
    if quantity <= 0:
        raise ValueError("quantity must be positive")
    order_id = session.execute(
        sa.insert(orders).values(sku=sku, quantity=quantity)
    ).inserted_primary_key[0]
    body = json.dumps({"order_id": order_id, "sku": sku, "quantity": quantity}).encode()
    outbox.publish(session, Message(topic=TOPIC, body=body, keys=[f"order-{order_id}"]))
    return int(order_id)
