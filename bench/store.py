"""Store suite: put (async/sync flush), dispatch and read throughput beside a bare floor.

Cases (payload = message bodies; 1 MB = 1e6 bytes):

- floor_1k / floor_16k: a bare Python loop copying the very bytes of an encoded record
  (header + body + topic + properties) and a 20-byte consume-queue unit into two
  pre-touched file mappings: no encoding, no lock, no bookkeeping. The ceiling a Python
  store could reach on this machine, measured in the same run; the median of three runs.
- put_async_1k / put_async_16k: `MessageStore.put_message` from one thread, ASYNC_FLUSH
  (the reput thread dispatches concurrently, as in production). put_async_1k_batch: the
  same through `put_messages` in batches of 32. put_async_1k_batch_fast: the same
  messages through `put_batch` (one topic/queue a batch of 32, shared TAGS, KEYS per
  message), the RocketMQ MessageBatch path that a producer's `send_batch` takes; 5x the
  messages of the other put cases (it runs ~15x faster) and the median of three runs.
- put_batch, no dispatch thread: the same batches through `encode_batch` and
  `CommitLog.put_batch` with nothing else running, as the floor and "commitlog append"
  run. In one interpreter a put and the reput thread take turns (the GIL), and dispatch
  costs ~25x a batched put, so the case above shows the sustained rate and this one the
  put path's own.
- Every put case starts on a store whose first commitlog file is already pre-touched, and
  each case's files are deleted before the next case starts.
- put_sync_{1,8,64}: SYNC_FLUSH, that many producer threads each putting 1 KiB messages
  back to back; every put returns after its group-commit fsync. msgs/fsync = acknowledged
  messages / fsync calls.
- commitlog append: `CommitLog.append` alone (encode, lock, copy; no facade, no dispatch
  thread competing for the interpreter), to show where put time goes. Its file is
  pre-touched first, as the floor's is.
- dispatch: the reput service building consume queues and index (one key + a unique key a
  message) over those records, already in the commitlog.
- read: `get_messages` in batches of 32 by queue offset, the consumer's path.
"""

from __future__ import annotations

import itertools
import mmap
import os
import shutil
import threading
import time
from pathlib import Path

from bench._common import Measured, Options, Row, SuiteResult, progress, timed
from broker.store.codec import encode_host, encode_record
from broker.store.commitlog import CommitLog
from broker.store.config import FlushMode, StoreConfig
from broker.store.consume_queue_store import ConsumeQueueStore
from broker.store.dispatcher import ReputService
from broker.store.index_service import IndexService
from broker.store.message import Message
from protocol.props import Prop

DESCRIPTION = "commitlog put / dispatch / read vs a bare mmap floor"

TOPIC = "BenchTopic"
QUEUES = 4
KIB = 1024
MIB = 1024 * 1024


