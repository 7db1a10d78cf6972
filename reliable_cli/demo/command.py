"""`reliable demo`: the project's main job, end to end, on embedded defaults.

An order service publishes `OrderCreated` through the transactional outbox; two inventory
consumers in one group reserve stock idempotently (Redis + database); some deliveries fail
and are retried through the delay levels; poison messages end in the dead-letter queue;
some sends are lost after the broker acknowledged them and the resend worker recovers
them; the Spark reconciliation then certifies that nothing is unaccounted for.

Needs the local Redis; uses a SQLite file and an embedded broker in a temporary directory
unless told otherwise. Exit codes: 0 everything accounted for, 3 unaccounted messages,
1 the counts do not add up, 4 a service is unreachable, 2 bad options.

`reliable demo --store-only` runs the storage-engine demonstration instead: it writes
messages into a store, restarts it, and finds them again by offset message id, by key, by
unique key, and by topic/queue/offset.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from broker.config import with_default_port
from reliable_cli.exit_codes import ExitCode

if TYPE_CHECKING:
    from reliable_cli import Subparsers


def _rate(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a rate is between 0 and 1, got {text}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "demo",
        help="run the end-to-end demo on embedded defaults",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--orders", type=int, default=200, help="orders to place (default 200)")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of every random choice (default: a new one, printed)",
    )
    p.add_argument(
        "--fail-rate",
        type=_rate,
        default=0.15,
        help="share of orders whose first 1-2 deliveries fail (default 0.15)",
    )
    p.add_argument(
        "--poison",
        type=_count,
        default=3,
        help="malformed messages that end in the DLQ (default 3)",
    )
    p.add_argument(
        "--drop-rate",
        type=_rate,
        default=0.05,
        help="share of sends lost after acknowledgement (default 0.05)",
    )
    p.add_argument(
        "--duplicate-rate",
        type=_rate,
        default=0.05,
        help="share of sends made twice (default 0.05)",
    )
    p.add_argument(
        "--rollback-rate",
        type=_rate,
        default=0.05,
        help="share of order transactions that roll back (default 0.05)",
    )
    p.add_argument(
        "--max-reconsume-times", type=int, default=3, help="retries before the DLQ (default 3)"
    )
    p.add_argument(
        "--delay-levels",
        default=None,
        metavar="TABLE",
        help="the delay-level table of the embedded broker (default: "
        "100ms .. 1s, so the demo takes seconds)",
    )
    p.add_argument(
        "--db",
        default=None,
        metavar="URL",
        help="SQLAlchemy URL, e.g. postgresql+psycopg2://u@host/db "
        "(default: a SQLite file in the work directory)",
    )
    p.add_argument(
        "--table-prefix",
        default="demo_",
        help="prefix of the demo's tables, dropped and created (default demo_)",
    )
    p.add_argument(
        "--redis",
        default="redis://127.0.0.1:6379/0",
        metavar="URL",
        help="Redis URL (default redis://127.0.0.1:6379/0)",
    )
    p.add_argument(
        "--endpoint",
        default=None,
        type=with_default_port,
        metavar="HOST:PORT",
        help="a remote broker (RocketMQ 5 gRPC) instead of the embedded one",
    )
    p.add_argument(
        "--store",
        type=Path,
        default=None,
        help="store directory (default: a new temporary directory)",
    )
    p.add_argument(
        "--no-reconcile",
        action="store_true",
        help="skip the Spark reconciliation (count from the database instead)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        help="seconds to wait for the flow to settle (default 180; longer when "
        "a remote broker's retry ladder needs it, which the demo says)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="progress on stderr; the summary as one JSON object on the last line",
    )
    p.add_argument(
        "--store-only",
        action="store_true",
        help="run the storage-engine demonstration instead of the order flow",
    )
    p.add_argument(
        "--messages", type=int, default=1000, help="--store-only: messages to write (default 1000)"
    )
    p.set_defaults(handler=run)


def _say(args: argparse.Namespace, text: str) -> None:
    print(text, file=sys.stderr if args.json else sys.stdout, flush=True)


def run(args: argparse.Namespace) -> int:
    if args.store_only:
        return run_store_demo(args)
    return run_order_flow(args)


def run_order_flow(args: argparse.Namespace) -> int:
    from reliable_cli.demo import DEMO_DELAY_LEVELS, DemoFailed, DemoOptions, FaultRates, run_demo

    try:
        options = DemoOptions(
            orders=args.orders,
            seed=args.seed,
            rates=FaultRates(
                fail=args.fail_rate,
                poison=args.poison,
                drop=args.drop_rate,
                duplicate=args.duplicate_rate,
                rollback=args.rollback_rate,
            ),
            db_url=args.db,
            redis_url=args.redis,
            endpoint=args.endpoint,
            store_dir=args.store,
            delay_levels=args.delay_levels or DEMO_DELAY_LEVELS,
            max_reconsume_times=args.max_reconsume_times,
            table_prefix=args.table_prefix,
            reconcile=not args.no_reconcile,
            timeout_s=args.timeout,
        )
        options.check()
    except ValueError as exc:
        print(f"reliable demo: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    if not args.verbose:  # the demo's failures are on purpose: keep their tracebacks out
        for name in ("reliable", "idempotency", "outbox", "py4j", "pyspark"):
            logging.getLogger(name).setLevel(logging.ERROR)
    try:
        summary = run_demo(options, say=lambda line: _say(args, line))
    except DemoFailed as exc:
        print(f"reliable demo: {exc}", file=sys.stderr)
        return ExitCode.UNAVAILABLE
    _say(args, "")
    for line in summary.lines():
        _say(args, line)
    for problem in summary.problems:
        print(f"reliable demo: {problem}", file=sys.stderr)
    if summary.unaccounted > 0:
        verdict, code = f"NOT CLEAN: {summary.unaccounted} unaccounted", ExitCode.UNACCOUNTED
    elif summary.problems:
        verdict, code = "FAILED: the counts do not add up", ExitCode.FAILURE
    else:
        verdict, code = "OK: every message accounted for, none processed twice", ExitCode.OK
    _say(args, f"{verdict} (seed {summary.seed}, {summary.elapsed_s} s)")
    if args.json:
        print(json.dumps(summary.as_dict()), flush=True)
    return code


def run_store_demo(args: argparse.Namespace) -> int:
    if args.messages < 1:
        print("reliable demo: --messages must be at least 1", file=sys.stderr)
        return ExitCode.USAGE
    if args.store is None:
        with tempfile.TemporaryDirectory(prefix="reliable-demo-") as tmp:
            return _store_demo(args, Path(tmp))
    return _store_demo(args, args.store)


def _store_demo(args: argparse.Namespace, store_dir: Path) -> int:
    from broker.store.config import FlushMode, StoreConfig
    from broker.store.message import Message
    from broker.store.store import MessageStore
    from protocol.props import Prop

    config = StoreConfig(
        store_dir=store_dir,
        mapped_file_size_commitlog=16 * 1024 * 1024,  # holds a 4 MiB body
        mapped_file_size_consume_queue=20 * 10_000,
        max_hash_slot_num=50_000,
        max_index_num=200_000,
        flush_mode=FlushMode.SYNC_FLUSH,
    )
    topic, queues = "OrderCreated", 4
    _say(args, f"store: {store_dir}")
    store = MessageStore(config)
    store.start()
    written: list[tuple[str, str, int]] = []  # (order key, unique key, commitlog offset)
    started = time.monotonic()
    for i in range(args.messages):
        order = f"order-{i:06d}"
        uniq = f"U{i:031d}"
        msg = Message(
            topic=topic,
            body=json.dumps({"order": order, "amount": i * 7 % 1000}).encode(),
            queue_id=i % queues,
            properties={
                Prop.KEYS: f"{order} customer-{i % 17}",
                Prop.TAGS: "created",
                Prop.UNIQ_KEY: uniq,
            },
        )
        result = store.put_message(msg)
        if not result.ok or result.append is None:
            print(f"reliable demo: put failed: {result.status.value}", file=sys.stderr)
            store.shutdown()
            return ExitCode.FAILURE
        written.append((order, uniq, result.append.wrote_offset))
        if (i + 1) % max(1, args.messages // 10) == 0:
            _say(args, f"  wrote {i + 1}/{args.messages}")
    elapsed = time.monotonic() - started
    store.wait_dispatched(10.0)
    store.shutdown()
    _say(args, f"wrote {len(written)} messages under SYNC_FLUSH in {elapsed:.2f}s; restarting")

    store = MessageStore(config)
    store.start()
    try:
        store.wait_dispatched(10.0)
        found = {"by_offset_id": 0, "by_key": 0, "by_unique_key": 0, "by_queue_offset": 0}
        for order, uniq, offset in written:
            by_offset = store.look_message_by_offset(offset)
            if by_offset is None:
                continue
            if store.look_message_by_msg_id(by_offset.offset_msg_id) is not None:
                found["by_offset_id"] += 1
            hits = store.query_message_by_key(topic, order)
            if len(hits) == 1 and hits[0].commitlog_offset == offset:
                found["by_key"] += 1
            by_uniq = store.query_message_by_unique_key(topic, uniq)
            if by_uniq is not None and by_uniq.commitlog_offset == offset:
                found["by_unique_key"] += 1
            again = store.get_message_by_queue_offset(
                topic, by_offset.queue_id, by_offset.queue_offset
            )
            if again is not None and again.commitlog_offset == offset:
                found["by_queue_offset"] += 1
        sample = store.look_message_by_offset(written[-1][2])
        if sample is not None:
            _say(
                args,
                f"example: {sample.offset_msg_id} keys={sample.keys} "
                f"queue={sample.queue_id}@{sample.queue_offset} body={sample.body.decode()}",
            )
        per_queue = {q: store.get_max_offset_in_queue(topic, q) for q in range(queues)}
    finally:
        store.shutdown()

    total = len(written)
    _say(args, "after restart, found:")
    for name, count in found.items():
        _say(args, f"  {name:<16} {count}/{total}")
    _say(args, f"  queue max offsets {per_queue}")
    clean = all(count == total for count in found.values())
    summary = {"written": total, **found, "missing": total - min(found.values())}
    if args.json:
        print(json.dumps(summary))
    else:
        print("OK: every message found by every lookup" if clean else "FAILED: messages missing")
    return ExitCode.OK if clean else ExitCode.FAILURE
