"""CPU by layer: which processes of the machine spent the CPU a case used.

A case of the flow suite runs many processes at once (the bench's writer threads, the
broker, the consumers, PostgreSQL's backends, Redis, NATS and the hand-written relay), and
its rate is bound by whichever needs the CPU most. `LayerSampler` reads, every `interval_s`,
the CPU every process on the machine has used so far (`/proc/<pid>/stat`, user + system)
and the machine's own busy time (`/proc/stat`), and sorts each process into a layer by a
rule of the suite (`classify`: its pid, its command's name, its command line). A process
that exits keeps the CPU it had at its last reading, so a PostgreSQL backend closed
mid-case still counts.

`window(t0, t1)` is then what each layer spent between two wall-clock times (`time.time()`,
the clock the suites stamp their rows with), interpolated between the readings around each
end, and how busy the machine was: the CPU a case cost, per layer, with no profiler
attached. A reading of 80 processes costs about a millisecond of the bench's own CPU
(charged to its layer): every 0.2 s, half a percent of a core.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench._common import proc_stat

Classify = Callable[[int, str, str], str]  # (pid, command name, command line) -> layer
OTHER = "other"


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of every CPU since boot, from the first line of /proc/stat:
    idle and iowait are the CPU doing nothing."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    return total - fields[3] - fields[4], total


@dataclass(frozen=True)
class Window:
    """What a span of wall-clock time cost the machine."""

    seconds: float
    cpu_s: dict[str, float]  # layer -> CPU seconds spent in the span
    busy: float | None  # fraction of every CPU busy in the span (None: no reading)

    @property
    def total_s(self) -> float:
        return sum(self.cpu_s.values())

    def per_unit_us(self, units: int) -> dict[str, float]:
        """CPU µs per order (or message), layer by layer, largest first."""
        if units <= 0:
            return {}
        pairs = sorted(self.cpu_s.items(), key=lambda kv: -kv[1])
        return {layer: round(s / units * 1e6, 1) for layer, s in pairs if s > 0}

    def describe(self, units: int, unit: str = "order") -> str:
        """One line for a row's note: the layers, then how busy the machine was."""
        per = self.per_unit_us(units)
        layers = ", ".join(f"{layer} {us:,.0f}" for layer, us in per.items() if us >= 5)
        busy = "" if self.busy is None else f"; machine {self.busy * 100:.0f}% busy"
        return f"CPU us/{unit}: {layers}{busy}"


class LayerSampler:
    """A thread that samples every process's CPU by layer; use as a context manager."""

    def __init__(self, classify: Classify, interval_s: float = 0.2) -> None:
        self._classify = classify
        self._interval_s = interval_s
        self._tick = os.sysconf("SC_CLK_TCK")
        self._layers: dict[tuple[int, str], str] = {}  # (pid, start time) -> layer
        self._last: dict[tuple[int, str], float] = {}  # (pid, start time) -> CPU seconds
        self._times: list[float] = []
        self._samples: list[tuple[dict[str, float], int, int]] = []
        self._lock = threading.Lock()  # the readings, against `_at`
        self._reading = threading.Lock()  # one reading at a time (the thread, `window`)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-layers", daemon=True)

    def __enter__(self) -> LayerSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.sample()

    def _read(self, pid: int) -> tuple[tuple[int, str], float, str] | None:
        try:
            name, fields = proc_stat(pid)
        except OSError:
            return None  # gone between the listing and the read
        return (pid, fields[19]), (int(fields[11]) + int(fields[12])) / self._tick, name

    def _layer(self, key: tuple[int, str], name: str) -> str:
        layer = self._layers.get(key)
        if layer is None:
            try:
                cmdline = Path(f"/proc/{key[0]}/cmdline").read_bytes().replace(b"\0", b" ")
                line = cmdline.decode(errors="replace").strip()
            except OSError:
                line = ""
            layer = self._layers[key] = self._classify(key[0], name, line) or OTHER
        return layer

    def sample(self) -> None:
        """One reading of every process (and of the machine), stamped with time.time()."""
        with self._reading:
            self._sample()

    def _sample(self) -> None:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            got = self._read(int(entry.name))
            if got is None:
                continue
            key, cpu, name = got
            self._layer(key, name)
            self._last[key] = cpu
        by_layer: dict[str, float] = {}
        for key, cpu in self._last.items():
            layer = self._layers[key]
            by_layer[layer] = by_layer.get(layer, 0.0) + cpu
        busy, total = _machine_ticks()
        with self._lock:
            self._times.append(time.time())
            self._samples.append((by_layer, busy, total))

    def _at(self, t: float) -> tuple[dict[str, float], float, float] | None:
        """Each layer's cumulative CPU and the machine's ticks at `t`, interpolated."""
        with self._lock:
            times, samples = list(self._times), list(self._samples)
        if not times or t < times[0] or t > times[-1]:
            return None
        i = bisect.bisect_left(times, t)
        if times[i] == t or i == 0:
            layers, busy, total = samples[i]
            return dict(layers), float(busy), float(total)
        ta, (la, ba, xa) = times[i - 1], samples[i - 1]
        tb, (lb, bb, xb) = times[i], samples[i]
        f = (t - ta) / (tb - ta) if tb > ta else 1.0
        layers = {k: la.get(k, 0.0) + (lb.get(k, 0.0) - la.get(k, 0.0)) * f for k in lb}
        return layers, ba + (bb - ba) * f, xa + (xb - xa) * f

    def window(self, t0: float, t1: float) -> Window | None:
        """What each layer spent between `t0` and `t1` (time.time()); None when the
        sampler was not reading for the whole span."""
        with self._lock:
            behind = not self._times or self._times[-1] < t1
        if behind and t1 <= time.time():
            self.sample()  # the span ended after the last reading: one more now
        a, b = self._at(t0), self._at(t1)
        if a is None or b is None or t1 <= t0:
            return None
        cpu = {k: max(0.0, v - a[0].get(k, 0.0)) for k, v in b[0].items()}
        total = b[2] - a[2]
        busy = (b[1] - a[1]) / total if total > 0 else None
        return Window(t1 - t0, cpu, None if busy is None else round(min(busy, 1.0), 3))


__all__ = ["OTHER", "LayerSampler", "Window"]
