"""`reliable consume module:attr`: a real process, stopped with SIGTERM, commits offsets."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import reliable
from broker.store.config import WATERMARKS_OFF, StoreConfig
from reliable import Message, Producer
from reliable.transport.base import QueueRef
from tests.e2e.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
SIZE = 4 * 1024 * 1024


def _transport(store: Path) -> reliable.Transport:
    t = reliable.connect(
        "embedded",
        store_config=StoreConfig(
            store_dir=store, mapped_file_size_commitlog=SIZE, **WATERMARKS_OFF
        ),
    )
    t.start()
    return t


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "reliable_cli", *args],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_consume_runs_handlers_and_sigterm_commits_offsets(tmp_path: Path) -> None:
    store, out = tmp_path / "store", tmp_path / "processed"
    t = _transport(store)
    with Producer(t) as producer:
        sent = {producer.send(Message("cli-orders", f"{i}".encode())).message_id for i in range(30)}
    t.close()

    child = _cli(
        "consume",
        "tests.e2e.cli_handlers:record",
        "--store",
        str(store),
        "--commitlog-file-size",
        str(SIZE),
        "--disk-clean-ratio",
        "1.0",
        "--disk-full-ratio",
        "1.0",
        env={"RELIABLE_TEST_OUT": str(out)},
    )
    try:
        wait_until(
            lambda: out.exists() and set(out.read_text().split()) == sent,
            timeout=60,
            what="the 30 messages",
        )
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=30)
        assert child.returncode == 0, err
    finally:
        if child.poll() is None:
            child.kill()

    t = _transport(store)
    try:
        broker = t.broker  # type: ignore[attr-defined]
        queues = [QueueRef("cli-orders", "embedded", q) for q in range(4)]
        committed = [t.query_offset("cli-g", q) for q in queues]  # type: ignore[attr-defined]
        assert committed == [broker.max_offset("cli-orders", q.queue_id) for q in queues]
    finally:
        t.close()


def test_consume_rejects_a_target_that_is_not_a_handler(tmp_path: Path) -> None:
    child = _cli("consume", "tests.e2e.cli_handlers:not_a_handler", "--store", str(tmp_path / "s"))
    _, err = child.communicate(timeout=60)
    assert child.returncode == 2 and "not a declared handler" in err
