"""The `reliable` command's small answers, run as a user runs it (a real process, a real
pipe): a query of a topic or queue that is not there says so, an offset reset past the end
warns that it clamped, `--version`, `--endpoint HOST` dials the default port, output piped
into `head` ends quietly, and a group's settings name no mode gRPC cannot serve."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import reliable
from broker.broker import Broker
from broker.config import DEFAULT_PORT, with_default_port
from broker.store.config import WATERMARKS_OFF, StoreConfig
from broker.store.message import Message
from protocol.props import Prop
from reliable_cli.exit_codes import ExitCode

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
RELIABLE = [sys.executable, "-m", "reliable_cli"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RELIABLE, *args], cwd=ROOT, env=ENV, text=True, capture_output=True, timeout=120
    )


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A stopped store: topic `orders` (2 queues; queue 1 holds 3 messages of 64 KiB each,
    queue 0 none) and group `billing`."""
    path = tmp_path / "store"
    broker = Broker(StoreConfig(store_dir=path, **WATERMARKS_OFF))  # the command's geometry
    broker.start()
    try:
        broker.create_topic("orders", queues=2)
        broker.create_group("billing")
        for i in range(3):
            broker.send_message(
                Message(
                    topic="orders",
                    body=b"x" * 65_536,
                    queue_id=1,
                    properties={Prop.UNIQ_KEY: f"M{i}", Prop.KEYS: f"order-{i}"},
                )
            )
        assert broker.store.wait_dispatched(10)
    finally:
        broker.shutdown()
    return path


def test_a_query_of_a_missing_topic_or_queue_says_so(store: Path) -> None:
    at = ("--store", str(store))
    for form in (
        ("--topic", "nowhere", "--queue", "0", "--offset", "0"),
        ("--key", "k", "--topic", "nowhere"),
        ("--unique-key", "k", "--topic", "nowhere"),
        ("--topic", "nowhere", "--since", "1h"),
    ):
        done = cli("admin", "message", "query", *form, *at)
        assert done.returncode == ExitCode.FAILURE, form
        assert done.stderr.strip().splitlines() == [
            "reliable admin: TOPIC_NOT_FOUND: topic 'nowhere' does not exist"
        ], form
    for form in (
        ("--topic", "orders", "--queue", "2", "--offset", "0"),
        ("--topic", "orders", "--queue", "9", "--since", "1h"),
    ):
        done = cli("admin", "message", "query", *form, *at)
        assert done.returncode == ExitCode.USAGE, form
        assert "is out of range: topic 'orders' has queues 0..1" in done.stderr, form
    # a queue that exists, past its end: there is simply no message
    empty = cli(
        "admin", "message", "query", "--topic", "orders", "--queue", "0", "--offset", "5", *at
    )
    assert empty.returncode == 1 and "no message found" in empty.stderr
    [found] = json.loads(
        cli(
            "admin",
            "message",
            "query",
            "--topic",
            "orders",
            "--queue",
            "1",
            "--offset",
            "2",
            "--json",
            *at,
        ).stdout
    )["messages"]
    assert (found["queue_id"], found["queue_offset"]) == (1, 2)


def test_an_offset_reset_past_the_end_warns_that_it_clamped(store: Path) -> None:
    reset = (
        "admin",
        "group",
        "reset-offset",
        "billing",
        "--topic",
        "orders",
        "--store",
        str(store),
    )
    done = cli(*reset, "--to-offset", "10", "--execute", "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines() == [
        "reliable admin: warning: --to-offset 10 is past the end of queue(s) 0 (max 0), "
        "1 (max 3): clamped to each one's max offset"
    ]
    queues = json.loads(done.stdout)["queues"]
    assert [(q["after"], q["clamped"]) for q in queues] == [(0, "end"), (3, "end")]
    inside = cli(*reset, "--to-offset", "0", "--dry-run")
    assert inside.returncode == 0 and "warning" not in inside.stderr
    assert "would reset group billing on orders to 0" in inside.stdout  # 0 is an offset too
    one = cli(*reset, "--to-offset", "2", "--dry-run")
    assert "past the end of queue(s) 0 (max 0): clamped" in one.stderr


