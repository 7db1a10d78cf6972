"""Run the order service and the inventory consumer on the embedded broker.

    python -m examples.order_service [--db URL] [--redis URL] [--store DIR]

It places orders through the outbox, delivers one message twice (as a producer retry
would), loses one send (the broker is unreachable right after the commit) and lets the
resend worker recover it, then prints the stock: every order is reserved exactly once.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session

from examples.order_service.inventory import inventory_handler
from examples.order_service.orders import create_order
from examples.order_service.schema import create, outbox_tables, reservations, stock
from idempotency import EventKind, GuardConfig, IdempotencyGuard
from outbox import Outbox, ResendWorker, StubStatus, utcnow
from outbox.adapters import TransportOffsets
from reliable import Message, Producer, SendReceipt, Worker

STORE = {
    "mapped_file_size_commitlog": 16 << 20,
    "max_hash_slot_num": 25_000,
    "max_index_num": 100_000,
    "delay_levels": "100ms 200ms 300ms 500ms 800ms 1s",
}
FAST = {
    "consume_from": "first",
    "rebalance_interval_s": 0.2,
    "heartbeat_interval_s": 0.2,
    "persist_offset_interval_s": 0.2,
    "pull_suspend_ms": 200,
}


class FlakyNetwork:
    """Wraps the producer: the next send fails, as an unreachable broker would."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.fail_next = False

    def send(self, message: Message) -> SendReceipt:
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("broker unreachable")
        return self.producer.send(message)


def wait_for(predicate, seconds: float = 30) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def main(db_url: str, redis_url: str, store_dir: str) -> int:
    engine = sa.create_engine(db_url)
    create(engine, {"book": 10, "pen": 1})
    client = redis.Redis.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2)
    guard = IdempotencyGuard(
        engine, outbox_tables, client, config=GuardConfig(key_prefix=f"shop:{time.time_ns()}:")
    )
    reserve = inventory_handler(guard, **FAST)

    with Worker(reserve, store_dir=store_dir, **STORE) as worker, worker.producer() as producer:
        network = FlakyNetwork(producer)
        outbox = Outbox(outbox_tables, network)
        with Session(engine) as session, session.begin():  # order + message: one commit
            create_order(session, outbox, "book", 2)
            create_order(session, outbox, "pen", 1)
        with Session(engine) as session, session.begin():
            create_order(session, outbox, "pen", 1)  # no stock left: discarded, not retried
        try:
            with Session(engine) as session, session.begin():
                create_order(session, outbox, "book", 5)
                raise RuntimeError("payment declined")  # rolled back: no order, no message
        except RuntimeError:
            pass
        network.fail_next = True  # the commit succeeds, the send after it does not
        with Session(engine) as session, session.begin():
            lost = create_order(session, outbox, "book", 3)

        with engine.connect() as conn:  # a producer retry: the same message id twice
            first = (
                conn.execute(sa.select(outbox_tables.stub).order_by(outbox_tables.stub.c.id))
                .mappings()
                .first()
            )
        assert first is not None
        producer.send(
            Message(topic=first["topic"], body=first["body"], message_id=first["message_id"])
        )

        resender = ResendWorker(
            engine,
            outbox_tables,
            network,
            offsets=TransportOffsets(worker.transport),
            clock=lambda: utcnow() + timedelta(minutes=1),
        )
        resent = resender.run_once().resent
        settled = wait_for(
            lambda: _confirmed(engine) == 4 and guard.stats[EventKind.DUPLICATE] >= 1
        )

    with engine.connect() as conn:
        rows = conn.execute(sa.select(stock).order_by(stock.c.sku)).all()
        reserved = (
            conn.execute(sa.select(reservations.c.order_id).order_by(reservations.c.order_id))
            .scalars()
            .all()
        )
    print(f"resend worker recovered {resent} lost send(s) (order {lost})")
    for row in rows:
        print(f"stock {row.sku}: available={row.available} reserved={row.reserved}")
    print(f"reserved orders: {list(reserved)}; guard: {_stats(guard)}")
    ok = settled and resent == 1 and [tuple(r) for r in rows] == [("book", 5, 5), ("pen", 0, 1)]
    if not ok:
        print("unexpected outcome", file=sys.stderr)
    return 0 if ok else 1


def _confirmed(engine: sa.Engine) -> int:
    stub = outbox_tables.stub
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count()).where(stub.c.status == StubStatus.CONFIRMED.value)
            ).scalar()
            or 0
        )


def _stats(guard: IdempotencyGuard) -> str:
    return ", ".join(
        f"{k.value}={v}" for k, v in sorted(guard.stats.counts.items(), key=lambda kv: kv[0].value)
    )


if __name__ == "__main__":
    logging.basicConfig(level=logging.ERROR)
    parser = argparse.ArgumentParser(
        prog="python -m examples.order_service", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--db", help="SQLAlchemy URL (default: a SQLite file in a temp dir)")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--store", help="broker store directory (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or f"sqlite:///{Path(tmp) / 'shop.db'}"
        sys.exit(main(db, args.redis, args.store or str(Path(tmp) / "store")))
