"""Flow suite: the main job end to end, orders per second from commit to confirmed, exactly
once, each of our cases beside its floor measured in the same run (PostgreSQL).

Real processes: the broker (`reliable broker start`, async flush, its native wire on), the
consumers (`reliable consume bench._flow_handlers:reserve`), NATS JetStream and the
hand-written relay and consumers (`bench._flow_baseline`); the writers are threads of the
bench process, one database connection each.

- publish: the business transaction alone (one order row) vs the same transaction with
  `Outbox.publish` (order + stub), the send following the commit inside `commit()` (the
  default) or handed to the outbox's background thread (`send_in_background=True`), at 1
  and 16 writers: commits/s, p50/p99 of `commit()` as the application sees it, and commit
  -> broker acknowledgement. The background case also waits, after its last commit, until
  every message is sent and recorded (`Outbox.flush`), and says how long that took.
- consume: the reservation row written bare (its own transaction) vs under the guard
  (Redis SET NX lease + confirmation row in the handler's transaction), 1, 4 and 16
  handler threads in one process; guarded with 1, 2 and 4 processes of 4 threads. Rate
  from the first reservation to the last (the processes are started, and consuming,
  before the messages are sent; start-up is not counted).
- flow: writers commit orders through the outbox, `reliable consume` processes reserve
  under the guard; orders/s from the first order's insert to the last reservation, and
  per order insert -> reservation (p50/p99). Checked: every order has exactly one
  reservation (`flow_exactly_once`). Against the floor (the same writers doing the order
  transaction and then the reservation transaction, no messaging) and the hand-written
  baseline (stub row in the business transaction, a relay polling it with SKIP LOCKED and
  publishing to NATS JetStream, a pull consumer checking Redis SET NX and writing a
  processed-id row in the handler's transaction), with the same writers, processes and
  threads.
- databases: the cases that apply elsewhere, on tables of their own, named
  `<database>_<case>`: on MariaDB (RELIABLE_BENCH_MARIADB) and a SQLite file, the order
  alone and with the stub at 1 and 16 writers; on MariaDB also the bare and the guarded
  handler at 4 threads and the floor and the whole flow (exactly once checked).
- resend: `ResendWorker` passes until nothing is due, over N stubs (1M; 20k with --quick)
  of which 1% are due (never sent: resent through the broker), 90% confirmed, 9%
  unconfirmed and not due; bulk-loaded inside PostgreSQL (INSERT ... SELECT
  generate_series). Its statements and rows per resent message are counted on the
  worker's engine, the stub table's scans from pg_stat_user_tables, and every distinct
  query is EXPLAINed (the scan nodes are printed).
- reconcile: `reliable reconcile --db ...` over the flow's tables after the run: wall time,
  Spark tasks, verdict.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import Options, Row, SuiteResult, format_table, percentiles_ms, progress
from bench._cpu_layers import OTHER, LayerSampler, Window

NAME = "flow"
DESCRIPTION = "orders per second from commit to confirmed, exactly once, vs the floor (PostgreSQL)"

REPO = Path(__file__).resolve().parents[1]
PG_URL = os.environ.get(
    "RELIABLE_BENCH_POSTGRES", "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("RELIABLE_BENCH_REDIS", "redis://127.0.0.1:6379/0")
MARIADB_URL = os.environ.get("RELIABLE_BENCH_MARIADB", "mysql+pymysql://root@127.0.0.1:3306/test")
# the `databases` step: what it runs on each database other than PostgreSQL. SQLite is
# one file a process writes at a time: its publish cases only
OTHER_DATABASES = {"mariadb": ("publish", "consume", "flow"), "sqlite": ("publish",)}
PUBLISH_WRITERS = (1, 16)
CONSUME_THREADS = (1, 4, 16)
CONSUME_PROCESSES = (1, 2, 4)
PROCESS_THREADS = 4  # handler threads of each process in the process-scaling cases
FLOW_WRITERS = 8
FLOW_PROCESSES = 2
FLOW_THREADS = 4
SEND_WINDOW = 500
START_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 180.0

# targets: (metric, comparison, threshold)
STUB_MAX_OVERHEAD = 0.15
GUARD_MAX_OVERHEAD = 0.25
FLOW_MIN_OF_FLOOR = 0.80
FLOW_MIN_OF_BASELINE = 1.5
SCALING_2 = 1.7
SCALING_4 = 3.0
SWEEP_MAX_S = 5.0
# the steps whose cases report their CPU by layer
SAMPLED = ("publish", "consume", "flow", "databases")


@dataclass(frozen=True)
class Counts:
    publish: int  # transactions per publish case
    consume: int  # messages per consume case
    flow: int  # orders per flow case
    sweep: int  # stubs in the resend sweep's table
    consume_cap_s: float  # a consume case ends this long after its first reservation
    consume_threads: tuple[int, ...] = CONSUME_THREADS  # handler threads, one process
    reconcile: bool = True  # the Spark reconciliation (a JVM start: ~10 s)


def counts(quick: bool) -> Counts:
    if quick:  # the plumbing and exactly-once, not figures: one thread count, no Spark
        return Counts(
            publish=150,
            consume=400,
            flow=200,
            sweep=20_000,
            consume_cap_s=5.0,
            consume_threads=(PROCESS_THREADS,),
            reconcile=False,
        )
    return Counts(publish=3000, consume=3000, flow=3000, sweep=1_000_000, consume_cap_s=60.0)


def layer_of(pid: int, name: str, cmdline: str) -> str:
    """The layer of the flow a process belongs to (`bench._cpu_layers`): the bench's own
    process holds the writers (and the sampler)."""
    if pid == os.getpid():
        return "bench"
    if name in ("postgres", "redis-server", "nats-server"):
        return name.removesuffix("-server")
    if name in ("mariadbd", "mysqld"):
        return "mariadb"
    if "reliable_cli broker" in cmdline:
        return "broker"
    if "reliable_cli consume" in cmdline:
        return "consumers"
    if "_flow_baseline relay" in cmdline:
        return "relay"
    if "_flow_baseline consume" in cmdline:
        return "hw_consumers"
    if name == "java":
        return "jvm"
    return OTHER


# --- the database


class Db:
    """The run's tables, named per run so that two runs never share a row."""

    def __init__(self, url: str, tag: str) -> None:
        import sqlalchemy as sa

        from outbox import OutboxTables

        self.url = url
        self.prefix = f"bf{tag}_"
        self.engine = sa.create_engine(url, pool_size=max(PUBLISH_WRITERS) + 2, max_overflow=4)
        self.tables = OutboxTables(prefix=self.prefix)
        md = self.tables.metadata
        self.orders = sa.Table(
            f"{self.prefix}orders",
            md,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("order_id", sa.String(64), nullable=False),
            sa.Column("sku", sa.String(32), nullable=False),
            sa.Column("quantity", sa.Integer, nullable=False),
            # time.time() at the insert: DOUBLE, since MariaDB's FLOAT is 4 bytes (a
            # resolution of minutes there)
            sa.Column("created_at", sa.Double, nullable=False),
        )
        self.reservations = sa.Table(
            f"{self.prefix}reservations",
            md,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("order_id", sa.String(64), nullable=False),  # not unique: see duplicates
            sa.Column("sku", sa.String(32), nullable=False),
            sa.Column("quantity", sa.Integer, nullable=False),
            sa.Column("done_at", sa.Double, nullable=False),
        )
        self.hw_outbox = sa.Table(
            f"{self.prefix}hw_outbox",
            md,
            sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
            sa.Column("message_id", sa.String(64), nullable=False),
            sa.Column("body", sa.LargeBinary, nullable=False),
        )
        self.hw_processed = sa.Table(
            f"{self.prefix}hw_processed",
            md,
            sa.Column("message_id", sa.String(64), primary_key=True),
        )
        md.create_all(self.engine)

    def new_reservations(self) -> Any:
        """A reservation table of its own (a `--quick` consume case's), created now and
        dropped with the others."""
        import sqlalchemy as sa

        self._extra = getattr(self, "_extra", 0) + 1
        table = sa.Table(
            f"{self.prefix}res{self._extra}",
            self.tables.metadata,
            *(sa.Column(c.name, c.type, primary_key=c.primary_key) for c in self.reservations.c),
        )
        table.create(self.engine)
        return table

    def clear(self) -> None:
        import sqlalchemy as sa

        with self.engine.begin() as conn:
            names = [
                t.name for t in (self.orders, self.reservations, self.hw_outbox, self.hw_processed)
            ]
            dialect = self.engine.dialect.name
            if dialect == "postgresql":
                conn.execute(sa.text(f"TRUNCATE {', '.join(names)}"))
            else:  # MariaDB truncates one table a statement, SQLite none
                verb = "DELETE FROM" if dialect == "sqlite" else "TRUNCATE"
                for name in names:
                    conn.execute(sa.text(f"{verb} {name}"))

    def count(self, table: Any) -> int:
        import sqlalchemy as sa

        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())

    def drop(self) -> None:
        self.tables.metadata.drop_all(self.engine)
        self.engine.dispose()


