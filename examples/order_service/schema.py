"""The business tables (orders, stock) beside the outbox's tables, in one database."""

from __future__ import annotations

import sqlalchemy as sa

from outbox import OutboxTables, declare_groups

TOPIC = "OrderCreated"
GROUP = "inventory"

metadata = sa.MetaData()
orders = sa.Table(
    "shop_orders",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("sku", sa.String(32), nullable=False),
    sa.Column("quantity", sa.Integer, nullable=False),
)
stock = sa.Table(
    "shop_stock",
    metadata,
    sa.Column("sku", sa.String(32), primary_key=True),
    sa.Column("available", sa.Integer, nullable=False),
    sa.Column("reserved", sa.Integer, nullable=False, default=0),
)
reservations = sa.Table(  # one row per reserved order: what the consumer did, once
    "shop_reservations",
    metadata,
    sa.Column("order_id", sa.Integer, primary_key=True),
    sa.Column("sku", sa.String(32), nullable=False),
    sa.Column("quantity", sa.Integer, nullable=False),
)
outbox_tables = OutboxTables(prefix="shop_")


def create(engine: sa.Engine, initial_stock: dict[str, int]) -> None:
    """A fresh demo schema (drops what an earlier run left)."""
    outbox_tables.drop_all(engine)
    metadata.drop_all(engine)
    metadata.create_all(engine)
    outbox_tables.create_all(engine)
    declare_groups(engine, outbox_tables, TOPIC, [GROUP])  # who must confirm OrderCreated
    with engine.begin() as conn:
        conn.execute(sa.delete(stock))
        conn.execute(
            sa.insert(stock),
            [{"sku": s, "available": n, "reserved": 0} for s, n in initial_stock.items()],
        )
