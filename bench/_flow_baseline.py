"""The hand-written baseline of `bench flow`: the same guarantees the common way, as
processes of their own.

    python -m bench._flow_baseline relay   --db URL --nats URL --subject S --table T
    python -m bench._flow_baseline consume --db URL --nats URL --stream ST --subject S
        --durable D --threads N --redis URL --processed T --reservations T

- relay: polls the stub table (`SELECT ... ORDER BY id LIMIT batch FOR UPDATE SKIP
  LOCKED`), publishes the batch to NATS JetStream (`publish_async`, every ack awaited),
  deletes the rows and commits; sleeps `--poll-ms` when the table is empty.
- consume: a durable pull consumer (`fetch(batch)`), each message handled on a pool of
  `--threads` threads: Redis `SET processed:<id> 1 NX EX 86400` (taken: a duplicate, ack),
  then in one database transaction a processed-id row (primary key) and the reservation
  row (a unique violation: a duplicate), commit, ack.

Each prints `ready` on stdout once connected; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def relay(args: argparse.Namespace) -> None:
    import nats

    engine = sa.create_engine(args.db, pool_size=1, max_overflow=0)
    table = sa.Table(args.table, sa.MetaData(), autoload_with=engine)
    nc = await nats.connect(args.nats)
    js = nc.jetstream(publish_async_max_pending=args.batch * 2, timeout=30)
    stop = _stop_event()
    pick = (
        sa.select(table.c.id, table.c.message_id, table.c.body)
        .order_by(table.c.id)
        .limit(args.batch)
        .with_for_update(skip_locked=True)
    )
    print("ready", flush=True)
    try:
        while not stop.is_set():
            with engine.begin() as conn:
                rows = conn.execute(pick).all()
                if rows:
                    acks = [
                        await js.publish_async(
                            args.subject, bytes(r.body), headers={"Nats-Msg-Id": r.message_id}
                        )
                        for r in rows
                    ]
                    await js.publish_async_completed()
                    for ack in acks:
                        ack.result()  # a failed publish raises: the rows stay, the txn rolls back
                    conn.execute(sa.delete(table).where(table.c.id.in_([r.id for r in rows])))
            if not rows:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), args.poll_ms / 1000)
    finally:
        await nc.close()
        engine.dispose()


async def consume(args: argparse.Namespace) -> None:
    import nats
    import redis
    from nats.errors import TimeoutError as NatsTimeout

    engine = sa.create_engine(args.db, pool_size=args.threads, max_overflow=0)
    meta = sa.MetaData()
    processed = sa.Table(args.processed, meta, autoload_with=engine)
    reservations = sa.Table(args.reservations, meta, autoload_with=engine)
    r = redis.Redis.from_url(args.redis, socket_timeout=2, socket_connect_timeout=2)
    nc = await nats.connect(args.nats)
    js = nc.jetstream(timeout=30)
    sub = await js.pull_subscribe(args.subject, durable=args.durable, stream=args.stream)
    stop = _stop_event()
    pool = ThreadPoolExecutor(args.threads)
    loop = asyncio.get_running_loop()

    def handle(message_id: str, body: bytes) -> None:
        if not r.set(f"{args.redis_prefix}{message_id}", 1, nx=True, ex=86400):
            return  # seen before: a duplicate
        order = json.loads(body)
        try:
            with engine.begin() as conn:
                conn.execute(sa.insert(processed).values(message_id=message_id))
                conn.execute(
                    sa.insert(reservations).values(
                        order_id=order["order_id"],
                        sku=order["sku"],
                        quantity=order["quantity"],
                        done_at=time.time(),
                    )
                )
        except IntegrityError:
            return  # processed before (Redis lost it): a duplicate
        except Exception:
            r.delete(f"{args.redis_prefix}{message_id}")  # let a redelivery run it
            raise

    async def one(msg: Any) -> None:
        mid = (msg.headers or {}).get("Nats-Msg-Id") or f"{msg.metadata.sequence.stream}"
        try:
            await loop.run_in_executor(pool, handle, mid, msg.data)
        except Exception as exc:  # redelivered after the ack wait
            print(f"handler failed: {exc}", file=sys.stderr, flush=True)
            await msg.nak(delay=1)
            return
        await msg.ack()

    print("ready", flush=True)
    try:
        while not stop.is_set():
            try:
                msgs = await sub.fetch(args.batch, timeout=0.5)
            except NatsTimeout:
                continue
            await asyncio.gather(*(one(m) for m in msgs))
    finally:
        pool.shutdown(wait=True)
        await nc.close()
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench._flow_baseline")
    p.add_argument("role", choices=("relay", "consume"))
    p.add_argument("--db", required=True)
    p.add_argument("--nats", required=True)
    p.add_argument("--subject", required=True)
    p.add_argument("--table", default="bench_flow_hw_outbox")
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--poll-ms", type=float, default=10.0)
    p.add_argument("--stream", default="")
    p.add_argument("--durable", default="bench-flow")
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    p.add_argument("--redis-prefix", default="bench:flow:processed:")
    p.add_argument("--processed", default="bench_flow_hw_processed")
    p.add_argument("--reservations", default="bench_flow_reservations")
    args = p.parse_args(argv)
    asyncio.run(relay(args) if args.role == "relay" else consume(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
