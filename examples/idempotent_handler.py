"""Idempotent handlers: a message delivered twice runs the handler once.

The guard (Redis SET NX + a confirmation row in the database) wraps the handler; the handler
gets a database session whose writes commit together with the confirmation.
Needs Redis (RELIABLE_REDIS_URL, default redis://127.0.0.1:6379/0).

    python examples/idempotent_handler.py [STORE_DIR]
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
from pathlib import Path

import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session

from idempotency import IdempotencyGuard
from outbox.models import OutboxTables
from reliable import Message, ReceivedMessage, Worker, handler, new_message_id

STORE = {
    "mapped_file_size_commitlog": 16 << 20,
    "max_hash_slot_num": 25_000,
    "max_index_num": 100_000,
}


def main(store_dir: str) -> int:
    db = sa.create_engine(f"sqlite:///{Path(store_dir).parent / 'app.db'}")
    tables = OutboxTables(prefix=f"demo{os.getpid()}_")
    tables.create_all(db)
    payments = sa.Table("payments", tables.metadata, sa.Column("order_id", sa.String(64)))
    payments.create(db, checkfirst=True)
    guard = IdempotencyGuard(
        db,
        tables,
        redis.Redis.from_url(
            os.environ.get("RELIABLE_REDIS_URL", "redis://127.0.0.1:6379/0"), socket_timeout=2
        ),
    )
    calls = threading.Semaphore(0)

    @handler("payments", group="ledger", idempotent=guard, consume_from="first")
    def book(message: ReceivedMessage, session: Session) -> None:
        session.execute(payments.insert().values(order_id=message.body.decode()))
        calls.release()

    with Worker(book, store_dir=store_dir, **STORE) as worker, worker.producer() as producer:
        message_id = new_message_id()
        for _ in range(3):  # e.g. a producer retry after a lost acknowledgement
            producer.send(Message("payments", b"order-42", message_id=message_id))
        calls.acquire(timeout=30)
        calls.acquire(timeout=2)  # a second run would show up here
    with db.connect() as conn:
        rows = conn.execute(sa.select(sa.func.count()).select_from(payments)).scalar_one()
    print(f"sent 3 copies of {message_id}; the handler booked {rows} payment(s)")
    return 0 if rows == 1 else 1


if __name__ == "__main__":
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else str(Path(tmp) / "store")))
