"""Damaged store files under a real `reliable broker start`: consume queues are derived
data and are rebuilt from the commitlog (nothing is lost); a record whose bytes changed is
caught by its checksum; `reliable admin store verify` says what is wrong where."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import reliable
from reliable import Message, Producer, SimpleConsumer
from tests.e2e.grpc import official
from tests.e2e.grpc.server_process import REPO, TEST_STORE, ServerProcess
from tests.e2e.grpc.test_cli import cli

UNIT = struct.Struct(">qiq")  # consume-queue unit: commitlog offset, size, tags code


def send(server: ServerProcess, topic: str, n: int) -> set[bytes]:
    transport = reliable.connect("grpc", endpoint=server.endpoint)
    transport.start()
    try:
        with Producer(transport) as producer:
            bodies = {f"{topic}-{i}".encode() for i in range(n)}
            for body in sorted(bodies):
                producer.send(Message(topic, body))
        queues = transport.route(topic).read_queues
        assert official.wait_for(lambda: sum(transport.max_offset(q) for q in queues) == n)
        return bodies
    finally:
        transport.close()


def consume_all(server: ServerProcess, topic: str, group: str, expected: int) -> list[bytes]:
    transport = reliable.connect("grpc", endpoint=server.endpoint)
    transport.start()
    got: list[bytes] = []
    try:
        with SimpleConsumer(
            group, {topic: "*"}, transport=transport, await_duration_s=1, invisible_duration_s=30
        ) as consumer:

            def drained() -> bool:
                for msg in consumer.receive(max_messages=32):
                    consumer.ack(msg)
                    got.append(msg.body)
                return len(got) >= expected

            official.wait_for(drained, timeout_s=30, interval_s=0)
            for msg in consumer.receive(max_messages=32):  # nothing more (no duplicate)
                got.append(msg.body)
    finally:
        transport.close()
    return got


def flip(path: Path, at: int, mask: int = 0x10) -> None:
    with path.open("r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ mask]))


def verify(store: Path) -> tuple[int, dict[str, Any]]:
    done = cli("admin", "store", "verify", "--store", str(store), "--json")
    return done.returncode, json.loads(done.stdout)


def test_flipped_bits_in_stopped_consume_queues_lose_nothing(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    server = make_server(store=store)
    bodies = send(server, "t-cq-flip", 40)
    assert server.terminate() == 0
    assert verify(store)[0] == 0
    files = {p.parent.name: p for p in (store / "consumequeue" / "t-cq-flip").glob("*/*")}
    assert len(files) == 4
    q0, q1, q2 = files["0"], files["1"], files["2"]
    flip(q0, 2 * UNIT.size + 7)  # unit 2's commitlog offset: no longer a record start
    flip(q1, 1 * UNIT.size + 11, 0x01)  # unit 1's size
    flip(q2, 3 * UNIT.size + 1, 0x7F)  # unit 3 points far ahead: offsets go backwards
    code, report = verify(store)
    assert code == 1
    damaged = {(p["file"], p["offset"]) for p in report["problems"]}
    assert {
        (str(q.relative_to(store)), at) for q, at in ((q0, 40), (q1, 20), (q2, 60))
    } <= damaged, report
    again = make_server(store=store)
    got = consume_all(again, "t-cq-flip", "g-cq-flip", len(bodies))
    assert sorted(got) == sorted(bodies)  # every message, once
    assert "rebuilding it from the commitlog" in "".join(again.output)
    assert again.terminate() == 0
    assert verify(store)[0] == 0


def test_a_last_unit_pointing_past_the_log_does_not_cut_its_queue(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """After a clean stop no unit can point past the commitlog's end: such a last unit is
    damage, not a crash's cut-off tail. Cutting it (and re-dispatching only from the
    furthest queue) would lose its record for good."""
    store = tmp_path / "store"
    server = make_server(store=store)
    bodies = send(server, "t-cq-last", 40)
    assert server.terminate() == 0

    def last_unit(path: Path) -> int:
        used = len(path.read_bytes().rstrip(b"\0"))  # the last unit's tags code is 0
        return (used + UNIT.size - 1) // UNIT.size - 1

    queues = list((store / "consumequeue" / "t-cq-last").glob("*/*"))
    # the queue whose last record is the earliest: other queues' records come after it
    victim = min(
        queues, key=lambda p: UNIT.unpack_from(p.read_bytes(), last_unit(p) * UNIT.size)[0]
    )
    flip(victim, last_unit(victim) * UNIT.size + 5, 0x40)  # 4 MiB further: past the end
    again = make_server(store=store)
    got = consume_all(again, "t-cq-last", "g-cq-last", len(bodies))
    assert sorted(got) == sorted(bodies)
    assert again.terminate() == 0
    assert verify(store)[0] == 0


def test_a_unit_damaged_while_serving_is_repaired_on_read(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    server = make_server(store=store)
    bodies = send(server, "t-cq-live", 24)
    # the server maps this file: the write lands in the same page cache it reads
    q0 = next((store / "consumequeue" / "t-cq-live").glob("0/*"))
    flip(q0, 1 * UNIT.size + 6)
    got = consume_all(server, "t-cq-live", "g-cq-live", len(bodies))
    assert sorted(got) == sorted(bodies)
    assert "repairing the queue from the commitlog" in "".join(server.output)
    assert server.terminate() == 0
    assert verify(store)[0] == 0


def test_a_queue_deleted_with_its_registry_is_rebuilt(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    server = make_server(store=store)
    bodies = send(server, "t-cq-gone", 32)
    assert server.terminate() == 0
    shutil.rmtree(store / "consumequeue" / "t-cq-gone" / "1")
    shutil.rmtree(store / "consumequeue" / "t-cq-gone" / "3")
    (store / "consumequeue.json").unlink()
    (store / "consumequeue.json.bak").unlink(missing_ok=True)
    code, report = verify(store)
    assert code == 1 and any("missing" in p["problem"] for p in report["problems"])
    again = make_server(store=store)
    got = consume_all(again, "t-cq-gone", "g-cq-gone", len(bodies))
    assert sorted(got) == sorted(bodies)
    assert again.terminate() == 0
    assert verify(store)[0] == 0


def test_corrupt_record_bytes_are_caught_by_the_checksum(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    server = make_server(store=store)
    bodies = send(server, "t-rec-flip", 8)
    log = next((store / "commitlog").iterdir())
    data = log.read_bytes()
    # a byte of one message's properties (its unique key), which the body CRC never
    # covered; written while the server runs (it maps the file: same page cache)
    victim = data.index(b"t-rec-flip-3")
    props_at = data.index(b"UNIQ_CLIENT_MESSAGE_ID_KEYIDX\x01", victim)
    flip(log, props_at + len("UNIQ_CLIENT_MESSAGE_ID_KEYIDX") + 3, 0x01)
    got = consume_all(server, "t-rec-flip", "g-rec-flip", len(bodies) - 1)
    assert sorted(got) == sorted(bodies - {b"t-rec-flip-3"})  # not served as if intact
    assert "fails its checksum" in "".join(server.output)
    assert server.terminate() == 0
    done = cli("admin", "store", "verify", "--store", str(store))
    assert done.returncode == 1
    line = next(line for line in done.stdout.splitlines() if "checksum" in line)
    assert line.startswith(f"commitlog/{log.name} @")
    record_at = int(line.split("@")[1].split(":")[0])
    # the next start finds it too (clean-stop recovery rescans the last files): its frame
    # holds, so it is quarantined (kept, logged, never served) and the broker starts
    again = make_server(store=store)
    out = "".join(again.output)
    assert f"the record at offset {record_at} is damaged" in out and "quarantined" in out
    assert "Traceback" not in out
    extra = {b"after-1", b"after-2"}  # and it goes on serving new sends
    transport = reliable.connect("grpc", endpoint=again.endpoint)
    transport.start()
    try:
        with Producer(transport) as producer:
            for body in sorted(extra):
                producer.send(Message("t-rec-flip", body))
    finally:
        transport.close()
    got = consume_all(again, "t-rec-flip", "g-rec-flip-2", len(bodies) - 1 + len(extra))
    assert sorted(got) == sorted((bodies - {b"t-rec-flip-3"}) | extra)
    assert again.terminate() == 0
    done = cli("admin", "store", "verify", "--store", str(store))
    assert done.returncode == 1  # still named, at the same place, and nothing else
    found = [line for line in done.stdout.splitlines() if "@" in line]
    assert any(line.startswith(f"commitlog/{log.name} @{record_at}: ") for line in found)
    # (an index entry of its key no longer matches the damaged key: the same damage)
    assert all(
        line.startswith(f"commitlog/{log.name} @{record_at}: ")
        or line.endswith(f"the record's at {record_at}")
        for line in found
    ), found


def test_a_record_whose_frame_is_damaged_refuses_the_start_in_one_line(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    server = make_server(store=store)
    send(server, "t-frame", 8)
    assert server.terminate() == 0
    log = next((store / "commitlog").iterdir())
    data = log.read_bytes()
    victim = data.index(b"t-frame-3")
    record_at = data.rindex(b"\xda\xa3\x20", 0, victim) - 4  # its TOTALSIZE, then magic
    flip(log, record_at + 2, 0x40)  # the size no longer leads to the next record
    # below what was flushed and not skippable: refused, one line naming file and offset
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "reliable_cli",
            "broker",
            "start",
            "--store",
            str(store),
            "--port",
            "0",
            *TEST_STORE,
        ],
        env=dict(os.environ, HOME=str(tmp_path)),
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert again.returncode != 0 and "Traceback" not in again.stderr
    assert f"{log.name}: corrupt at offset {record_at}" in again.stderr
    assert not (store / "abort").exists()
