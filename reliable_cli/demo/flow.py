"""The order flow, end to end: publish through the outbox, consume idempotently, retry,
dead-letter, lose sends and resend them, then reconcile.

    summary = run_demo(DemoOptions(orders=200, seed=7), say=print)
    summary.unaccounted, summary.as_dict()

Counting (each figure is read from where the effect lives, not from the demo's intentions):

- published: committed `OrderCreated` stubs that carry a valid order (the stub table);
  poison: committed stubs whose body is not an order; rolled_back: transactions that
  rolled back (no order row, no stub).
- consumed_once: rows in the reservations table (one per order, its primary key), each
  with a confirmation row for the inventory group; the stock columns must agree with them,
  so a reservation applied twice shows as a mismatch.
- handler_runs: handler invocations (failures, retries and fenced attempts included).
- retried: messages the handler saw again after a failure (through the retry ladder).
- dead_lettered: stubs whose inventory consumption-log row carries the dead-letter mark,
  stamped by the `%DLQ%inventory` handler.
- resent: sends by the resend worker; dropped: sends the chaotic transport acknowledged
  and threw away; duplicated: sends it made twice.
- unaccounted: the reconciliation's verdict (stubs neither confirmed, in processing,
  backlogged, dead-lettered nor void); without reconciliation, stubs neither confirmed nor
  dead-lettered.
"""

from __future__ import annotations

import random
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
import tenacity

from idempotency import EventKind, GuardConfig, IdempotencyGuard
from outbox import Outbox, OutboxConfig, ResendPolicy, ResendWorker
from outbox.adapters import TransportOffsets
from reliable import Producer, connect
from reliable.naming import retry_topic
from reliable.transport import Transport

if TYPE_CHECKING:
    import redis
from reliable_cli.demo.faults import ChaoticSender, FaultPlan, FaultRates
from reliable_cli.demo.shop import GROUP, TOPIC, Inventory, Shop, counting_listener
from reliable_cli.demo.tally import (
    Summary,
    accounted,
    behind,
    check,
    count,
    unaccounted_in_db,
    unsettled,
)
from reliable_cli.errors import CommandError

# Short delay levels so retries finish in seconds (RocketMQ's 1s 5s 10s 30s 1m ... in
# production). Retry n waits at level 3 + n - 1: 200 ms, 300 ms, 500 ms, ...
DEMO_DELAY_LEVELS = "100ms 150ms 200ms 300ms 500ms 800ms 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s"
STORE_SIZES = {
    "mapped_file_size_commitlog": 16 << 20,
    "max_hash_slot_num": 25_000,
    "max_index_num": 100_000,
}
CONSUMER_SETTINGS = {
    "consume_from": "first",
    "rebalance_interval_s": 0.5,
    "heartbeat_interval_s": 0.5,
    "persist_offset_interval_s": 0.2,
    "pull_suspend_ms": 100,
    "consume_threads": 4,
    # gRPC (invisible-time) consumption: a killed consumer's messages come
    # back after 10 s (the server's usual minimum), not 30 s
    "invisible_ms": 10_000,
    "receive_long_poll_ms": 1_000,
}
INVISIBLE_S = 10.0  # CONSUMER_SETTINGS' invisible time


# the longest retry ladder the demo waits for (a remote broker's, e.g. RocketMQ's default
# 10 s 30 s 1 min ... for the demo's retries); a longer one is refused before publishing
MAX_LADDER_WAIT_S = 600.0


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.0f}s" if seconds == int(seconds) else f"{seconds:.1f}s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s" if rest else f"{minutes}m"


