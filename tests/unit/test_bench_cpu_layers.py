"""`bench._cpu_layers`: the CPU a span of time cost, layer by layer, read from /proc for
real processes: a child that burns CPU, one that sleeps, one that exits mid-span."""

from __future__ import annotations

import subprocess
import sys
import time

from bench._cpu_layers import OTHER, LayerSampler

BURN = "import time\nend = time.time() + {s}\nwhile time.time() < end: pass\n"
SLEEP = "import time; time.sleep({s})"


def test_a_span_is_charged_to_the_layer_that_spent_it() -> None:
    burner = subprocess.Popen([sys.executable, "-c", BURN.format(s=3), "burner"])
    sleeper = subprocess.Popen([sys.executable, "-c", SLEEP.format(s=3), "sleeper"])
    # burns for a second then exits inside the span: its CPU stays counted
    short = subprocess.Popen([sys.executable, "-c", BURN.format(s=0.8), "short"])

    def layer(pid: int, name: str, cmdline: str) -> str:
        for tag in ("burner", "sleeper", "short"):
            if cmdline.endswith(tag):
                return tag
        return OTHER

    try:
        with LayerSampler(layer, interval_s=0.05) as sampler:
            time.sleep(0.3)  # every child running (and past its start-up)
            t0 = time.time()
            short.wait(10)
            time.sleep(1.2)
            t1 = time.time()
            window = sampler.window(t0, t1)
            assert sampler.window(t1, t0) is None  # an empty span
            assert sampler.window(t0 - 3600, t1) is None  # before the first reading
    finally:
        for proc in (burner, sleeper, short):
            proc.kill()
            proc.wait()
    assert window is not None
    span = t1 - t0
    assert abs(window.seconds - span) < 1e-9
    # one core burning the whole span (less of it on a machine shared with other tests)
    assert 0.3 * span < window.cpu_s["burner"] <= span + 0.1, window.cpu_s
    assert window.cpu_s.get("sleeper", 0.0) < 0.05, window.cpu_s
    assert 0.05 < window.cpu_s["short"] < 1.0, window.cpu_s  # its last reading, kept
    assert window.busy is not None and 0 < window.busy <= 1
    per = window.per_unit_us(1000)
    assert list(per.values()) == sorted(per.values(), reverse=True)  # largest first
    assert per["burner"] == round(window.cpu_s["burner"] / 1000 * 1e6, 1)
    words = window.describe(1000, "msg")
    assert words.startswith("CPU us/msg: ") and "burner " in words and "% busy" in words