class Budget:
    """How much each case may do: a message count and a time limit, whichever comes first."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.floor_records = 200_000 if quick else 2_000_000
        self.put_1k = 40_000 if quick else 400_000
        # put_batch runs ~15x faster: a count that keeps its window near the floor's
        self.put_batch_1k = 200_000 if quick else 1_000_000
        self.repeats = 3  # the floor and put_batch: the median of three runs
        self.put_16k = 3_000 if quick else 30_000
        self.seconds = 2.0 if quick else 8.0
        self.sync_seconds = 1.5 if quick else 5.0
        self.dispatch = 20_000 if quick else 200_000
        self.commitlog_file = 128 * MIB if quick else 512 * MIB


def _body(size: int) -> bytes:
    return os.urandom(size)


def _message(body: bytes, i: int) -> Message:
    return Message(
        TOPIC, body, queue_id=i % QUEUES, properties={Prop.KEYS: f"order-{i}", Prop.TAGS: "bench"}
    )


# --- floor ------------------------------------------------------------------------------
def _pretouched(path: Path, size: int) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    zeros = bytes(MIB)
    for pos in range(0, size, MIB):
        mm[pos : pos + MIB] = zeros[: size - pos]
    return mm


def floor(workdir: Path, body_size: int, records: int, file_size: int) -> Measured:
    """Copy an encoded record + a consume-queue unit per message; nothing else."""
    record = bytes(
        encode_record(
            TOPIC,
            0,
            _body(body_size),
            0,
            {Prop.KEYS: "order-1", Prop.TAGS: "bench"},
            0,
            int(time.time() * 1000),
            ("127.0.0.1", 1),
            encode_host(("127.0.0.1", 10911)),
            0,
            0,
            4 * MIB,
        )
    )
    unit = bytes(20)
    n = len(record)
    per_file = file_size // n
    log = _pretouched(workdir / "floor-commitlog", per_file * n)
    cq = _pretouched(workdir / "floor-cq", per_file * 20)
    try:

        def loop() -> tuple[int, int]:
            done = 0
            while done < records:
                batch = min(per_file, records - done)
                pos = cpos = 0
                for _ in range(batch):
                    log[pos : pos + n] = record
                    cq[cpos : cpos + 20] = unit
                    pos += n
                    cpos += 20
                done += batch
            return done, done * body_size

        return timed(loop)
    finally:
        log.close()
        cq.close()
        (workdir / "floor-commitlog").unlink()
        (workdir / "floor-cq").unlink()


# --- facade cases ----------------------------------------------------------------------
def _store_config(root: Path, mode: FlushMode, budget: Budget) -> StoreConfig:
    return StoreConfig(
        store_dir=root, mapped_file_size_commitlog=budget.commitlog_file, flush_mode=mode
    )


def _open_store(config: StoreConfig) -> object:
    """A started store whose first commitlog file is pre-touched, as a store that has run a
    while has its current file (the allocator warms each next file before it is needed):
    the put cases time putting, not the page faults of a fresh file, as the floor does."""
    from broker.store.message import Message
    from broker.store.store import MessageStore

    store = MessageStore(config)
    store.start()
    store.put_message(Message("BenchWarmUp", b"w"))
    current = store.commitlog.queue.mapped_files[-1]
    deadline = time.monotonic() + 60
    while current.warming:  # under ASYNC_FLUSH, in the background (see CommitLog.start)
        if time.monotonic() > deadline:
            progress("the first commitlog file is still warming: timing a cold file")
            break
        time.sleep(0.01)
    store.wait_dispatched(10.0)
    return store


def put_async(
    workdir: Path, budget: Budget, body_size: int, count: int, batch: int = 1
) -> tuple[Measured, object]:
    """Put `count` messages (or until the time budget); returns the still running store."""
    store = _open_store(_store_config(workdir, FlushMode.ASYNC_FLUSH, budget))
    body = _body(body_size)
    msgs = [_message(body, i) for i in range(count)]
    put = store.put_message  # type: ignore[attr-defined]
    put_many = store.put_messages  # type: ignore[attr-defined]
    deadline = time.perf_counter() + budget.seconds

    def loop() -> tuple[int, int]:
        done = 0
        if batch == 1:
            for start in range(0, count, 1000):
                for msg in msgs[start : start + 1000]:
                    put(msg)
                done = min(count, start + 1000)
                if time.perf_counter() > deadline:
                    break
        else:
            for start in range(0, count, batch):
                put_many(msgs[start : start + batch])
                done = min(count, start + batch)
                if start % (batch * 32) == 0 and time.perf_counter() > deadline:
                    break
        return done, done * body_size

    return timed(loop), store


def put_async_fast(
    workdir: Path,
    budget: Budget,
    body_size: int,
    count: int,
    batch: int = 32,
    keys: list[list[str]] | None = None,
) -> Measured:
    """`put_batch` of `batch` messages of one queue at a time (queues in turn)."""
    store = _open_store(_store_config(workdir, FlushMode.ASYNC_FLUSH, budget))
    body = _body(body_size)
    bodies = [body] * batch
    if keys is None:
        keys = batch_keys(count, batch)
    shared = {Prop.TAGS: "bench"}
    put_batch = store.put_batch  # type: ignore[attr-defined]
    deadline = time.perf_counter() + budget.seconds

    def loop() -> tuple[int, int]:
        done = 0
        for k, ks in enumerate(keys):
            put_batch(
                TOPIC,
                k % QUEUES,
                bodies if len(ks) == batch else bodies[: len(ks)],
                shared,
                keys=ks,
            )
            done = min(count, done + batch)
            if k % 32 == 0 and time.perf_counter() > deadline:
                break
        return done, done * body_size

    try:
        return timed(loop)
    finally:
        store.shutdown()  # type: ignore[attr-defined]


def batch_keys(count: int, batch: int = 32) -> list[list[str]]:
    """One KEYS value a message, in lists of `batch`."""
    return [
        [f"order-{i}" for i in range(start, min(count, start + batch))]
        for start in range(0, count, batch)
    ]


def median(runs: list[Measured]) -> Measured:
    """The run of median throughput (its CPU time with it): one stall of a few tens of ms
    moves a sub-second run by a third, and a median of three ignores one."""
    return sorted(runs, key=lambda m: m.msgs_s)[len(runs) // 2]


def put_sync(workdir: Path, budget: Budget, producers: int) -> tuple[Measured, float]:
    """`producers` threads putting 1 KiB messages under SYNC_FLUSH for the time budget."""
    store = _open_store(_store_config(workdir, FlushMode.SYNC_FLUSH, budget))
    try:
        body = _body(KIB)
        stop = threading.Event()
        start = threading.Barrier(producers + 1)
        counts = [0] * producers
        failures = [0] * producers
        put = store.put_message  # type: ignore[attr-defined]

        def producer(k: int) -> None:
            msg = _message(body, k)
            start.wait()
            n = bad = 0
            while not stop.is_set():
                if put(msg).ok:
                    n += 1
                else:
                    bad += 1
            counts[k] = n
            failures[k] = bad

        threads = [
            threading.Thread(target=producer, args=(k,), daemon=True) for k in range(producers)
        ]
        for t in threads:
            t.start()
        fsyncs_before = _fsync_count(store)
        start.wait()
        began = time.perf_counter()
        time.sleep(budget.sync_seconds)
        stop.set()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - began
        fsyncs = max(1, _fsync_count(store) - fsyncs_before)
        total = sum(counts)
        if any(failures):
            progress(f"sync x{producers}: {sum(failures)} puts not acknowledged in time")
        return Measured(total, seconds, total * KIB), total / fsyncs
    finally:
        store.shutdown()  # type: ignore[attr-defined]


def _fsync_count(store: object) -> int:
    commitlog = getattr(store, "commitlog", None)
    return int(getattr(commitlog, "fsync_count", 0))


def read(store: object, budget: Budget, count: int) -> Measured:
    """Consume every queue from offset 0 in batches of 32 (the pull path)."""
    get = store.get_messages  # type: ignore[attr-defined]
    store.wait_dispatched(60.0)  # type: ignore[attr-defined]
    deadline = time.perf_counter() + budget.seconds

    def loop() -> tuple[int, int]:
        done = payload = 0
        for qid in range(QUEUES):
            offset = 0
            while True:
                result = get("bench-group", TOPIC, qid, offset, 32)
                if not result.messages:
                    break
                done += len(result.messages)
                payload += sum(len(m.body) for m in result.messages)
                offset = result.next_begin_offset
                if done >= count or time.perf_counter() > deadline:
                    return done, payload
        return done, payload

    return timed(loop)


# --- dispatch (no facade needed) ----------------------------------------------------------
def dispatch(workdir: Path, budget: Budget) -> tuple[Measured, Measured]:
    """(bare commitlog appends, then dispatching them): no facade, no competing threads."""
    config = StoreConfig(store_dir=workdir, mapped_file_size_commitlog=budget.commitlog_file)
    ticks = itertools.count(int(time.time() * 1000))
    commitlog = CommitLog(config, clock=lambda: next(ticks))
    commitlog.load()
    # pre-touched like the floor's mapping (and like start() + the allocator do for a
    # running store): the case times appending, not page faults on a cold file
    first = commitlog.queue.get_last_mapped_file(0, create=True)
    assert first is not None
    first.warm()
    cqs = ConsumeQueueStore(config)
    cqs.load()
    index = IndexService(config)
    index.load(last_exit_ok=True)
    reput = ReputService(commitlog, [cqs, index])
    body = _body(KIB)
    msgs = [_message(body, i) for i in range(budget.dispatch)]
    for i, msg in enumerate(msgs):
        msg.properties[Prop.UNIQ_KEY] = f"{i:032X}"
    try:

        def append() -> tuple[int, int]:
            for msg in msgs:
                commitlog.append(msg)
            return len(msgs), len(msgs) * KIB

        def loop() -> tuple[int, int]:
            n = reput.do_reput()
            return n, n * KIB

        return timed(append), timed(loop)
    finally:
        cqs.shutdown()
        index.shutdown()
        commitlog.close()


def commitlog_put_batch(
    workdir: Path, count: int, keys: list[list[str]], batch: int = 32
) -> Measured:
    """`put_batch`'s own path, encode_batch + CommitLog.put_batch, with no dispatch thread
    taking turns on the interpreter: what a put costs the producer, as the floor."""
    from broker.store.batch import encode_batch

    record = 1 * KIB + 200  # a 1 KiB record with its header, topic and properties, rounded up
    file_size = (count * record // MIB + 1) * MIB
    # one file for all of it, pre-touched here (untimed, as the floor's); not warming the
    # next one, which the allocator would do beside the loop once this one is half full
    config = StoreConfig(
        store_dir=workdir, mapped_file_size_commitlog=file_size, warm_mapped_file=False
    )
    commitlog = CommitLog(config, clock=lambda: int(time.time() * 1000))
    commitlog.load()
    first = commitlog.queue.get_last_mapped_file(0, create=True)
    assert first is not None
    first.warm()  # pre-touched, as the floor's mapping
    body = _body(KIB)
    bodies = [body] * batch
    shared = {Prop.TAGS: "bench"}
    host, store_host = ("127.0.0.1", 1), commitlog.store_host_raw
    max_size, max_record = config.max_message_size, commitlog.max_record
    put = commitlog.put_batch
    try:

        def loop() -> tuple[int, int]:
            done = 0
            for k, ks in enumerate(keys):
                b, key = encode_batch(
                    TOPIC,
                    k % QUEUES,
                    bodies[: len(ks)],
                    shared,
                    ks,
                    None,
                    0,
                    0,
                    int(time.time() * 1000),
                    host,
                    store_host,
                    max_size,
                    max_record,
                )
                put(b, key)
                done += len(ks)
            return done, done * KIB

        return timed(loop)
    finally:
        commitlog.close()


# --- suite -----------------------------------------------------------------------------------
def _case(workdir: Path, name: str) -> Path:
    """A fresh directory for one case. The earlier cases' directories go first: a deleted
    file's dirty pages are dropped, where a kept one's would be written back by the kernel
    while this case is timed (hundreds of MB a case in a full run: measured, it cut the
    put_batch case from ~55% to ~38% of the floor)."""
    for earlier in workdir.iterdir():
        if earlier.is_dir():
            shutil.rmtree(earlier, ignore_errors=True)
    path = workdir / name
    path.mkdir(parents=True)
    return path


def run(opts: Options) -> SuiteResult:
    budget = Budget(opts.quick)
    assert opts.workdir is not None
    workdir = opts.workdir
    result = SuiteResult()
    m: dict[str, float | int | str | None] = result.metrics
    m["quick"] = int(opts.quick)
    m["cpus"] = os.cpu_count() or 0

    progress("floor: bare mmap copy of the same record bytes")
    f1 = median(
        [
            floor(_case(workdir, "floor"), KIB, budget.floor_records, 64 * MIB)
            for _ in range(budget.repeats)
        ]
    )
    f16 = floor(_case(workdir, "floor"), 16 * KIB, budget.floor_records // 8, 256 * MIB)
    result.rows += [
        Row("floor 1 KiB (bare mmap loop)", f1.msgs_s, f1.mb_s, cpu_us=f1.cpu_us),
        Row("floor 16 KiB (bare mmap loop)", f16.msgs_s, f16.mb_s, cpu_us=f16.cpu_us),
    ]
    m.update(
        floor_msgs_s=round(f1.msgs_s),
        floor_mb_s=round(f1.mb_s, 1),
        floor_16k_msgs_s=round(f16.msgs_s),
        floor_16k_mb_s=round(f16.mb_s, 1),
    )

    progress("commitlog append alone, then dispatch: consume queues + index")
    ap, d = dispatch(_case(workdir, "dispatch"), budget)
    result.rows.append(
        Row(
            "commitlog append 1 KiB (no facade)",
            ap.msgs_s,
            ap.mb_s,
            f"{ap.msgs_s / f1.msgs_s:.0%} of floor",
            ap.cpu_us,
        )
    )
    result.rows.append(Row("dispatch (CQ + index, 1 KiB)", d.msgs_s, d.mb_s, cpu_us=d.cpu_us))
    m.update(
        commitlog_append_1k_msgs_s=round(ap.msgs_s),
        dispatch_msgs_s=round(d.msgs_s),
        floor_cpu_us=round(f1.cpu_us, 3),
        commitlog_append_1k_cpu_us=round(ap.cpu_us, 2),
        dispatch_cpu_us=round(d.cpu_us, 2),
    )

    progress("put async 1 KiB")
    a1, store = put_async(_case(workdir, "async1k"), budget, KIB, budget.put_1k)
    try:
        result.rows.append(
            Row(
                "put async 1 KiB",
                a1.msgs_s,
                a1.mb_s,
                f"{a1.msgs_s / f1.msgs_s:.0%} of floor",
                a1.cpu_us,
            )
        )
        m.update(
            put_async_1k_msgs_s=round(a1.msgs_s),
            put_async_1k_mb_s=round(a1.mb_s, 1),
            put_async_1k_vs_floor=round(a1.msgs_s / f1.msgs_s, 3),
        )
        progress("read by queue offset (get_messages x32)")
        r = read(store, budget, a1.count)
        result.rows.append(
            Row("read by offset (get_messages x32)", r.msgs_s, r.mb_s, cpu_us=r.cpu_us)
        )
        m.update(read_msgs_s=round(r.msgs_s), read_mb_s=round(r.mb_s, 1))
    finally:
        store.shutdown()  # type: ignore[attr-defined]

    progress("put async 1 KiB, batches of 32")
    ab, store = put_async(_case(workdir, "async1kb"), budget, KIB, budget.put_1k, batch=32)
    store.shutdown()  # type: ignore[attr-defined]
    result.rows.append(
        Row(
            "put async 1 KiB (put_messages x32)",
            ab.msgs_s,
            ab.mb_s,
            f"{ab.msgs_s / f1.msgs_s:.0%} of floor",
            ab.cpu_us,
        )
    )
    m.update(put_async_1k_batch_msgs_s=round(ab.msgs_s))

    progress("put async 1 KiB, put_batch of 32")
    keys = batch_keys(budget.put_batch_1k)
    af = median(
        [
            put_async_fast(_case(workdir, "async1kf"), budget, KIB, budget.put_batch_1k, keys=keys)
            for _ in range(budget.repeats)
        ]
    )
    progress("put_batch of 32 into the commitlog, no dispatch thread")
    cf = median(
        [
            commitlog_put_batch(_case(workdir, "clbatch"), budget.put_batch_1k, keys)
            for _ in range(budget.repeats)
        ]
    )
    result.rows.append(
        Row(
            "put async 1 KiB (put_batch x32)",
            af.msgs_s,
            af.mb_s,
            f"{af.msgs_s / f1.msgs_s:.0%} of floor",
            af.cpu_us,
        )
    )
    result.rows.append(
        Row(
            "  same, no dispatch thread",
            cf.msgs_s,
            cf.mb_s,
            f"{cf.msgs_s / f1.msgs_s:.0%} of floor",
            cf.cpu_us,
        )
    )
    m.update(
        put_async_1k_batch_fast_msgs_s=round(af.msgs_s),
        put_async_1k_batch_fast_vs_floor=round(af.msgs_s / f1.msgs_s, 3),
        put_async_1k_batch_fast_cpu_us=round(af.cpu_us, 2),
        put_batch_1k_no_dispatch_msgs_s=round(cf.msgs_s),
        put_batch_1k_no_dispatch_vs_floor=round(cf.msgs_s / f1.msgs_s, 3),
        put_batch_1k_no_dispatch_cpu_us=round(cf.cpu_us, 3),
    )

    progress("put async 16 KiB")
    a16, store = put_async(_case(workdir, "async16k"), budget, 16 * KIB, budget.put_16k)
    store.shutdown()  # type: ignore[attr-defined]
    result.rows.append(
        Row(
            "put async 16 KiB",
            a16.msgs_s,
            a16.mb_s,
            f"{a16.mb_s / f16.mb_s:.0%} of floor MB/s",
            a16.cpu_us,
        )
    )
    m.update(put_async_16k_msgs_s=round(a16.msgs_s), put_async_16k_mb_s=round(a16.mb_s, 1))

    for producers in (1, 8, 64):
        progress(f"put sync 1 KiB, {producers} producers")
        s, per_fsync = put_sync(_case(workdir, f"sync{producers}"), budget, producers)
        result.rows.append(
            Row(
                f"put sync 1 KiB x{producers} producers",
                s.msgs_s,
                s.mb_s,
                f"{per_fsync:.1f} msgs/fsync",
            )
        )
        m[f"put_sync_{producers}_msgs_s"] = round(s.msgs_s)
        m[f"sync_{producers}_msgs_per_fsync"] = round(per_fsync, 2)

    for name in (
        "floor",
        "dispatch",
        "async1k",
        "async1kb",
        "async1kf",
        "async16k",
        "sync1",
        "sync8",
        "sync64",
    ):
        shutil.rmtree(workdir / name, ignore_errors=True)
    result.notes.append(
        f"(quick={opts.quick}; {os.cpu_count()} CPUs; MB = 1e6 bytes of "
        "message body; CPU = the measuring thread only, background "
        "dispatch/flush threads not included)"
    )
    return result