@dataclass
class DemoOptions:
    """What `reliable demo` runs."""

    orders: int = 200
    seed: int | None = None
    rates: FaultRates = field(default_factory=FaultRates)
    db_url: str | None = None  # None: a SQLite file beside the store
    redis_url: str = "redis://127.0.0.1:6379/0"
    endpoint: str | None = None  # host:port of a RocketMQ 5 gRPC endpoint; None: embedded
    store_dir: Path | None = None  # None: a temporary directory
    delay_levels: str = DEMO_DELAY_LEVELS
    max_reconsume_times: int = 3
    table_prefix: str = "demo_"
    resend_after_s: float = 1.0  # when the resend worker first looks at a sent stub
    reconcile: bool = True
    timeout_s: float = 180.0  # give up waiting for the flow to settle after this

    def check(self) -> None:
        self.rates.check()
        if self.orders < 1:
            raise ValueError("--orders must be at least 1")
        if not 1 <= self.max_reconsume_times <= 16:
            raise ValueError("--max-reconsume-times must be between 1 and 16")
        if self.rates.max_failures > self.max_reconsume_times:
            raise ValueError(
                "transient failures per message must not exceed "
                "--max-reconsume-times (they would end in the DLQ)"
            )
        if self.resend_after_s <= 0 or self.timeout_s <= 0:
            raise ValueError("--resend-after and --timeout must be positive")


class DemoFailed(CommandError):
    """The demo could not run (a service is unreachable, a bad option)."""


def run_demo(options: DemoOptions, say: Callable[[str], None] = print) -> Summary:
    """Run the whole flow; `say` receives progress lines and the reconciliation report."""
    options.check()
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(1 << 31)
    with _workdir(options.store_dir) as work:
        db_url = options.db_url or f"sqlite:///{work / 'shop.db'}"
        store = work if options.store_dir is not None else work / "store"
        return _Run(options, seed, db_url, store, say).run()


@contextmanager
def _workdir(store_dir: Path | None) -> Iterator[Path]:
    if store_dir is not None:
        store_dir.mkdir(parents=True, exist_ok=True)
        yield store_dir
        return
    with tempfile.TemporaryDirectory(prefix="reliable-demo-") as tmp:
        yield Path(tmp)


def run_names(endpoint: str | None) -> tuple[str, str]:
    """The topic and group of a run: `OrderCreated` and `inventory` in the embedded broker
    (a store of the run's own); against a served broker, which others share, names of the
    run's own (`demo-OrderCreated-<run>`, `demo-inventory-<run>`), never a user's topic or
    group, so its messages, offsets and dead letters touch nothing else."""
    if not endpoint:
        return TOPIC, GROUP
    run = uuid.uuid4().hex[:8]
    return f"demo-{TOPIC}-{run}", f"demo-{GROUP}-{run}"


