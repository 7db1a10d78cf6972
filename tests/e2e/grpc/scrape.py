"""Reading a real process's `/metrics`, `/healthz` and `/readyz` (no client library of ours)."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

_METRICS_LINE = re.compile(r"metrics on (http://[\w.\-]+:\d+)/metrics")


def metrics_url(output: Iterable[str], timeout_s: float = 30.0) -> str:
    """The endpoint a command printed (`...: metrics on http://HOST:PORT/metrics`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in list(output):
            m = _METRICS_LINE.search(line)
            if m:
                return m.group(1)
        time.sleep(0.05)
    raise AssertionError("no metrics endpoint announced:\n" + "".join(output))


class Samples(dict[tuple[str, frozenset[tuple[str, str]]], float]):
    """Samples by (name, labels); `value("x_total", group="g")` sums the matching ones."""

    def value(self, name: str, **labels: str) -> float:
        want = set(labels.items())
        return sum(v for (n, ls), v in self.items() if n == name and want <= ls)

    def has(self, name: str) -> bool:
        return any(n == name for n, _ in self)


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = Samples()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def probe(url: str, path: str) -> tuple[int, Any]:
    """(HTTP status, JSON body) of `/healthz` or `/readyz`."""
    try:
        with urllib.request.urlopen(url + path, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
