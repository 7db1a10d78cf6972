"""Disk full through a real `reliable broker start` process: its store sits on a small
tmpfs mounted for the test, a filler file pushes the partition above the refuse watermark
(`--disk-full-ratio`), sends are refused with the store's DISK_FULL status, nothing
acknowledged before is lost, and once the filler is removed sends succeed again; every
acknowledged message is consumed exactly once."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import reliable
from reliable import Message, Producer, SendFailed
from tests.e2e.grpc.server_process import ServerProcess
from tests.e2e.grpc.test_store_corruption import consume_all

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

DISK_MB = 160
FULL = 0.8


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"this test mounts a tmpfs (needs CAP_SYS_ADMIN): {done.stderr}"
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _used(path: Path) -> float:
    usage = shutil.disk_usage(path)
    return usage.used / usage.total


def _fill_to(disk: Path, ratio: float) -> Path:
    filler = disk / "filler"
    usage = shutil.disk_usage(disk)
    need = int(ratio * usage.total) - usage.used
    with filler.open("wb") as f:
        for _ in range(max(0, need) // (1 << 20) + 1):
            f.write(b"\xff" * (1 << 20))
    return filler


def test_disk_full_refuses_sends_keeps_what_was_acknowledged_and_recovers(
    disk: Path, tmp_path: Path
) -> None:
    store = disk / "store"
    server = ServerProcess(
        store,
        tmp_path,
        "--disk-full-ratio",
        str(FULL),
        "--disk-clean-ratio",
        str(FULL),
        "--queues",
        "2",
    ).start()
    transport = reliable.connect("grpc", endpoint=server.endpoint)
    transport.start()
    acked: list[bytes] = []
    try:
        with Producer(transport, sleep=lambda _s: None) as producer:
            for i in range(20):
                producer.send(Message("t-full", f"before-{i}".encode()))
                acked.append(f"before-{i}".encode())
            assert _used(disk) < FULL
            filler = _fill_to(disk, 0.9)
            refused: SendFailed | None = None
            deadline = time.monotonic() + 30  # the store measures the disk every 10 s
            i = 0
            while refused is None and time.monotonic() < deadline:
                body = f"during-{i}".encode()
                i += 1
                try:
                    producer.send(Message("t-full", body))
                    acked.append(body)
                    time.sleep(0.2)
                except SendFailed as exc:
                    refused = exc
            assert refused is not None, "sends were never refused"
            assert "DISK_FULL" in str(refused.last_error)
            filler.unlink()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    producer.send(Message("t-full", b"after-0"))
                    acked.append(b"after-0")
                    break
                except SendFailed:
                    time.sleep(0.5)
            else:
                pytest.fail("sends were still refused after the space returned")
            for j in range(1, 10):
                producer.send(Message("t-full", f"after-{j}".encode()))
                acked.append(f"after-{j}".encode())
    finally:
        transport.close()
    got = consume_all(server, "t-full", "g-full", len(acked))
    assert sorted(got) == sorted(acked)  # all acknowledged, each once
    assert server.terminate() == 0, "".join(server.output)
