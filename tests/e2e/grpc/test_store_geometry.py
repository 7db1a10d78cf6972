"""A store's file sizes are its own: any opener (`reliable broker start`, `reliable admin
--store`, `connect("embedded")`) reads them from the store, whatever its own defaults.

And a new embedded store says where it is and how big, with small development sizes unless
production sizes are asked for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import reliable
from broker.store.config import DEVELOPMENT_GEOMETRY, GEOMETRY_FILE
from reliable import Message, Producer, SimpleConsumer
from tests.e2e.grpc.server_process import REPO, ServerProcess
from tests.e2e.grpc.test_cli import as_json, cli


def _drain(transport: reliable.Transport, topic: str, group: str) -> list[bytes]:
    bodies: list[bytes] = []
    with SimpleConsumer(
        group, {topic: "*"}, transport=transport, await_duration_s=0.5, invisible_duration_s=30
    ) as consumer:
        while batch := consumer.receive(max_messages=32):
            for m in batch:
                bodies.append(m.body)
                consumer.ack(m)
    return bodies


def test_a_demo_store_opens_everywhere(
    tmp_path: Path, make_server: Callable[..., ServerProcess]
) -> None:
    store = tmp_path / "demo-store"
    done = cli("demo", "--store-only", "--store", str(store), "--messages", "40")
    assert done.returncode == 0, done.stdout + done.stderr
    geometry = json.loads((store / GEOMETRY_FILE).read_text())
    assert geometry["mapped_file_size_commitlog"] == 16 << 20  # not the 1 GiB default

    # the store demo writes through the store alone: no topic configuration, but it opens
    assert as_json(cli("admin", "topic", "list", "--store", str(store), "--json")) == {"topics": []}
    # and `verify` checks it against its own geometry, not the configured defaults
    verified = cli("admin", "store", "verify", "--store", str(store))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert ": OK (checked" in verified.stdout

    # the server is told 8 MiB commitlog files (TEST_STORE): the store's 16 MiB win
    server = make_server(store=store)
    transport = reliable.connect("grpc", endpoint=server.endpoint)
    transport.start()
    try:
        with Producer(transport) as producer:
            producer.send(Message("OrderCreated", b"served"))
    finally:
        transport.close()
    assert server.terminate() == 0, "".join(server.output)
    output = "".join(server.output)
    assert "ForeignFile" not in output
    assert "keeps its own commitlog file size (16777216 bytes)" in output, output
    assert "created a new store" not in output, output

    # without the geometry file (a store made before it existed) the sizes are inferred
    (store / GEOMETRY_FILE).unlink()
    embedded = reliable.connect("embedded", store_dir=store)
    embedded.start()
    try:
        bodies = _drain(embedded, "OrderCreated", "geometry-g")
    finally:
        embedded.close()
    assert len(bodies) == 41 and b"served" in bodies
    assert json.loads((store / GEOMETRY_FILE).read_text()) == geometry


def test_broker_start_says_where_and_how_big_a_new_store_is(
    tmp_path: Path, make_server: Callable[..., ServerProcess]
) -> None:
    server = make_server(store=tmp_path / "fresh")
    assert server.terminate() == 0
    assert (
        f"reliable broker: created a new store at {tmp_path / 'fresh'} (commitlog files "
        "of 8 MiB; its first files take up to"
    ) in "".join(server.output), server.output


def test_a_new_default_store_says_where_and_how_big(tmp_path: Path) -> None:
    env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=str(REPO))
    code = (
        "import reliable\n"
        "t = reliable.connect('embedded'); t.start()\n"
        "from reliable import Message, Producer\n"
        "with Producer(t) as p: p.send(Message('dev', b'x'))\n"
        "t.close()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, text=True, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    store = tmp_path / ".reliable" / "store"
    assert str(store) in done.stderr and "64 MiB" in done.stderr, done.stderr
    assert "store_dir=" in done.stderr and "production" in done.stderr
    assert [p.stat().st_size for p in (store / "commitlog").iterdir()] == [
        DEVELOPMENT_GEOMETRY["mapped_file_size_commitlog"]
    ]
    # opened again, it says nothing: it is not new
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, text=True, capture_output=True, timeout=60
    )
    assert done.returncode == 0 and "new development store" not in done.stderr, done.stderr

    # production sizes are one keyword away, and an existing store keeps its own
    prod = tmp_path / "prod"
    t = reliable.connect("embedded", store_dir=prod, geometry="production")
    t.start()
    t.close()
    assert json.loads((prod / GEOMETRY_FILE).read_text())["mapped_file_size_commitlog"] == 1 << 30
