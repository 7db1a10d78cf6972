"""`reliable worker resend` as its own process, started exactly as the README shows it:
`reliable worker resend --db URL --sender module:producer`, the module holding a
module-level `Producer` that nobody started.

Against a served broker (`reliable broker start`, a real process) the worker starts the
producer and resends; once the broker is gone its sends fail and `--once` exits 1 with one
line. With an embedded broker whose store the application holds, the worker says in one
line why it cannot share the store and what to run instead (no traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import Session

from outbox import Outbox, OutboxTables, declare_groups
from reliable import Message, Producer, SimpleConsumer, connect
from reliable_cli.exit_codes import ExitCode
from tests.e2e.grpc.server_process import REPO, ServerProcess

RELIABLE = str(Path(sys.executable).with_name("reliable"))  # the console script pip installed


class _Unsent:
    """The application's first send was lost: every stub is left for the worker."""

    def send(self, message: Message) -> object:
        raise ConnectionError("the first send was lost")


def _unsent_stubs(engine: sa.Engine, tables: OutboxTables, topic: str, n: int) -> set[str]:
    outbox = Outbox(tables, _Unsent(), clock=lambda: datetime(2000, 1, 1))  # long due
    with Session(engine) as session, session.begin():
        return {outbox.publish(session, Message(topic, f"order {i}".encode())) for i in range(n)}


def _worker(db: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = dict(os.environ, **env)
    environ["PYTHONPATH"] = str(REPO) + os.pathsep + environ.get("PYTHONPATH", "")
    return subprocess.run(
        [
            RELIABLE,
            "worker",
            "resend",
            "--db",
            db,
            "--sender",
            "tests.e2e.grpc.resend_wiring:producer",
            *args,
        ],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_readme_worker_starts_a_module_level_producer_and_resends(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = make_server()
    db = f"sqlite:///{tmp_path / 'app.db'}"
    engine = sa.create_engine(db)
    tables = OutboxTables()
    tables.create_all(engine)
    run = uuid.uuid4().hex[:8]
    topic, group = f"resend-proc-{run}", f"resend-proc-billing-{run}"
    declare_groups(engine, tables, topic, [group])
    ids = _unsent_stubs(engine, tables, topic, 3)
    transport = connect("grpc", endpoint=server.endpoint)
    transport.start()
    try:
        with SimpleConsumer(
            group, {topic: "*"}, transport=transport, await_duration_s=1, invisible_duration_s=15
        ) as consumer:
            consumer.receive(max_messages=1)  # the group exists before the resends

            done = _worker(db, "--once", "--json", RESEND_WIRING_ENDPOINT=server.endpoint)
            assert done.returncode == ExitCode.OK, done.stderr
            report = json.loads(done.stdout.strip().splitlines()[-1])
            assert (report["selected"], report["resent"], report["errors"]) == (3, 3, 0)
            received: set[str] = set()
            for _ in range(30):
                for msg in consumer.receive(max_messages=16):
                    received.add(msg.message_id)
                    consumer.ack(msg)
                if received >= ids:
                    break
            assert received == ids  # the resends reached the broker, each message once
    finally:
        transport.close()

    # the broker is gone: the next pass's sends fail, and --once exits non-zero, in one line
    assert server.terminate() == 0
    with engine.begin() as conn:
        conn.execute(sa.update(tables.stub).values(next_resend_at=datetime(2000, 1, 1)))
    failed = _worker(db, "--once", "--json", RESEND_WIRING_ENDPOINT=server.endpoint)
    assert failed.returncode == ExitCode.FAILURE, failed.stdout + failed.stderr
    report = json.loads(failed.stdout.strip().splitlines()[-1])
    assert (report["selected"], report["resent"], report["errors"]) == (3, 0, 3)
    assert "Traceback" not in failed.stderr
    assert failed.stderr.strip().splitlines()[-1] == (
        "reliable worker resend: 3 of 3 stubs failed this pass (each keeps its "
        "last_error: reliable outbox list --status UNCONFIRMED)"
    )
    engine.dispose()


def test_a_worker_process_on_an_embedded_store_says_why_in_one_line(tmp_path: Path) -> None:
    store = tmp_path / "store"
    db = f"sqlite:///{tmp_path / 'app.db'}"
    engine = sa.create_engine(db)
    tables = OutboxTables()
    tables.create_all(engine)
    _unsent_stubs(engine, tables, "embedded-orders", 1)
    spent = sa.select(tables.stub.c.send_count, tables.stub.c.last_error)
    with engine.connect() as conn:
        before = conn.execute(spent).one()
    # the application: its process embeds the broker and holds the store
    with Producer("embedded", store_dir=str(store)):
        result = _worker(db, "--once", RESEND_WIRING_STORE=str(store))
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"reliable worker resend: the embedded broker's store {store}")
    assert "open in another process" in line
    assert "run the resend worker inside that process" in line
    assert "reliable broker start" in line
    with engine.connect() as conn:  # nothing was spent on the refusal
        assert conn.execute(spent).one() == before
    engine.dispose()
