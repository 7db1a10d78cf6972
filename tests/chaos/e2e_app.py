"""Child programs and shared pieces for the end-to-end chaos tests (tests/chaos/test_e2e_*).

    python -m tests.chaos.e2e_app publish STORE DB PREFIX FLUSH RUN THREADS
        an application process: the embedded broker on STORE (flush sync|async) and THREADS
        order-service threads publishing through the outbox into DB; after each send the
        broker acknowledged it prints "ACK <message id>" (flushed). Runs until killed.
    python -m tests.chaos.e2e_app consume ENDPOINT DB PREFIX REDIS_URL KEY_PREFIX NAME
        an inventory consumer process over the gRPC transport: the idempotent handler
        writes one effect row per run in the guard's transaction; prints "READY" once
        started. Runs until SIGTERM or SIGKILL.

The effect table has no unique key on purpose: if a message were processed twice, two rows
would show it.
"""

from __future__ import annotations

import random
import signal
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from broker.store.config import WATERMARKS_OFF

TOPIC = "E2EOrders"
GROUP = "e2e-inventory"
STORE_SIZES = {
    "mapped_file_size_commitlog": 4 << 20,
    "mapped_file_size_consume_queue": 20 * 20_000,
    "max_hash_slot_num": 20_000,
    "max_index_num": 80_000,
    **WATERMARKS_OFF,
}  # the host's disk is shared
FAST_CONSUMER = {
    "consume_from": "first",
    "rebalance_interval_s": 0.3,
    "heartbeat_interval_s": 0.3,
    "persist_offset_interval_s": 0.2,
    "pull_suspend_ms": 100,
    "consume_threads": 4,
}


def tables(prefix: str) -> tuple[Any, sa.MetaData, sa.Table]:
    from outbox import OutboxTables

    metadata = sa.MetaData()
    effects = sa.Table(
        f"{prefix}effects",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("message_id", sa.String(64), nullable=False),  # not unique: doubles show
        sa.Column("consumer", sa.String(64), nullable=False),
    )
    return OutboxTables(prefix=prefix), metadata, effects


def create_schema(engine: sa.Engine, prefix: str) -> None:
    from outbox import declare_groups

    outbox_tables, metadata, _ = tables(prefix)
    outbox_tables.drop_all(engine)
    metadata.drop_all(engine)
    outbox_tables.create_all(engine)
    metadata.create_all(engine)
    declare_groups(engine, outbox_tables, TOPIC, [GROUP])


def engine_for(url: str) -> sa.Engine:
    args: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite"):
        args["connect_args"] = {"timeout": 60}
    return sa.create_engine(url, **args)


def effect_handler(
    guard: Any,
    effects: sa.Table,
    name: str,
    delay: tuple[float, float] = (0.0, 0.0),
    **options: Any,
) -> Any:
    """The idempotent inventory handler: one effect row per successful run."""
    from reliable import ReceivedMessage, handler

    rng = random.Random()

    @handler(TOPIC, group=GROUP, idempotent=guard, **{**FAST_CONSUMER, **options})
    def reserve(message: ReceivedMessage, session: Session) -> None:
        if delay[1] > 0:
            time.sleep(rng.uniform(*delay))  # work in progress: a kill may land here
        session.execute(sa.insert(effects).values(message_id=message.message_id, consumer=name))

    return reserve


class RecordingSender:
    """The outbox's sender: reports each acknowledged send on stdout, then returns."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer
        self.lock = threading.Lock()

    def send(self, message: Any) -> Any:
        receipt = self.producer.send(message)
        with self.lock:
            sys.stdout.write(f"ACK {receipt.message_id}\n")
            sys.stdout.flush()
        return receipt


def publish(store: str, db: str, prefix: str, flush: str, run: str, threads: int) -> None:
    from broker.store.config import FlushMode
    from outbox import Outbox, OutboxConfig
    from reliable import Message, Producer, connect

    outbox_tables, _, _ = tables(prefix)
    engine = engine_for(db)
    mode = FlushMode.SYNC_FLUSH if flush == "sync" else FlushMode.ASYNC_FLUSH
    # async: flush every 5 s, so that the tail a power cut drops was really not yet flushed
    # however slowly a busy machine sends (with 500 ms it may all be flushed by the cut)
    interval = {} if mode is FlushMode.SYNC_FLUSH else {"flush_interval_commitlog_ms": 5_000}
    transport = connect("embedded", store_dir=store, flush_mode=mode, **STORE_SIZES, **interval)
    transport.start()
    producer = Producer(transport).start()
    outbox = Outbox(
        outbox_tables,
        RecordingSender(producer),
        config=OutboxConfig(
            resend_after=timedelta(hours=1), retry_after_failure=timedelta(seconds=0)
        ),
    )
    print("READY", flush=True)

    def loop(t: int) -> None:
        i = 0
        while True:
            with Session(engine) as session, session.begin():
                outbox.publish(
                    session, Message(TOPIC, f"{run}-{t}-{i}".encode(), keys=[f"{run}-{t}-{i}"])
                )
            i += 1

    workers = [threading.Thread(target=loop, args=(t,), daemon=True) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def consume(
    endpoint: str, db: str, prefix: str, redis_url: str, key_prefix: str, name: str
) -> None:
    import redis

    from idempotency import GuardConfig, IdempotencyGuard
    from reliable import connect

    outbox_tables, _, effects = tables(prefix)
    engine = engine_for(db)
    client = redis.Redis.from_url(
        redis_url, socket_timeout=0.5, socket_connect_timeout=0.5, retry_on_timeout=False
    )
    guard = IdempotencyGuard(
        engine,
        outbox_tables,
        client,
        config=GuardConfig(key_prefix=key_prefix, lease=timedelta(seconds=3)),
    )
    reserve = effect_handler(
        guard,
        effects,
        name,
        delay=(0.01, 0.08),
        max_reconsume_times=16,
        invisible_ms=3_000,
        receive_long_poll_ms=1_000,
        consume_threads=2,
    )
    transport = connect("grpc", endpoint=endpoint)
    transport.start()
    consumer = reserve.consumer(transport, client_id=name)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumer.start()
    print("READY", flush=True)
    stop.wait()
    consumer.shutdown()
    transport.close()


def main(argv: list[str]) -> None:
    import logging

    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    if argv[0] == "publish":
        publish(argv[1], argv[2], argv[3], argv[4], argv[5], int(argv[6]))
    elif argv[0] == "consume":
        consume(*argv[1:7])
    else:
        raise SystemExit(f"unknown mode {argv[0]!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