class _Run:
    def __init__(
        self, options: DemoOptions, seed: int, db_url: str, store: Path, say: Callable[[str], None]
    ) -> None:
        self.o, self.seed, self.db_url, self.store, self.say = options, seed, db_url, store, say
        self.plan = FaultPlan.draw(seed, options.orders, options.rates)
        topic, group = run_names(options.endpoint)
        self.shop = Shop(options.table_prefix, topic=topic, group=group)
        self.summary = Summary(seed=seed, topic=topic, group=group)
        self.started = time.monotonic()
        self.queue_ends: dict[tuple[str, int], int] = {}  # read before the broker closes
        self.wait_s = options.timeout_s  # how long to wait to settle (see _wait_for_ladder)
        self.stock_per_sku = 10 * options.orders + 10

    # -- set-up ------------------------------------------------------------------------------
    def _engine(self) -> sa.Engine:
        from outbox.database import DatabaseUrlError, canonical_url, create_engine

        args: dict[str, Any] = {"pool_pre_ping": True}
        try:
            if canonical_url(self.db_url).get_backend_name() == "sqlite":
                args["connect_args"] = {"timeout": 30}
            engine = create_engine(self.db_url, **args)
        except DatabaseUrlError as exc:
            raise DemoFailed(f"--db {exc}") from None
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("select 1"))
        except sa.exc.OperationalError as exc:
            raise DemoFailed(f"database {engine.url!r} unreachable: {exc.orig}") from exc
        return engine

    def _redis(self) -> redis.Redis:
        import redis

        client = redis.Redis.from_url(self.o.redis_url, socket_timeout=2, socket_connect_timeout=2)
        try:
            client.ping()
        except redis.RedisError as exc:
            raise DemoFailed(f"Redis {self.o.redis_url} unreachable: {exc}") from exc
        return client

    def _transport(self) -> Transport:
        if self.o.endpoint:
            return connect("grpc", endpoint=self.o.endpoint)
        return connect(
            "embedded", store_dir=self.store, delay_levels=self.o.delay_levels, **STORE_SIZES
        )

    # -- the run -----------------------------------------------------------------------------
    def run(self) -> Summary:
        o, s = self.o, self.summary
        engine = self._engine()
        client = self._redis()
        where = (
            f"remote broker {o.endpoint}" if o.endpoint else f"embedded broker, store {self.store}"
        )
        self.say(
            f"demo: seed {self.seed}, {o.orders} orders; {where}; database "
            f"{engine.url.render_as_string(hide_password=True)}; Redis {o.redis_url}"
        )
        if o.endpoint:  # a shared broker: say which names are this run's
            self.say(
                f"demo: topic {self.shop.topic}, group {self.shop.group} (this run's own; "
                "the broker's other topics and groups are not touched)"
            )
        self.shop.create(engine, stock_per_sku=self.stock_per_sku)
        inventory = Inventory(self.shop, engine, self.plan.by_id())
        guard = IdempotencyGuard(
            engine,
            self.shop.tables,
            client,
            config=GuardConfig(
                key_prefix=f"demo:{uuid.uuid4().hex[:8]}:", lease=timedelta(seconds=30)
            ),
            on_event=counting_listener(inventory),
        )
        reserve, dead = inventory.handlers(
            guard, max_reconsume_times=o.max_reconsume_times, **CONSUMER_SETTINGS
        )
        transport = self._transport()
        transport.start()
        try:  # committed and queue offsets: the embedded broker, or a gRPC server that
            offsets: TransportOffsets | None = TransportOffsets(transport)  # answers them
        except TypeError:
            offsets = None
        consumers = [reserve.consumer(transport, client_id=f"inventory-{n}") for n in (1, 2)] + [
            dead.consumer(transport, client_id="inventory-dlq")
        ]
        stop = threading.Event()
        producer = Producer(transport).start()
        # the resend worker proves an acknowledged send lost by the group's committed offset;
        # where it cannot read offsets, a dropped send fails visibly instead
        sender = ChaoticSender(producer, transport, self.plan, queue_ends=offsets)
        outbox = Outbox(
            self.shop.tables,
            sender,
            config=OutboxConfig(
                resend_after=timedelta(seconds=o.resend_after_s),
                retry_after_failure=timedelta(seconds=o.resend_after_s),
            ),
        )
        resender = ResendWorker(
            engine,
            self.shop.tables,
            producer,
            offsets=offsets,
            bounds=offsets,
            policy=ResendPolicy(
                batch_size=100,
                backoff=tenacity.wait_fixed(2 * o.resend_after_s),
                recheck_after=timedelta(seconds=o.resend_after_s / 2),
                error_backoff=tenacity.wait_fixed(o.resend_after_s),
            ),
            name="demo-resend",
        )
        resend_thread = threading.Thread(
            target=resender.run,
            args=(stop,),
            kwargs={"interval": 0.3},
            name="resend-worker",
            daemon=True,
        )
        try:
            for c in consumers:
                c.start()
            self.wait_s = self._wait_for_ladder(transport)
            resend_thread.start()
            self._publish(engine, outbox, inventory, sender, resender)
            s.settled = self._settle(engine, inventory, sender, resender, offsets)
            self.queue_ends = self._queue_ends(offsets)  # bounds for the reconciliation
        finally:
            stop.set()
            if resend_thread.ident is not None:
                resend_thread.join(timeout=30)
            for c in consumers:
                with suppress(Exception):
                    c.shutdown()
            with suppress(Exception):
                producer.shutdown()
            transport.close()
            with suppress(Exception):
                client.close()
        s.handler_runs = inventory.runs
        s.retried = len(inventory.retried)
        s.dropped = len(sender.dropped)
        s.duplicated = len(sender.duplicated)
        s.duplicates_absorbed = guard.stats[EventKind.DUPLICATE]
        s.resent = resender.metrics.resent
        count(engine, self.shop, self.plan, s)
        if o.reconcile:
            self._reconcile()
        else:
            s.unaccounted = unaccounted_in_db(engine, self.shop)
        check(engine, self.shop, self.plan, s, initial=self.stock_per_sku)
        engine.dispose()
        s.elapsed_s = round(time.monotonic() - self.started, 1)
        return s

    def _publish(
        self,
        engine: sa.Engine,
        outbox: Outbox,
        inventory: Inventory,
        sender: ChaoticSender,
        resender: ResendWorker,
    ) -> None:
        step = max(1, self.o.orders // 5)
        for i, fate in enumerate(self.plan.fates, 1):
            quantity = 1 + (i % 3)
            if not self.shop.place_order(engine, outbox, fate, quantity):
                self.summary.rolled_back += 1
            if i % step == 0 or i == self.o.orders:
                self.say(self._progress(engine, inventory, sender, resender, f"placed {i}"))

    def _wait_for_ladder(self, transport: Transport) -> float:
        """How long to wait for the flow to settle, from the broker's retry ladder.

        A remote broker retries on its own ladder (the Settings reply's backoff policy):
        with RocketMQ's default a poison message reaches the DLQ after 10 s + 30 s + 1 min.
        The demo waits for that (said in one line), or stops before publishing when the
        ladder is too long to wait for, rather than call messages still on it lost."""
        o = self.o
        levels = list(transport.delay_levels_ms(self.shop.group))
        if not levels:
            return o.timeout_s
        # retry n waits at level 3 + n - 1 (the last level repeats past the end)
        waits = [levels[min(2 + n, len(levels) - 1)] for n in range(o.max_reconsume_times)]
        ladder_s = sum(waits) / 1000
        # plus a redelivery after the invisible time, the resend worker's look and slack
        needed = ladder_s * 1.2 + INVISIBLE_S + 4 * o.resend_after_s + 20
        if not o.endpoint and needed <= o.timeout_s:
            return o.timeout_s
        shown = ", ".join(_duration(w / 1000) for w in waits)
        if needed > MAX_LADDER_WAIT_S:
            raise DemoFailed(
                f"the broker's retry ladder waits {shown} for the demo's "
                f"{o.max_reconsume_times} retries ({_duration(ladder_s)} before a poison "
                f"message reaches the DLQ), longer than the demo will wait "
                f"({_duration(MAX_LADDER_WAIT_S)}); start the broker with "
                f'--delay-levels "{DEMO_DELAY_LEVELS.split(" 1s 1s")[0]} 1s" or lower '
                "--max-reconsume-times. Nothing was published."
            )
        wait_s = max(o.timeout_s, needed)
        self.say(
            f"retry ladder (the broker's delay levels): {shown} for retries 1-"
            f"{o.max_reconsume_times}; a poison message reaches the DLQ after about "
            f"{_duration(ladder_s)}; waiting up to {_duration(wait_s)} for the flow to "
            "settle"
        )
        return wait_s

    def _settle(
        self,
        engine: sa.Engine,
        inventory: Inventory,
        sender: ChaoticSender,
        resender: ResendWorker,
        offsets: TransportOffsets | None,
    ) -> bool:
        wait_s = self.wait_s
        deadline = time.monotonic() + wait_s
        expected = sum(1 for f in self.plan.fates if not f.rolled_back)
        next_line = 0.0
        last = ""
        while True:
            done = accounted(engine, self.shop) >= expected and self._drained(offsets)
            now = time.monotonic()
            if done or now >= deadline or now >= next_line:
                line = self._progress(
                    engine, inventory, sender, resender, "settled" if done else "waiting"
                )
                # a line a second while the counts move, else one every 10 s
                counts = line.partition("]")[2]
                if done or now >= deadline or counts != last or now >= next_line + 9.0:
                    self.say(line)
                    last, next_line = counts, now + 1.0
            if done:
                return True
            if now >= deadline:
                self.summary.problems.append(f"the flow did not settle within {wait_s:.0f} s")
                for line in unsettled(engine, self.shop, offsets):
                    self.say(line)
                return False
            time.sleep(0.2)

    def _queue_ends(self, offsets: TransportOffsets | None) -> dict[tuple[str, int], int]:
        """The broker's max offset of each queue (topic and retry topic), read before the
        transport closes: the reconciliation calls a stub beyond its queue's end lost."""
        ends: dict[tuple[str, int], int] = {}
        if offsets is None:
            return ends
        for topic in (self.shop.topic, retry_topic(self.shop.group)):
            for queue in range(8):
                end = offsets.max_offset(topic, queue)
                if end is not None:
                    ends[(topic, queue)] = end
        return ends

    def _drained(self, offsets: TransportOffsets | None) -> bool:
        """Every queue of the topic and of the group's retry topic consumed to its end (so
        late duplicates were delivered too); unknown on a remote broker: True."""
        return next(behind(offsets, self.shop.topic, self.shop.group), None) is None

    def _progress(
        self,
        engine: sa.Engine,
        inventory: Inventory,
        sender: ChaoticSender,
        resender: ResendWorker,
        what: str,
    ) -> str:
        with engine.connect() as conn:
            reserved = conn.execute(
                sa.select(sa.func.count()).select_from(self.shop.reservations)
            ).scalar_one()
        return (
            f"[{time.monotonic() - self.started:5.1f}s] {what:<11} consumed once "
            f"{reserved:>5}  handler runs {inventory.runs:>5}  retried "
            f"{len(inventory.retried):>4}  dead-lettered {len(inventory.dead_lettered):>3}"
            f"  dropped {len(sender.dropped):>3}  resent {resender.metrics.resent:>3}"
        )

    def _reconcile(self) -> None:
        from outbox.reconcile import ReconcileOptions, as_text, reconcile

        offsets_file = self.store / "config" / "consumerOffset.json"
        self.say("reconciliation (Spark, local[*]) ...")
        result = reconcile(
            ReconcileOptions(
                db_url=self.db_url,
                table_prefix=self.o.table_prefix,
                grace=timedelta(0),
                offsets=str(offsets_file)
                if not self.o.endpoint and offsets_file.exists()
                else None,
                queue_bounds=self.queue_ends or None,
                spark_conf={
                    "spark.ui.enabled": "false",
                    "spark.sql.shuffle.partitions": "4",
                    "spark.ui.showConsoleProgress": "false",
                },
            )
        )
        for line in as_text(result).splitlines():
            self.say(line)
        cert, s = result.summary.certificate, self.summary
        s.reconciled = True
        s.unaccounted = cert.unaccounted
        stubs = s.published + s.poison
        for name, theirs, ours in (
            ("produced", cert.produced, stubs),
            ("confirmed", cert.confirmed, s.consumed_once),
            ("dead-lettered", cert.dead_lettered, s.dead_lettered),
        ):
            if theirs != ours:
                s.problems.append(f"reconciliation counts {name} {theirs}, the demo {ours}")
        if cert.duplicated:
            s.problems.append(f"reconciliation found {cert.duplicated} duplicate confirmations")
