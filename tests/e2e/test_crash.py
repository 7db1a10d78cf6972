"""A consumer (with its embedded broker) killed with SIGKILL while messages are in flight
loses none of the acknowledged messages after a restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.helpers import wait_until

CHILD = Path(__file__).with_name("crash_child.py")


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


@pytest.mark.chaos
def test_sigkill_with_messages_in_flight_loses_nothing(tmp_path: Path) -> None:
    store, out = tmp_path / "store", tmp_path / "out"
    out.mkdir()
    child = subprocess.Popen([sys.executable, str(CHILD), str(store), str(out), "produce", "400"])
    try:

        def busy() -> bool:  # consuming, and acknowledged messages waiting to be consumed
            processed = set(_lines(out / "processed.log"))
            return len(processed) >= 30 and len(set(_lines(out / "sent.log")) - processed) >= 20

        wait_until(busy, timeout=60, what="the child to send and consume")
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
    sent_before = _lines(out / "sent.log")
    processed_before = set(_lines(out / "processed.log"))
    assert (store / "abort").exists()  # the broker did not shut down cleanly
    assert set(sent_before) - processed_before  # some acknowledged messages were pending

    again = subprocess.Popen([sys.executable, str(CHILD), str(store), str(out), "recover"])
    try:
        assert again.wait(90) == 0
    finally:
        if again.poll() is None:
            again.kill()
    processed = Counter(_lines(out / "processed.log"))
    lost = set(sent_before) - set(processed)
    assert not lost, f"{len(lost)} acknowledged message(s) lost"
    duplicates = sum(n - 1 for n in processed.values())
    print(
        f"sent {len(sent_before)} (acknowledged), processed {len(processed)} distinct, "
        f"{duplicates} duplicate(s) after the SIGKILL"
    )
