"""The console's memory of the last hour: one sample of the broker every few seconds, kept
in a ring, from which the overview's figures and charts are drawn.

A sample is what the overview shows at one moment: per topic the messages ever stored
(the sum of its queues' max offsets), per group its lag, what it consumed (the sum of its
committed offsets), retry and dead-letter depth, and the store's disk use. Rates are the
difference of two samples over their time apart, so nothing on the broker has to count.
The sampler runs in one daemon thread; a broker that does not answer makes a sample that
says so (`error`), and the next one tries again.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reliable_cli.console.broker_view import (
    BrokerView,
    ConsoleError,
    GroupLag,
    NotAvailable,
    is_user_topic,
)

log = logging.getLogger(__name__)


@dataclass
class Sample:
    """The broker at one moment."""

    at: float  # epoch seconds
    topics: dict[str, int] = field(default_factory=dict)  # topic -> messages ever stored
    groups: dict[str, GroupLag] = field(default_factory=dict)
    store: dict[str, Any] | None = None
    error: str | None = None


def take_sample(view: BrokerView, now: Callable[[], float] = time.time) -> Sample:
    """One sample (errors become `Sample.error`)."""
    at = now()
    try:
        names = sorted(t["name"] for t in view.topics() if is_user_topic(t["name"]))
        topics = view.max_offsets(names)
        groups = {
            g["name"]: view.group_lag(g["name"], names)
            for g in sorted(view.groups(), key=lambda g: str(g["name"]))
        }
        try:
            store: dict[str, Any] | None = view.store_status()
        except NotAvailable:
            store = None
        return Sample(at, topics, groups, store)
    except ConsoleError as exc:
        return Sample(at, error=str(exc))
    except Exception as exc:  # a refusal: show it, keep sampling
        return Sample(at, error=f"{type(exc).__name__}: {exc}")


class Sampler:
    """Samples every `interval_s` into a ring of `capacity` samples."""

    def __init__(self, view: BrokerView, interval_s: float = 5.0, capacity: int = 720) -> None:
        self.view = view
        self.interval_s = interval_s
        self._ring: deque[Sample] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="console-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 10)

    def sample_now(self) -> Sample:
        """Take one sample in the caller's thread and keep it."""
        s = take_sample(self.view)
        with self._lock:
            self._ring.append(s)
        return s

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.sample_now()
            self._wake.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
            self._wake.clear()

    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._ring)

    def latest(self) -> Sample:
        """The newest good sample, or a fresh one when there is none yet."""
        with self._lock:
            for s in reversed(self._ring):
                if s.error is None:
                    return s
            last = self._ring[-1] if self._ring else None
        return last if last is not None and last.error is not None else self.sample_now()


Series = dict[str, list[tuple[float, float]]]


def lag_series(samples: list[Sample]) -> Series:
    """Per group: (time, lag)."""
    out: Series = {}
    for s in samples:
        for name, g in s.groups.items():
            out.setdefault(name, []).append((s.at, float(g.lag)))
    return out


def _rates(points: dict[str, list[tuple[float, float]]]) -> Series:
    out: Series = {}
    for name, values in points.items():
        rates = []
        for (t0, v0), (t1, v1) in itertools.pairwise(values):
            if t1 > t0 and v1 >= v0:  # a reset offset or a deleted topic: no rate
                rates.append((t1, (v1 - v0) / (t1 - t0)))
        if rates:
            out[name] = rates
    return out


def produced_rates(samples: list[Sample]) -> Series:
    """Per topic: (time, messages stored per second since the previous sample)."""
    points: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        for name, total in s.topics.items():
            points.setdefault(name, []).append((s.at, float(total)))
    return _rates(points)


def consumed_rates(samples: list[Sample]) -> Series:
    """Per group: (time, messages consumed per second since the previous sample)."""
    points: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        for name, g in s.groups.items():
            points.setdefault(name, []).append((s.at, float(g.consumed)))
    return _rates(points)