def test_version() -> None:
    done = cli("--version")
    assert done.returncode == 0 and done.stdout == f"reliable {reliable.__version__}\n"


def test_an_endpoint_without_a_port_dials_the_default_port() -> None:
    assert DEFAULT_PORT == 8081
    assert with_default_port("localhost") == "localhost:8081"
    assert with_default_port("10.0.0.1;10.0.0.2:9000") == "10.0.0.1:8081;10.0.0.2:9000"
    assert with_default_port("[::1]") == "[::1]:8081"
    for kept in ("localhost:443", "::1", "dns:///broker.internal:8081", "[::1]:9"):
        assert with_default_port(kept) == kept
    done = cli("admin", "topic", "status", "orders", "--endpoint", "localhost")
    if done.returncode == ExitCode.UNAVAILABLE:  # nothing listens there: the error names it
        assert "localhost:8081: UNAVAILABLE" in done.stderr
    else:  # a broker does listen on the default port
        assert ":443" not in done.stderr


def test_json_piped_into_head_ends_quietly(store: Path) -> None:
    """More output than a pipe holds, read one line of: no BrokenPipe traceback."""
    query = [
        *RELIABLE,
        "admin",
        "message",
        "query",
        "--topic",
        "orders",
        "--since",
        "1d",
        "--body",
        "--json",
        "--store",
        str(store),
    ]
    full = subprocess.run(query, cwd=ROOT, env=ENV, capture_output=True, timeout=120)
    assert full.returncode == 0 and len(full.stdout) > 2 * 64 * 1024  # more than a pipe holds
    writer = subprocess.Popen(
        query, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert writer.stdout is not None
    head = subprocess.run(["head", "-c", "1"], stdin=writer.stdout, capture_output=True)
    writer.stdout.close()  # only head holds the pipe's read end: it exits, the pipe closes
    _, err = writer.communicate(timeout=120)
    assert head.stdout == b"{"
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()
    assert writer.returncode == ExitCode.OUTPUT_CLOSED


def test_a_group_answer_names_no_mode_grpc_cannot_serve(store: Path) -> None:
    done = cli("admin", "group", "create", "audit", "--store", str(store))
    assert done.returncode == 0, done.stderr
    assert "name=audit" in done.stdout and "broadcast" not in done.stdout


def test_a_wrong_sqlite_path_is_refused_not_created_empty(tmp_path: Path, store: Path) -> None:
    place = tmp_path / "db"
    place.mkdir()
    for path, reason in (
        (place / "no-such-dir" / "shop.db", "no such directory"),
        (place / "typo.db", "no such SQLite database file"),
    ):
        url = f"sqlite:///{path}"
        for command in (
            ("outbox", "list"),
            ("admin", "message", "trace", "order-0", "--store", str(store)),
        ):
            done = cli(*command, "--db", url)
            assert done.returncode == ExitCode.USAGE, (command, done.stderr)
            assert f"--db: {url}: {reason}" in done.stderr, (command, done.stderr)
    assert list(place.iterdir()) == []  # nothing was created


def test_the_sqlite_check_passes_what_is_not_a_missing_file(tmp_path: Path) -> None:
    from outbox.database import DatabaseUrlError, require_existing_sqlite

    there = tmp_path / "shop.db"
    there.write_bytes(b"")
    for url in (
        f"sqlite:///{there}",
        "sqlite://",
        "sqlite:///:memory:",
        "postgresql://u@h/db",
        "sqlite:///file:shop?mode=memory&uri=true",
    ):
        require_existing_sqlite(url)
    with pytest.raises(DatabaseUrlError):
        require_existing_sqlite(f"sqlite:///{tmp_path / 'other.db'}")
