"""Transactional (half) messages: the message becomes visible only if the local
transaction commits; the broker asks the checker about transactions left unknown.

    python examples/transactional_send.py [STORE_DIR]
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from typing import Any

from reliable import Message, Producer, ReceivedMessage, SimpleConsumer, TransactionState

STORE = {
    "mapped_file_size_commitlog": 16 << 20,
    "max_hash_slot_num": 25_000,
    "max_index_num": 100_000,
}

orders_db: dict[str, str] = {}  # stands in for the application's database


def place_order(message: Message, order_id: Any) -> TransactionState:
    """The local transaction: runs after the half message is stored."""
    if order_id == "o-2":
        return TransactionState.ROLLBACK  # e.g. the insert violated a constraint
    orders_db[order_id] = "placed"
    if order_id == "o-3":
        raise ConnectionError("crashed before answering")  # left to the check-back
    return TransactionState.COMMIT


def check(message: ReceivedMessage) -> TransactionState:
    """The broker's check-back: look the order up in the database."""
    order_id = message.keys[0]
    print(f"check-back for {order_id}")
    return TransactionState.COMMIT if order_id in orders_db else TransactionState.ROLLBACK


def main(store_dir: str) -> int:
    from broker.config import BrokerConfig

    # check unknown transactions after 0.5 s instead of RocketMQ's default minute
    config = BrokerConfig(transaction_timeout_ms=500, transaction_check_interval_ms=500)
    with (
        Producer(
            "embedded",
            group="orders-tx",
            transaction_checker=check,
            store_dir=store_dir,
            broker_config=config,
            **STORE,
        ) as producer,
        SimpleConsumer(
            "shipping", {"orders": "*"}, transport=producer.transport, await_duration_s=0.5
        ) as consumer,
    ):
        for order_id in ("o-1", "o-2", "o-3"):
            result = producer.send_in_transaction(
                Message("orders", order_id.encode(), keys=[order_id]), place_order, order_id
            )
            print(f"{order_id}: local transaction -> {result.state.value}")
        delivered: list[str] = []
        deadline = time.time() + 30
        while len(delivered) < 2 and time.time() < deadline:
            for m in consumer.receive(10):
                delivered.append(m.body.decode())
                consumer.ack(m)
        print("delivered:", sorted(delivered))
    return 0 if sorted(delivered) == ["o-1", "o-3"] else 1


if __name__ == "__main__":
    # handler failures are logged as warnings with tracebacks; keep the demo's output short
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else tmp))