def order_body(order_id: str) -> bytes:
    return json.dumps({"order_id": order_id, "sku": "sku-1", "quantity": 1}).encode()


def order_row(order_id: str) -> dict[str, Any]:
    return {"order_id": order_id, "sku": "sku-1", "quantity": 1, "created_at": time.time()}


# --- writers


@dataclass
class Written:
    seconds: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds > 0 else 0.0


def write(
    engine: Any,
    writers: int,
    n: int,
    txn: Callable[[Any, str], None],
    after_commit: Callable[[str], None] | None = None,
) -> Written:
    """`n` transactions on `writers` threads, each `txn(session, order_id)` then commit
    (then `after_commit(order_id)`); every commit() timed, from the transaction's first
    statement (with the outbox it includes the send after the commit)."""
    from sqlalchemy.orm import Session

    numbers = itertools.count()
    lock = threading.Lock()
    latencies: list[float] = []
    errors: list[BaseException] = []
    run = uuid.uuid4().hex[:8]

    def worker() -> None:
        try:
            while True:
                with lock:
                    i = next(numbers)
                if i >= n:
                    return
                with Session(engine) as session:
                    start = time.perf_counter()
                    txn(session, f"{run}-{i}")
                    session.commit()
                    latencies.append(time.perf_counter() - start)
                if after_commit is not None:
                    after_commit(f"{run}-{i}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, name=f"writer-{k}") for k in range(writers)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    if errors:
        raise errors[0]
    return Written(seconds, latencies)


class TimedSender:
    """The producer, each acknowledgement timed against its order's commit: the message id
    is the order id, and the writers report each commit's end (`committed`). A send that
    runs inside `commit()` (the default publish) is timed from its own start instead, the
    moment that commit ended."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer
        self.acked: dict[str, float] = {}
        self.started: dict[str, float] = {}
        self.commits: dict[str, float] = {}

    def clear(self) -> None:
        self.acked.clear()
        self.started.clear()
        self.commits.clear()

    def committed(self, order_id: str) -> None:
        self.commits[order_id] = time.perf_counter()

    def send(self, message: Any) -> Any:
        self.started[message.message_id] = time.perf_counter()
        receipt = self.producer.send(message)
        self.acked[message.message_id] = time.perf_counter()
        return receipt

    def send_async(self, message: Any) -> Any:
        mid = message.message_id
        self.started[mid] = time.perf_counter()

        def acked(_: Any) -> None:
            self.acked[mid] = time.perf_counter()

        future = self.producer.send_async(message)
        future.add_done_callback(acked)
        return future

    def commit_to_ack(self) -> list[float]:
        out = []
        for mid, at in self.acked.items():
            start = self.commits.get(mid)
            if start is None or start > at:  # sent inside commit(): from the send's start
                start = self.started.get(mid, at)
            out.append(at - start)
        return out


# --- processes


_stopping: list[threading.Thread] = []  # processes told to stop, waited for in the background
_handed_over: set[int] = set()  # their pids: `processes` leaves them to those threads


def stop_in_background(procs: list[subprocess.Popen[str]]) -> threading.Thread:
    """SIGTERM `procs` and wait for them on a thread: a consumer's graceful stop waits for
    its receive long poll (seconds) and the next case need not. Only for processes with
    nothing left to do (their case's rows are all in): they write nothing meanwhile."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _handed_over.add(proc.pid)
    thread = threading.Thread(target=_reap, args=(procs,), daemon=True, name="reap")
    thread.start()
    _stopping.append(thread)
    return thread


def _reap(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def reap_all() -> None:
    """Wait until every process stopped in the background has exited."""
    while _stopping:
        _stopping.pop().join(60)


@contextmanager
def processes(
    argvs: list[list[str]],
    env: dict[str, str] | list[dict[str, str]],
    ready: str,
    what: str,
) -> Iterator[list[subprocess.Popen[str]]]:
    """Start every argv (with `env`, or its own of a list), wait for `ready` on each one's
    stdout, SIGTERM them on exit (unless `stop_in_background` was given them first)."""
    envs = env if isinstance(env, list) else [env] * len(argvs)
    base = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    procs: list[subprocess.Popen[str]] = []
    tails: list[collections.deque[str]] = []
    seen: list[threading.Event] = []

    def drain(
        proc: subprocess.Popen[str], tail: collections.deque[str], ev: threading.Event
    ) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line)
            if ready in line:
                ev.set()
        ev.set()

    try:
        for argv, own in zip(argvs, envs, strict=True):
            proc = subprocess.Popen(
                [sys.executable, *argv],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={**base, **own},
                cwd=REPO,
            )
            tail: collections.deque[str] = collections.deque(maxlen=30)
            ev = threading.Event()
            threading.Thread(target=drain, args=(proc, tail, ev), daemon=True).start()
            procs.append(proc)
            tails.append(tail)
            seen.append(ev)
        for proc, tail, ev in zip(procs, tails, seen, strict=True):
            if not ev.wait(START_TIMEOUT_S) or proc.poll() is not None:
                raise RuntimeError(f"{what} did not start: {''.join(tail)[-1500:]}")
        yield procs
    finally:
        procs = [proc for proc in procs if proc.pid not in _handed_over]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        _reap(procs)


@contextmanager
def _already(procs: list[subprocess.Popen[str]]) -> Iterator[list[subprocess.Popen[str]]]:
    """Consumers started beforehand: their owner stops them."""
    yield procs


def consumers(
    endpoint: str, db: Db, topic: str, group: str, mode: str, threads: int, count: int
) -> Any:
    argv, env = consumer(endpoint, db, topic, group, mode, threads)
    return processes([argv] * count, env, "consuming", f"reliable consume ({mode})")


def consumer(
    endpoint: str, db: Db, topic: str, group: str, mode: str, threads: int
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of one `reliable consume` process of a case."""
    env = {
        "FLOW_TOPIC": topic,
        "FLOW_GROUP": group,
        "FLOW_MODE": mode,
        "FLOW_THREADS": str(threads),
        "FLOW_DB": db.url,
        "FLOW_RESERVATIONS": db.reservations.name,
        "RELIABLE_DATABASE_URL": db.url,
        "RELIABLE_REDIS_URL": REDIS_URL,
        "RELIABLE_TABLE_PREFIX": db.prefix,
    }
    argv = ["-m", "reliable_cli", "consume", "bench._flow_handlers:reserve"]
    argv += ["--endpoint", endpoint]
    return argv, env


def wait_for(
    db: Db,
    table: Any,
    n: int,
    what: str,
    timeout_s: float = DRAIN_TIMEOUT_S,
    cap_s: float | None = None,
) -> int:
    """Wait until `table` holds `n` rows; with `cap_s`, at most that long after the first
    row (a rate needs no more). Returns the rows counted last."""
    deadline = time.monotonic() + timeout_s
    got = 0
    while time.monotonic() < deadline:
        got = db.count(table)
        if got >= n:
            return got
        if cap_s is not None and got:
            deadline = min(deadline, time.monotonic() + cap_s)
            cap_s = None
        time.sleep(0.05)
    if cap_s is None and got:
        return got
    raise RuntimeError(f"{what}: {got} of {n} within {timeout_s:.0f} s")


@dataclass
class Effects:
    orders: int
    effects: int
    wrong: int  # orders without exactly one reservation
    first_s: float  # first order insert (or first reservation when no orders)
    last_s: float  # last reservation
    latencies: list[float]  # per order: insert -> reservation

    @property
    def exactly_once(self) -> bool:
        return self.wrong == 0 and self.effects == self.orders

    def rate(self, n: int) -> float:
        span = self.last_s - self.first_s
        return n / span if span > 0 else 0.0


def effects(db: Db, reservations: Any = None) -> Effects:
    """One reservation per order? and the times, computed from the rows."""
    import sqlalchemy as sa

    o, r = db.orders, db.reservations if reservations is None else reservations
    with db.engine.connect() as conn:
        per = (
            sa.select(
                r.c.order_id, sa.func.count().label("n"), sa.func.min(r.c.done_at).label("done")
            )
            .group_by(r.c.order_id)
            .subquery()
        )
        rows = conn.execute(
            sa.select(o.c.created_at, per.c.n, per.c.done).select_from(
                o.outerjoin(per, per.c.order_id == o.c.order_id)
            )
        ).all()
        effects_n = int(conn.execute(sa.select(sa.func.count()).select_from(r)).scalar_one())
        last = conn.execute(sa.select(sa.func.max(r.c.done_at))).scalar_one() or 0.0
        first_done = conn.execute(sa.select(sa.func.min(r.c.done_at))).scalar_one() or 0.0
    wrong = sum(1 for row in rows if row.n != 1)
    lat = [row.done - row.created_at for row in rows if row.done is not None]
    first = min((row.created_at for row in rows), default=first_done)
    return Effects(len(rows), effects_n, wrong, first, last, lat)


# --- the cases


class Run:
    def __init__(self, opts: Options, result: SuiteResult) -> None:
        self.opts = opts
        self.n = counts(opts.quick)
        self.result = result
        self.m = result.metrics
        self.tag = f"{os.getpid()}"
        self.seq = itertools.count()
        self.layers: LayerSampler | None = None  # set by `run` for the steps

    def cost(self, t0: float, t1: float) -> Window | None:
        """What the machine spent, layer by layer, between two time.time() stamps."""
        return None if self.layers is None else self.layers.window(t0, t1)

    def record_cost(self, key: str, window: Window | None, units: int) -> tuple[float | None, str]:
        """`<key>_cpu_us` (layer -> CPU µs per unit) and `<key>_machine_busy` in the
        metrics; returns the machine's CPU µs per unit (the row's CPU column) and the note's
        words."""
        if window is None or units <= 0:
            self.m[f"{key}_cpu_us"] = None
            self.m[f"{key}_machine_busy"] = None
            return None, ""
        self.m[f"{key}_cpu_us"] = window.per_unit_us(units)  # type: ignore[assignment]
        self.m[f"{key}_machine_busy"] = window.busy
        case = key
        for label in OTHER_DATABASES:  # another database's case: its kind after the prefix
            case = case.removeprefix(f"{label}_")
        unit = (
            "commit"
            if case.startswith("publish")
            else "order"
            if case.startswith("flow")
            else "msg"
        )
        return window.total_s / units * 1e6, window.describe(units, unit)

    def name(self, what: str) -> str:
        return f"bench-flow-{self.tag}-{what}-{next(self.seq)}"

    def row(self, name: str, rate: float, note: str, cpu_us: float | None = None) -> None:
        self.result.rows.append(Row(name, rate, 0.0, note, cpu_us=cpu_us))
        progress(f"{name}: {rate:,.0f}/s  {note}")

    # publish ------------------------------------------------------------------------
    def publish(self, db: Db, producer: Any, prefix: str = "") -> None:
        """The publish cases; `prefix` (`mariadb_`, `sqlite_`): another database's, the
        order alone and with the stub only, every key and row named with the prefix."""
        from outbox import Outbox, OutboxConfig
        from reliable import Message

        sender = TimedSender(producer)
        configs = {
            "with_stub": OutboxConfig(),
            "with_stub_background": OutboxConfig(send_in_background=True),
            # the stub's INSERT and nothing else (the resend worker would send): what any
            # send after the commit stands on, so what limits the two above
            "stub_insert_only": OutboxConfig(send_after_commit=False),
        }
        outboxes = {
            case: Outbox(db.tables, sender, config=config)
            for case, config in configs.items()
            if not prefix or case == "with_stub"
        }
        topic = self.name("publish")

        def alone(session: Any, order_id: str) -> None:
            session.execute(db.orders.insert().values(**order_row(order_id)))

        def through(outbox: Any) -> Callable[[Any, str], None]:
            def with_stub(session: Any, order_id: str) -> None:
                session.execute(db.orders.insert().values(**order_row(order_id)))
                message = Message(topic=topic, body=order_body(order_id), message_id=order_id)
                outbox.publish(session, message)

            return with_stub

        cases: list[tuple[str, Callable[[Any, str], None], Any]] = [("txn_alone", alone, None)]
        cases += [(case, through(outbox), outbox) for case, outbox in outboxes.items()]
        for _, txn, outbox in cases[1:]:  # warm-up: connections, routes, the wire
            write(db.engine, 4, 40, txn)
            outbox.flush(30)
        for writers in PUBLISH_WRITERS:
            for case, txn, outbox in cases:
                sender.clear()
                t0 = time.time()
                w = write(db.engine, writers, self.n.publish, txn, after_commit=sender.committed)
                t1 = time.time()
                drained = time.perf_counter()
                if outbox is not None and not outbox.flush(DRAIN_TIMEOUT_S):
                    self.result.errors.append(f"publish {case}: sends not drained")
                drain_ms = (time.perf_counter() - drained) * 1000
                p50, p99 = percentiles_ms(w.latencies)
                key = f"{prefix}publish_{case}_w{writers}"
                self.m[f"{key}_commits_s"] = round(w.rate, 1)
                self.m[f"{key}_p50_ms"] = p50
                self.m[f"{key}_p99_ms"] = p99
                note = f"{writers} writer(s); commit() p50 {p50:.2f} ms, p99 {p99:.2f} ms"
                if case == "stub_insert_only":
                    note += "; nothing sent (send_after_commit=False)"
                elif outbox is not None:
                    a50, a99 = percentiles_ms(sender.commit_to_ack())
                    self.m[f"{key}_ack_p50_ms"] = a50
                    self.m[f"{key}_ack_p99_ms"] = a99
                    note += f"; commit->ack p50 {a50:.2f} ms, p99 {a99:.2f} ms"
                    if case == "with_stub_background":
                        left = outbox.left_to_resend_worker
                        self.m[f"{key}_drain_ms"] = round(drain_ms, 1)
                        self.m[f"{key}_left_to_worker"] = left
                        note += f"; all sent {drain_ms:.0f} ms after the last commit"
                        note += f", {left} left to the resend worker" if left else ""
                cpu, words = self.record_cost(key, self.cost(t0, t1), self.n.publish)
                self.row(f"{prefix}publish_{case} x{writers}", w.rate, f"{note}; {words}", cpu)
        for outbox in outboxes.values():
            outbox.close(30)
        db.clear()
        # the agreed figures: at 16 writers (the concurrent case), the default publish
        hi = max(PUBLISH_WRITERS)
        m, p = self.m, prefix
        m[f"{p}publish_txn_alone_commits_s"] = m[f"{p}publish_txn_alone_w{hi}_commits_s"]
        tags = {
            "with_stub": "stub",
            "with_stub_background": "stub_background",
            "stub_insert_only": "stub_insert_only",
        }
        for case in outboxes:
            tag = tags[case]
            m[f"{p}publish_{case}_commits_s"] = m[f"{p}publish_{case}_w{hi}_commits_s"]
            m[f"{p}publish_{tag}_overhead"] = overhead(
                m[f"{p}publish_txn_alone_commits_s"], m[f"{p}publish_{case}_commits_s"]
            )
            for nw in PUBLISH_WRITERS:
                m[f"{p}publish_{tag}_overhead_w{nw}"] = overhead(
                    m[f"{p}publish_txn_alone_w{nw}_commits_s"],
                    m[f"{p}publish_{case}_w{nw}_commits_s"],
                )
                a = m[f"{p}publish_txn_alone_w{nw}_p50_ms"]
                s = m[f"{p}publish_{case}_w{nw}_p50_ms"]
                m[f"{p}publish_{tag}_latency_overhead_w{nw}"] = (
                    round(s / a - 1, 3)
                    if isinstance(a, float) and a > 0 and isinstance(s, float)
                    else None
                )

    # consume ------------------------------------------------------------------------
    def consume_case(
        self,
        db: Db,
        endpoint: str,
        producer: Any,
        mode: str,
        threads: int,
        procs: int,
        started: tuple[str, list[subprocess.Popen[str]], Any] | None = None,
    ) -> tuple[float, Window | None, int]:
        """One case: its rate, what the machine spent meanwhile and over how many rows;
        `started`: its topic, consumers already running and reservation table (--quick: the
        consumers serve several cases, each case writes its own table)."""
        from reliable import Message

        table = db.reservations
        if started is None:
            topic, group = self.new_case(db)
            db.clear()
        else:
            table = started[2]
        n = self.n.consume
        began = time.time()
        with (
            consumers(endpoint, db, topic, group, mode, threads, procs)
            if started is None
            else _already(started[1])
        ) as running:
            if started is not None:
                topic = started[0]
            ready = time.time()
            window: collections.deque[Any] = collections.deque()
            run = uuid.uuid4().hex[:8]
            for i in range(n):
                if len(window) >= SEND_WINDOW:
                    window.popleft().result()
                window.append(
                    producer.send_async(Message(topic=topic, body=order_body(f"{run}-{i}")))
                )
            for f in window:
                f.result()
            sent = time.time()
            got = wait_for(
                db,
                table,
                n,
                f"consume {mode} x{threads} threads x{procs}",
                cap_s=self.n.consume_cap_s,
            )
            if got >= n and started is None:
                stop_in_background(running)
            # else: messages left; stopped (before the next case clears the table) when the
            # context ends; or, --quick, the processes serve the next cases (own tables)
        e = effects(db, table)
        progress(
            f"  {mode} x{threads} thr x{procs}: ready after {ready - began:.1f} s, sent in "
            f"{sent - ready:.2f} s, first row {e.first_s - sent:+.2f} s after, last "
            f"{e.last_s - sent:+.2f} s after; {e.effects}/{n} rows"
        )
        # rows inserted since the first one, over the time since it (start-up not counted)
        if e.last_s <= e.first_s:
            return 0.0, None, 0
        return (
            (e.effects - 1) / (e.last_s - e.first_s),
            self.cost(e.first_s, e.last_s),
            e.effects - 1,
        )

    def consume_row(
        self,
        db: Db,
        endpoint: str,
        producer: Any,
        case: tuple[str, int, int],
        key: str,
        name: str,
        note: str = "1 process",
        started: tuple[str, list[subprocess.Popen[str]], Any] | None = None,
    ) -> float:
        """One consume case (mode, threads, processes) measured, its CPU recorded under
        `key` and its row added as `name`; its rate."""
        rate, window, units = self.consume_case(db, endpoint, producer, *case, started)
        cpu, words = self.record_cost(key, window, units)
        self.row(name, rate, f"{note}; {words}" if words else note, cpu)
        return rate

    def new_case(self, db: Db) -> tuple[str, str]:
        from outbox import declare_groups

        topic, group = self.name("consume"), self.name("group")
        declare_groups(db.engine, db.tables, topic, [group])
        return topic, group

    def consume(self, db: Db, endpoint: str, producer: Any) -> None:
        cases = [(mode, t, 1) for mode in ("bare", "guard") for t in self.n.consume_threads]
        cases += [
            ("guard", PROCESS_THREADS, p)
            for p in CONSUME_PROCESSES
            if not (p == 1 and PROCESS_THREADS in self.n.consume_threads)
        ]
        with ExitStack() as stack:
            started: dict[tuple[str, int, int], tuple[str, list[subprocess.Popen[str]], Any]] = {}
            every: list[subprocess.Popen[str]] = []
            if self.opts.quick:
                # every case's consumers started at once, idle until their case sends: the
                # starts overlap (seconds each on a busy machine), and one process serves
                # several cases (guard process k serves every case of more than k
                # processes), each case on its own topic and its own reservation table;
                # the figures of a quick run are not the point
                plan: list[tuple[tuple[str, int, int], str, str, Any]] = []
                for mode, threads, procs in cases:
                    topic, group = self.new_case(db)
                    plan.append(((mode, threads, procs), topic, group, db.new_reservations()))
                argvs: list[list[str]] = []
                envs: list[dict[str, str]] = []
                serving: list[list[tuple[str, int, int]]] = []
                for mode in ("bare", "guard"):
                    mine = [p for p in plan if p[0][0] == mode]
                    threads = mine[0][0][1] if mine else PROCESS_THREADS
                    for k in range(max((p[0][2] for p in mine), default=0)):
                        served = [p for p in mine if p[0][2] > k]
                        argv, env = consumer(endpoint, db, "-", "-", mode, threads)
                        env["FLOW_CASES"] = ",".join(f"{t}={g}={r.name}" for _, t, g, r in served)
                        argvs.append(argv)
                        envs.append(env)
                        serving.append([p[0] for p in served])
                every = stack.enter_context(
                    processes(argvs, envs, "consuming", "reliable consume (quick)")
                )
                for case, topic, _, table in plan:
                    procs_of = [pr for pr, cs in zip(every, serving, strict=True) if case in cs]
                    started[case] = (topic, procs_of, table)

            def measure(
                mode: str, threads: int, procs: int, key: str, name: str, note: str
            ) -> float:
                return self.consume_row(
                    db,
                    endpoint,
                    producer,
                    (mode, threads, procs),
                    key,
                    name,
                    note,
                    started.get((mode, threads, procs)),
                )

            for mode in ("bare", "guard"):
                for threads in self.n.consume_threads:
                    key = f"consume_{mode}_t{threads}"
                    rate = measure(
                        mode, threads, 1, key, f"consume_{mode} {threads} thr", "1 process"
                    )
                    self.m[f"{key}_msgs_s"] = round(rate, 1)
            scaling: dict[str, float] = {}
            busy: dict[str, float | None] = {}
            for procs in CONSUME_PROCESSES:
                if procs == 1 and PROCESS_THREADS in self.n.consume_threads:
                    rate = float(self.m[f"consume_guard_t{PROCESS_THREADS}_msgs_s"] or 0.0)
                    key = f"consume_guard_t{PROCESS_THREADS}"
                else:
                    key = f"consume_guard_p{procs}"
                    rate = measure(
                        "guard",
                        PROCESS_THREADS,
                        procs,
                        key,
                        f"consume_guard {procs} procs",
                        f"{PROCESS_THREADS} threads each",
                    )
                scaling[str(procs)] = round(rate, 1)
                busy[str(procs)] = self.m.get(f"{key}_machine_busy")  # type: ignore[assignment]
            if every:  # --quick: each case wrote its own table; nothing is counted after
                stop_in_background(every)
        self.m["consume_processes_scaling"] = scaling  # type: ignore[assignment]
        # how busy the whole machine was at 1, 2 and 4 processes: the limit of the scaling
        self.m["consume_processes_machine_busy"] = busy  # type: ignore[assignment]
        self.m["consume_bare_msgs_s"] = self.m["consume_bare_t4_msgs_s"]
        self.m["consume_guard_msgs_s"] = self.m["consume_guard_t4_msgs_s"]
        self.m["consume_guard_overhead"] = overhead(
            self.m["consume_bare_msgs_s"], self.m["consume_guard_msgs_s"]
        )

    # the whole flow ------------------------------------------------------------------
    def flow(self, db: Db, endpoint: str, producer: Any, workdir: Path, prefix: str = "") -> None:
        """The floor, ours and the baseline; `prefix` (`mariadb_`): another database's
        floor and ours (the baseline is PostgreSQL's), keys and rows named with it."""
        from outbox import Outbox, declare_groups
        from reliable import Message

        n = self.n.flow
        # the consume cases' processes, stopped in the background, are gone first: their
        # exit must not take the CPU of the floor's case (the CPU by layer showed it)
        reap_all()
        # the floor: both transactions, no messaging: the writers commit orders, as many
        # threads as the consumers have commit reservations, handed over in memory
        db.clear()
        handed: queue.Queue[str | None] = queue.Queue()

        def order_only(session: Any, order_id: str) -> None:
            session.execute(db.orders.insert().values(**order_row(order_id)))

        def reserver() -> None:
            from sqlalchemy.orm import Session

            while (order_id := handed.get()) is not None:
                with Session(db.engine) as session, session.begin():
                    session.execute(
                        db.reservations.insert().values(
                            order_id=order_id, sku="sku-1", quantity=1, done_at=time.time()
                        )
                    )

        reservers = [
            threading.Thread(target=reserver, name=f"reserver-{k}")
            for k in range(FLOW_PROCESSES * FLOW_THREADS)
        ]
        for t in reservers:
            t.start()
        try:
            write(db.engine, FLOW_WRITERS, n, order_only, after_commit=handed.put)
        finally:
            for _ in reservers:
                handed.put(None)
            for t in reservers:
                t.join()
        e = effects(db)
        floor_rate = e.rate(n)
        self.m[f"{prefix}flow_floor_orders_s"] = round(floor_rate, 1)
        self.m[f"{prefix}flow_floor_exactly_once"] = e.exactly_once
        cpu, words = self.record_cost(f"{prefix}flow_floor", self.cost(e.first_s, e.last_s), n)
        self.row(
            f"{prefix}flow_floor",
            floor_rate,
            f"{FLOW_WRITERS} writers commit orders, {FLOW_PROCESSES * FLOW_THREADS} threads "
            f"commit reservations (handed over in memory); {words}",
            cpu,
        )

        # ours
        db.clear()
        topic, group = self.name("flow"), self.name("group")
        declare_groups(db.engine, db.tables, topic, [group])
        outbox = Outbox(db.tables, producer)

        def ours(session: Any, order_id: str) -> None:
            session.execute(db.orders.insert().values(**order_row(order_id)))
            outbox.publish(session, Message(topic=topic, body=order_body(order_id)))

        with consumers(endpoint, db, topic, group, "guard", FLOW_THREADS, FLOW_PROCESSES):
            write(db.engine, FLOW_WRITERS, n, ours)
            wait_for(db, db.reservations, n, "flow")
            time.sleep(0.5)  # a duplicate arriving late would show
        # counted once the consumers have stopped: a duplicate written while they finish
        # what they hold would show
        e = effects(db)
        rate = e.rate(n)
        p50, p99 = percentiles_ms(e.latencies)
        confirmed = self.stubs_confirmed(db, topic)
        self.m[f"{prefix}flow_orders_s"] = round(rate, 1)
        self.m[f"{prefix}flow_exactly_once"] = e.exactly_once
        self.m[f"{prefix}flow_latency_p50_ms"] = p50
        self.m[f"{prefix}flow_latency_p99_ms"] = p99
        self.m[f"{prefix}flow_stubs_confirmed"] = confirmed
        cpu, words = self.record_cost(f"{prefix}flow", self.cost(e.first_s, e.last_s), n)
        self.row(
            f"{prefix}flow_ours",
            rate,
            f"{FLOW_WRITERS} writers, {FLOW_PROCESSES} consume procs x {FLOW_THREADS} threads; "
            f"order->reservation p50 {p50:.1f} ms, p99 {p99:.1f} ms; "
            f"{'exactly once' if e.exactly_once else f'NOT exactly once: {e.wrong} orders wrong'}"
            f", {confirmed}/{n} stubs CONFIRMED; {words}",
            cpu,
        )
        if not e.exactly_once:
            self.result.errors.append(
                f"{prefix}flow: {e.wrong} of {e.orders} orders without exactly one reservation "
                f"({e.effects} reservations)"
            )
        self.m[f"{prefix}flow_commits"] = n
        if not prefix:
            self.baseline(db, workdir)

    # the other databases ---------------------------------------------------------
    def databases(self, endpoint: str, producer: Any, workdir: Path) -> None:
        """MariaDB's and SQLite's cases (OTHER_DATABASES), each on tables of its own and
        named `<database>_<case>`: publish (the order alone, with the stub), MariaDB's
        bare and guarded handler at 4 threads and its floor and flow. A database that
        cannot be reached is noted (`<database>_error`), not a failure of the run."""
        for label, steps in OTHER_DATABASES.items():
            url = MARIADB_URL if label == "mariadb" else f"sqlite:///{workdir / 'flow.db'}"
            prefix = f"{label}_"
            try:
                db = Db(url, self.tag)
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}".strip()[:300]
                progress(f"{label} not measured: {why}")
                self.m[f"{label}_error"] = why
                continue
            try:
                progress(f"{label}: tables {db.prefix}* on {url.rsplit('@', 1)[-1]}")
                if "publish" in steps:
                    self.publish(db, producer, prefix)
                if "consume" in steps:
                    self.consume_pair(db, endpoint, producer, prefix)
                if "flow" in steps:
                    reap_all()
                    self.flow(db, endpoint, producer, workdir, prefix)
            finally:
                reap_all()
                db.drop()

    def consume_pair(self, db: Db, endpoint: str, producer: Any, prefix: str) -> None:
        """The bare and the guarded handler at PROCESS_THREADS threads, one process each."""
        threads = PROCESS_THREADS
        for mode in ("bare", "guard"):
            key = f"{prefix}consume_{mode}_t{threads}"
            name = f"{prefix}consume_{mode} {threads} thr"
            rate = self.consume_row(db, endpoint, producer, (mode, threads, 1), key, name)
            self.m[f"{key}_msgs_s"] = round(rate, 1)
        self.m[f"{prefix}consume_guard_overhead"] = overhead(
            self.m[f"{prefix}consume_bare_t{threads}_msgs_s"],
            self.m[f"{prefix}consume_guard_t{threads}_msgs_s"],
        )

    def stubs_confirmed(self, db: Db, topic: str) -> int:
        import sqlalchemy as sa

        s = db.tables.stub
        with db.engine.connect() as conn:
            return int(
                conn.execute(
                    sa.select(sa.func.count()).where(s.c.topic == topic, s.c.status == "CONFIRMED")
                ).scalar_one()
            )

    def baseline(self, db: Db, workdir: Path) -> None:
        from bench import peers

        n = self.n.flow
        db.clear()
        self.m["flow_baseline_orders_s"] = None
        self.m["flow_baseline_exactly_once"] = None
        try:
            with peers.running(peers.NATS, workdir) as how, ExitStack() as stack:
                progress(f"NATS JetStream ({how})")
                nats_url = f"nats://{peers.NATS.host}:{peers.NATS.port}"
                stream, subject = f"BENCHFLOW{self.tag}", f"bench.flow.{self.tag}"
                stack.callback(nats_stream, nats_url, stream, subject, delete=True)
                nats_stream(nats_url, stream, subject)
                common = ["--db", db.url, "--nats", nats_url, "--subject", subject]
                relay = [
                    "-m",
                    "bench._flow_baseline",
                    "relay",
                    *common,
                    "--table",
                    db.hw_outbox.name,
                ]
                consume = [
                    "-m",
                    "bench._flow_baseline",
                    "consume",
                    *common,
                    "--stream",
                    stream,
                    "--durable",
                    f"bench-flow-{self.tag}",
                    "--threads",
                    str(FLOW_THREADS),
                    "--batch",
                    str(FLOW_THREADS * 8),
                    "--redis",
                    REDIS_URL,
                    "--redis-prefix",
                    f"bench:flow:{self.tag}:",
                    "--processed",
                    db.hw_processed.name,
                    "--reservations",
                    db.reservations.name,
                ]
                stack.enter_context(processes([relay], {}, "ready", "baseline relay"))
                stack.enter_context(
                    processes([consume] * FLOW_PROCESSES, {}, "ready", "baseline consumer")
                )

                def handwritten(session: Any, order_id: str) -> None:
                    session.execute(db.orders.insert().values(**order_row(order_id)))
                    session.execute(
                        db.hw_outbox.insert().values(
                            message_id=uuid.uuid4().hex, body=order_body(order_id)
                        )
                    )

                write(db.engine, FLOW_WRITERS, n, handwritten)
                wait_for(db, db.reservations, n, "baseline flow")
                time.sleep(0.5)
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            progress(f"baseline not measured: {why}")
            self.m["flow_baseline_error"] = why[:500]
            self.result.rows.append(
                Row("flow_baseline", 0.0, 0.0, f"not measured: {why}"[:120], missing=True)
            )
            return
        e = effects(db)
        rate = e.rate(n)
        p50, p99 = percentiles_ms(e.latencies)
        self.m["flow_baseline_orders_s"] = round(rate, 1)
        self.m["flow_baseline_exactly_once"] = e.exactly_once
        self.m["flow_baseline_latency_p50_ms"] = p50
        self.m["flow_baseline_latency_p99_ms"] = p99
        cpu, words = self.record_cost("flow_baseline", self.cost(e.first_s, e.last_s), n)
        self.row(
            "flow_baseline",
            rate,
            "stub row + SKIP LOCKED relay (poll 10 ms) -> NATS JetStream -> pull consumer, "
            f"Redis SET NX + processed-id row; p50 {p50:.1f} ms, p99 {p99:.1f} ms; "
            f"{'exactly once' if e.exactly_once else f'{e.wrong} orders wrong'}; {words}",
            cpu,
        )

    # resend sweep -------------------------------------------------------------------
    def sweep(self, producer: Any) -> None:
        from bench._flow_sweep import sweep

        rows, notes, metrics = sweep(PG_URL, f"bfs{self.tag}_", self.n.sweep, producer)
        self.result.rows.extend(rows)
        self.result.notes.extend(notes)
        self.m.update(metrics)

    # reconciliation ------------------------------------------------------------------
    def no_reconcile(self) -> None:
        self.m["reconcile_s"] = None
        self.m["reconcile_tasks"] = None
        self.result.notes.append("reconcile: not run with --quick (a JVM start)")

    def reconcile(self, db: Db) -> None:
        self.m["reconcile_s"] = None
        self.m["reconcile_tasks"] = None
        argv = [sys.executable, "-m", "reliable_cli", "reconcile", "--db", db.url]
        argv += ["--prefix", db.prefix, "--json"]
        start = time.perf_counter()
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=REPO,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
        seconds = time.perf_counter() - start
        doc: dict[str, Any] = {}
        text = proc.stdout.strip()
        for candidate in (text, *reversed(text.splitlines())):
            try:
                doc = json.loads(candidate)
                break
            except ValueError:
                continue
        if proc.returncode not in (0, 3, 5) or not doc:
            why = f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
            self.result.rows.append(
                Row("reconcile", 0.0, 0.0, f"failed: {why}"[:160], missing=True)
            )
            self.m["reconcile_error"] = why
            return
        tasks = find_key(doc, "tasks")
        stubs = find_key(doc, "stubs")
        if isinstance(stubs, dict):
            stubs = ", ".join(f"{k} {v}" for k, v in stubs.items() if v)
        self.m["reconcile_s"] = round(seconds, 2)
        self.m["reconcile_tasks"] = tasks if isinstance(tasks, int) else None
        self.m["reconcile_exit"] = proc.returncode
        self.row(
            "reconcile",
            0.0,
            f"{seconds:.1f} s wall (JVM start included), {tasks} Spark tasks, exit "
            f"{proc.returncode}; stubs {stubs}",
        )
        self.result.rows[-1].missing = True


def find_key(doc: Any, key: str) -> Any:
    if isinstance(doc, dict):
        if key in doc:
            return doc[key]
        for v in doc.values():
            found = find_key(v, key)
            if found is not None:
                return found
    return None


def nats_stream(url: str, stream: str, subject: str, delete: bool = False) -> None:
    import asyncio

    import nats
    from nats.js.api import StorageType

    async def go() -> None:
        nc = await nats.connect(url, connect_timeout=5, allow_reconnect=False)
        try:
            js = nc.jetstream(timeout=30)
            if delete:
                await js.delete_stream(stream)
            else:
                await js.add_stream(name=stream, subjects=[subject], storage=StorageType.FILE)
        finally:
            await nc.close()

    asyncio.run(go())


def overhead(floor: Any, ours: Any) -> float | None:
    """The fraction of the floor's rate lost: 1 - ours / floor."""
    if not isinstance(floor, int | float) or not isinstance(ours, int | float) or floor <= 0:
        return None
    return round(1 - ours / floor, 3)


def verdicts(m: dict[str, Any]) -> list[tuple[str, bool | None, str]]:
    """The targets as (name, met, the figures)."""

    def le(x: Any, limit: float) -> bool | None:
        return None if x is None else bool(x <= limit)

    def ge(x: Any, limit: float) -> bool | None:
        return None if x is None else bool(x >= limit)

    def ratio(a: Any, b: Any) -> float | None:
        return (
            round(a / b, 2)
            if isinstance(a, int | float) and isinstance(b, int | float) and b
            else None
        )

    hi = max(PUBLISH_WRITERS)
    out: list[tuple[str, bool | None, str]] = []
    for tag, label in (("stub", ""), ("stub_background", ", send_in_background")):
        for w in PUBLISH_WRITERS:
            rate_o = m.get(f"publish_{tag}_overhead_w{w}")
            lat_o = m.get(f"publish_{tag}_latency_overhead_w{w}")
            met = (
                None
                if rate_o is None or lat_o is None
                else bool(rate_o <= STUB_MAX_OVERHEAD and lat_o <= STUB_MAX_OVERHEAD)
            )
            floor = m.get(f"publish_stub_insert_only_overhead_w{w}")
            floor_lat = m.get(f"publish_stub_insert_only_latency_overhead_w{w}")
            out.append(
                (
                    f"stub <= 15%{label} (x{w})",
                    met,
                    f"rate -{pct(rate_o)}, p50 latency +{pct(lat_o)}; the stub's INSERT "
                    f"alone, nothing sent: -{pct(floor)}, +{pct(floor_lat)}",
                )
            )
    g = m.get("consume_guard_overhead")
    # one process's threads share one interpreter: how much of a core it took says whether
    # the process or the machine was the limit
    proc_words = ""
    for mode in ("bare", "guard"):
        used = (m.get(f"consume_{mode}_t4_cpu_us") or {}).get("consumers")
        rate = m.get(f"consume_{mode}_t4_msgs_s")
        if isinstance(used, int | float) and isinstance(rate, int | float):
            busy = m.get(f"consume_{mode}_t4_machine_busy")
            proc_words += f"; {mode}'s process {used * rate / 1e6:.2f} of a core" + (
                f" (machine {pct(busy)} busy)" if busy is not None else ""
            )
    out.append(
        ("guard <= 25%, 4 thr", le(g, GUARD_MAX_OVERHEAD), f"throughput -{pct(g)}{proc_words}")
    )
    of_floor = ratio(m.get("flow_orders_s"), m.get("flow_floor_orders_s"))
    out.append(
        ("flow >= 80% floor", ge(of_floor, FLOW_MIN_OF_FLOOR), f"{pct(of_floor)} of the floor")
    )
    of_base = ratio(m.get("flow_orders_s"), m.get("flow_baseline_orders_s"))
    lat_better = None
    if (
        m.get("flow_baseline_latency_p50_ms") is not None
        and m.get("flow_latency_p50_ms") is not None
    ):
        lat_better = bool(
            m["flow_latency_p50_ms"] < m["flow_baseline_latency_p50_ms"]
            and m["flow_latency_p99_ms"] < m["flow_baseline_latency_p99_ms"]
        )
    per_order = [sum((m.get(f"{k}_cpu_us") or {}).values()) for k in ("flow", "flow_baseline")]
    cpu_words = (
        f"; CPU an order {per_order[0]:,.0f} vs {per_order[1]:,.0f} us" if all(per_order) else ""
    )
    met_base = (
        None
        if of_base is None
        else bool(of_base >= FLOW_MIN_OF_BASELINE and lat_better and m.get("flow_exactly_once"))
    )
    out.append(
        (
            "flow >= 1.5x baseline",
            met_base,
            f"{of_base}x; p50 {m.get('flow_latency_p50_ms')} vs "
            f"{m.get('flow_baseline_latency_p50_ms')} ms, p99 {m.get('flow_latency_p99_ms')} "
            f"vs {m.get('flow_baseline_latency_p99_ms')} ms{cpu_words}",
        )
    )
    out.append(
        ("flow exactly once", bool(m.get("flow_exactly_once")), "every order one reservation")
    )
    sc = m.get("consume_processes_scaling") or {}
    s2 = ratio(sc.get("2"), sc.get("1"))
    s4 = ratio(sc.get("4"), sc.get("1"))
    busy = m.get("consume_processes_machine_busy") or {}
    at = ", ".join(f"{p} {pct(b)}" for p, b in busy.items() if b is not None)
    busy_words = f"; machine busy at 1, 2, 4 processes: {at}" if at else ""
    out.append(("consume 2 procs >= 1.7x", ge(s2, SCALING_2), f"{s2}x{busy_words}"))
    out.append(("consume 4 procs >= 3x", ge(s4, SCALING_4), f"{s4}x{busy_words}"))
    sw = m.get("resend_sweep_1m_s") or m.get("resend_sweep_s")
    only_due = m.get("resend_sweep_only_due")
    out.append(
        (
            "resend sweep < 5 s",
            None if sw is None else bool(sw < SWEEP_MAX_S and only_due),
            f"{sw} s over {m.get('resend_sweep_stubs')} stubs; only due rows: {only_due}",
        )
    )
    del hi
    return out


def pct(x: Any) -> str:
    return "-" if x is None else f"{x * 100:.0f}%"


def run(opts: Options) -> SuiteResult:
    import redis

    from bench.grpc import broker_server
    from reliable import Producer

    workdir = opts.workdir or Path.cwd()
    result = SuiteResult()
    r = Run(opts, result)
    redis.Redis.from_url(REDIS_URL, socket_timeout=2).ping()  # missing: fail at once
    db = Db(PG_URL, r.tag)
    home = workdir / "home"
    home.mkdir(exist_ok=True)
    try:
        with broker_server(workdir / "store", home) as endpoint:
            producer = Producer("grpc", endpoint=endpoint).start()
            try:
                progress(f"broker on {endpoint}; tables {db.prefix}*")
                steps: list[tuple[str, Callable[[], None]]] = [
                    ("publish", lambda: r.publish(db, producer)),
                    ("consume", lambda: r.consume(db, endpoint, producer)),
                    ("flow", lambda: r.flow(db, endpoint, producer, workdir)),
                    ("databases", lambda: r.databases(endpoint, producer, workdir)),
                    ("reconcile", lambda: r.reconcile(db) if r.n.reconcile else r.no_reconcile()),
                    ("resend", lambda: r.sweep(producer)),
                ]
                for step, fn in steps:
                    if opts.only and not re.search(opts.only, step):
                        continue
                    began = time.perf_counter()
                    try:
                        # each case's CPU by layer, where a case reads it
                        with (
                            LayerSampler(layer_of) if step in SAMPLED else nullcontext() as r.layers
                        ):
                            fn()
                        progress(f"{step} done in {time.perf_counter() - began:.1f} s")
                    except Exception as exc:
                        result.errors.append(f"{step}: {type(exc).__name__}: {exc}"[:1000])
                        progress(f"{step} failed: {traceback.format_exc()}")
                    finally:
                        r.layers = None
            finally:
                producer.shutdown()
    finally:
        reap_all()
        db.drop()
    for name in AGREED:
        result.metrics.setdefault(name, None)
    for name, met, figures in verdicts(result.metrics):
        verdict = "-" if met is None else ("met" if met else "short")
        result.rows.append(Row(f"target: {name}", 0.0, 0.0, f"{verdict}: {figures}", missing=True))
    result.metrics["flow_exactly_once"] = bool(result.metrics.get("flow_exactly_once"))
    result.notes.append(
        f"PostgreSQL {PG_URL.rsplit('@', 1)[-1]}; Redis {REDIS_URL}; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; msgs/s column: commits/s, "
        "messages/s or orders/s"
    )
    return result


AGREED = (
    "publish_txn_alone_commits_s",
    "publish_with_stub_commits_s",
    "publish_stub_overhead",
    "consume_bare_msgs_s",
    "consume_guard_msgs_s",
    "consume_guard_overhead",
    "flow_orders_s",
    "flow_floor_orders_s",
    "flow_baseline_orders_s",
    "flow_exactly_once",
    "consume_processes_scaling",
    "resend_sweep_1m_s",
)


if __name__ == "__main__":
    print(format_table(DESCRIPTION, run(Options(quick="--quick" in sys.argv))))
