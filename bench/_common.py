"""What every benchmark suite shares: result rows, timing, progress on stderr.

A suite is a module `bench/<name>.py` (no leading underscore; `python -m bench <name>`
runs it) defining

    DESCRIPTION: str                            # the title of its table
    def run(opts: Options) -> SuiteResult: ...

The runner finds it by its file name; nothing needs registering.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Options:
    quick: bool = False
    workdir: Path | None = None  # where suites put their files (a temp dir by default)
    only: str | None = None  # a regular expression: the cases to run (suites that offer it)
    repeat: int = 1  # passes over the cases, each figure their median (suites that offer it)
    stub_work_us: float = 0.0  # grpc: CPU the no-work stub spends per send and per ack


@dataclass
class Row:
    """One measured case: throughput in messages/s and MB/s (payload bytes, 1 MB = 1e6 B)."""

    name: str
    msgs_s: float
    mb_s: float
    note: str = ""
    cpu_us: float | None = None  # CPU of the measuring thread per message, when meaningful
    missing: bool = False  # not measured (the note says why): no figure is printed


@dataclass
class SuiteResult:
    rows: list[Row] = field(default_factory=list)
    # figures by name; None for a figure that could not be measured in this run
    metrics: dict[str, float | int | str | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # cases that failed: the run exits 1


def proc_stat(pid: int) -> tuple[str, list[str]]:
    """`/proc/<pid>/stat`: the command's name, and the fields after it ([0] the state,
    [11] and [12] user and system CPU in clock ticks, [19] the start time). OSError when
    the process is gone. Read with os.open/os.read, a third of a text file object's cost:
    the CPU sampler reads every process of the machine five times a second."""
    fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    try:
        raw = os.read(fd, 4096).decode(errors="replace")
    finally:
        os.close(fd)
    name, _, rest = raw.partition("(")[2].rpartition(")")
    return name, rest.split()


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


@dataclass
class Measured:
    count: int
    seconds: float
    payload_bytes: int
    cpu_seconds: float = 0.0  # of the calling thread only

    @property
    def cpu_us(self) -> float:
        """CPU microseconds per message spent in the calling thread: steadier than msgs/s
        on a shared machine, but blind to work done by background threads."""
        return self.cpu_seconds / self.count * 1e6 if self.count else 0.0

    @property
    def msgs_s(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_s(self) -> float:
        return self.payload_bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0


def collected() -> tuple[float, float]:
    """A full garbage collection, then the clock: (perf_counter, thread_time).

    Every case starts here, so that none pays for the garbage the cases before it left:
    CPython's full collection (10-30 ms in the bench's process, which holds every client
    library: ours, the official one, pika, nats-py, grpc) runs once the objects made since
    the last one outnumber a quarter of those that survived it, and inside a case of
    20-250 ms one of them moved its figure by up to 40%. What survives is then frozen
    (`gc.freeze()`): a full collection during the case walks what the case made, not
    every library loaded for the others (as in an application that loads one client and
    freezes after start-up; see docs/performance.md, "Python's collector"). None is run
    when nothing was collected since the last (a case's CPU probe ran one just before its
    clock): its cost would land in the probe."""
    if gc.get_count()[1:] != (0, 0):
        gc.collect()
        gc.freeze()
    return time.perf_counter(), time.thread_time()


def python_loop_s(samples: int = 5) -> list[float]:
    """Seconds a 10-million-iteration Python `for` loop takes, `samples` times (each timed
    on a fifth of it): Python-bound figures move with it. Several short samples, not one
    long one, so that a machine whose speed moves within seconds (a shared host) shows it."""
    out = []
    for _ in range(samples):
        start = time.perf_counter()
        total = 0
        for i in range(2_000_000):
            total += i
        out.append((time.perf_counter() - start) * 5)
    return out


def passes(
    repeat: int, workdir: Path, one: Callable[[Path], SuiteResult], loops: list[float]
) -> list[SuiteResult]:
    """`--repeat`: `one(where)` `repeat` times, pass after pass, each in a directory of its
    own (`pass-<i>` under `workdir`; `workdir` itself for a single pass), the machine's
    Python speed sampled again into `loops` after each pass."""
    out: list[SuiteResult] = []
    for i in range(max(1, repeat)):
        where = workdir
        if repeat > 1:
            progress(f"pass {i + 1} of {repeat}")
            where = workdir / f"pass-{i + 1}"
            where.mkdir(exist_ok=True)
        out.append(one(where))
        loops.extend(python_loop_s())
    return out


def fdatasync_p50_ms(where: Path) -> float:
    """fdatasync of 1 KiB in `where`, p50 in ms: fsync-bound figures move with it."""
    return _fsync_probe(where / "fsync-probe", 200, pause_s=0.0, written=False)


# the pause a lone durable producer leaves between two fsyncs of the server's (its round
# trip and the two sides' work): about 0.5 ms on loopback
APART_S = 0.0005


def fdatasync_apart_p50_ms(where: Path) -> float:
    """fdatasync of a 1 KiB record written into a preallocated, already written file (as
    the commitlog's writes are), each `APART_S` after the last one ended, p50 in ms.

    The floor of a one-at-a-time durable send: a disk left idle between requests may
    answer slower than one kept busy (seen: 0.12 ms back to back, 0.21 ms 0.5 ms apart,
    the CPU sleeping or spinning alike), which no server-side change removes."""
    return _fsync_probe(where / "fsync-apart-probe", 200, pause_s=APART_S, written=True)


def _fsync_probe(path: Path, count: int, *, pause_s: float, written: bool) -> float:
    """`count` 1 KiB writes at `path`, each fdatasynced and timed; p50 in ms. `written`:
    into a file allocated and written (zeros) first, not one growing with each write."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if written:
            size = count * 1024
            os.posix_fallocate(fd, 0, size)
            os.pwrite(fd, bytes(size), 0)  # written extents: an fsync carries data only
            os.fdatasync(fd)
        syncs = []
        for i in range(count):
            if pause_s:
                time.sleep(pause_s)
            os.pwrite(fd, b"x" * 1024, i * 1024)
            start = time.perf_counter()
            os.fdatasync(fd)
            syncs.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        path.unlink()
    return percentiles_ms(syncs)[0]


def timed(fn: Callable[[], tuple[int, int]]) -> Measured:
    """Run `fn` (returning (messages, payload bytes)) and time it (from `collected`)."""
    start, cpu = collected()
    count, payload = fn()
    return Measured(count, time.perf_counter() - start, payload, time.thread_time() - cpu)


def percentiles_ms(seconds: Sequence[float]) -> tuple[float, float]:
    """p50 and p99 of per-call durations (seconds), in milliseconds, rounded to 0.01 ms."""
    ordered = sorted(seconds)
    if not ordered:
        return 0.0, 0.0

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)

    return at(0.50), at(0.99)


def format_table(title: str, result: SuiteResult) -> str:
    lines = [title, f"{'case':<34} {'msgs/s':>12} {'MB/s':>10} {'CPU us/msg':>10}  note", "-" * 84]
    for row in result.rows:
        if row.missing:
            lines.append(f"{row.name:<34} {'-':>12} {'-':>10} {'-':>10}  {row.note}")
            continue
        cpu = "-" if row.cpu_us is None else f"{row.cpu_us:.2f}"
        lines.append(f"{row.name:<34} {row.msgs_s:>12,.0f} {row.mb_s:>10.1f} {cpu:>10}  {row.note}")
    lines.extend(result.notes)
    return "\n".join(lines)
