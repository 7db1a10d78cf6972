"""The production topology, every part its own process, for the end-to-end tests of it.

A database of its own on the real PostgreSQL; a served broker (`reliable broker start`); one
`reliable consume` process per consumer group (tests/e2e/grpc/topology_handlers.py); the
resend worker started as the README shows it (`reliable worker resend --db URL --sender
module:producer`, tests/e2e/grpc/resend_wiring.py); `reliable reconcile` on real local
Spark. The application publishing through the outbox is the test process itself.

Every client process reaches the broker over the wire the test chose: `--wire` for
`reliable consume`, `RELIABLE_WIRE` for the others (docs/wire.md); the server always offers
its native wire, so a process that chose gRPC could have used it and did not.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from outbox import Outbox, OutboxConfig, OutboxTables, declare_groups
from outbox.adapters import TransportOffsets
from outbox.ports import utcnow
from reliable import Message, Producer
from tests.conftest import POSTGRES_URL, REDIS_URL
from tests.e2e.grpc.server_process import REPO, ServerProcess

RELIABLE = str(Path(sys.executable).with_name("reliable"))  # the console script pip installed
HANDLERS = "tests.e2e.grpc.topology_handlers"
SENDER = "tests.e2e.grpc.resend_wiring:producer"  # a module-level Producer, as the README's
EFFECTS = "topology_effects"

SERVER = (
    "--min-invisible-ms",
    "1000",
    "--long-polling-ms",
    "1000",
    "--min-long-polling-ms",
    "500",
    "--default-invisible-ms",  # a push consumer's lease the server renews while it lives
    "5000",
    "--delay-levels",
    "1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s",
)


def wait_for(what: str, predicate: Callable[[], bool], timeout_s: float) -> None:
    """Poll `predicate` until it holds; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


class Child:
    """A `reliable ...` process; its stdout and stderr go to files (never a full pipe)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], logs: Path) -> None:
        self.name = name
        self.out, self.err = logs / f"{name}.out", logs / f"{name}.err"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(
                [RELIABLE, *argv], cwd=REPO, env=env, stdout=out, stderr=err, text=True
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stdout(self) -> str:
        return self.out.read_text()

    def output(self) -> str:
        return f"--- {self.name} stdout\n{self.stdout()}--- {self.name} stderr\n" + (
            self.err.read_text()
        )

    def wait_for_line(self, text: str, timeout_s: float = 60) -> None:
        def said() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n{self.output()}")
            return text in self.stdout()

        wait_for(f"{self.name} to say {text!r}", said, timeout_s)

    def terminate(self, timeout_s: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def connections(pid: int, port: int) -> int:
    """Established TCP connections of process `pid` to `port` (read from /proc: the
    process's socket inodes against the kernel's connection table)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if fields[3] == "01" and remote_port == port and fields[9] in inodes:
                found += 1
    return found


class Topology:
    """One run: its database, broker, consumer processes, worker and reconciliations."""

    def __init__(self, tmp_path: Path, wire: str, *server_args: str, delay_s: float = 0) -> None:
        run = uuid.uuid4().hex[:8]
        self.tmp, self.wire = tmp_path, wire
        self.topic = f"topo-orders-{run}"
        self.group_a, self.group_b = f"topo-inventory-{run}", f"topo-billing-{run}"
        self.out = tmp_path / "deliveries"
        self.out.mkdir()
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        self.children: list[Child] = []
        self.server_args = (*SERVER, *server_args)
        self.delay_s = delay_s

        # a database of the run's own, so every command runs with its default tables
        self.dbname = f"topology_{run}"
        self.admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{self.dbname}"'))
        url = sa.make_url(POSTGRES_URL).set(database=self.dbname)
        self.engine = sa.create_engine(url, pool_pre_ping=True)
        # the URL as the docs write it (no driver named): every command reads it the same way
        self.url = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self.tables = OutboxTables()
        self.tables.create_all(self.engine)
        self.effects = sa.Table(
            EFFECTS,
            sa.MetaData(),
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("message_id", sa.String(64), nullable=False),  # not unique: doubles show
            sa.Column("consumer_group", sa.String(128), nullable=False),
        )
        self.effects.create(self.engine)
        declare_groups(self.engine, self.tables, self.topic, [self.group_a, self.group_b])

        (tmp_path / "home").mkdir()
        self.server = ServerProcess(
            tmp_path / "store", tmp_path / "home", *self.server_args, "--wire-port", "0"
        )
        self.producer: Producer | None = None

    def start(self) -> Topology:
        """Start the broker and the application's producer."""
        self.server.start()
        self.wire_port = self.server.wire_port
        assert self.wire_port, "".join(self.server.output)
        self.producer = Producer(
            "grpc",
            endpoint=self.server.endpoint,
            wire=self.wire,
            retry_times_when_send_failed=1,
            flow_control_retries=0,
            # a send while the broker is down fails at once (the stub waits for the resend
            # worker), instead of holding commit() through the failover wait
            failover_wait_s=0,
        ).start()
        self.offsets = TransportOffsets(self.producer.transport)
        self.outbox = Outbox(
            self.tables,
            self.producer,
            config=OutboxConfig(
                resend_after=timedelta(seconds=1), retry_after_failure=timedelta(0)
            ),
        )
        return self

    # --- processes
    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ, RELIABLE_WIRE=self.wire, **extra)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env.update(
            RELIABLE_DATABASE_URL=self.url,
            RELIABLE_REDIS_URL=REDIS_URL,
            TOPOLOGY_TOPIC=self.topic,
            TOPOLOGY_GROUP_A=self.group_a,
            TOPOLOGY_GROUP_B=self.group_b,
            TOPOLOGY_EFFECTS=EFFECTS,
            TOPOLOGY_OUT=str(self.out),
            TOPOLOGY_DELAY_S=str(self.delay_s),
            TOPOLOGY_LEASE_S="3",
            RESEND_WIRING_ENDPOINT=self.server.endpoint,
        )
        return env

    def consume(self, handler: str) -> Child:
        """`reliable consume tests.e2e.grpc.topology_handlers:HANDLER --endpoint ... --wire
        ...`, started (its line "consuming ..." said)."""
        child = Child(
            f"{handler}-{len(self.children)}",
            [
                "consume",
                f"{HANDLERS}:{handler}",
                "--endpoint",
                self.server.endpoint,
                "--wire",
                self.wire,
            ],
            self.env(),
            self.logs,
        )
        self.children.append(child)
        return child

    def worker(self) -> Child:
        """The resend worker as the README starts it: `reliable worker resend --db URL
        --sender module:producer` (offsets: the sender's broker), `--json` for its counts."""
        child = Child(
            f"worker-{len(self.children)}",
            ["worker", "resend", "--db", self.url, "--sender", SENDER, "--json"],
            self.env(),
            self.logs,
        )
        self.children.append(child)
        return child

    def restart_server(self) -> None:
        """SIGKILL the broker, then start it again on the same store and ports."""
        self.server.kill()
        self.server = ServerProcess(
            self.tmp / "store",
            self.tmp / "home",
            *self.server_args,
            "--wire-port",
            str(self.wire_port),
            port=self.server.port,
        ).start()

    def reconcile(self, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                RELIABLE,
                "reconcile",
                "--db",
                self.url,
                "--offsets",
                f"grpc:{self.server.endpoint}",
                "--conf",
                "spark.sql.shuffle.partitions=2",
                *extra,
            ],
            cwd=REPO,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=240,
        )

    # --- the application
    def publish(self, n: int) -> list[str]:
        """`n` orders, each published through the outbox in its own transaction."""
        ids = []
        for i in range(n):
            with Session(self.engine) as session, session.begin():
                ids.append(self.outbox.publish(session, Message(self.topic, f"order {i}".encode())))
        return ids

    # --- what happened
    def effects_by_group(self) -> dict[str, collections.Counter[str]]:
        """Per group, how many effect rows each message id has."""
        found: dict[str, collections.Counter[str]] = {
            self.group_a: collections.Counter(),
            self.group_b: collections.Counter(),
        }
        with self.engine.connect() as conn:
            for mid, group in conn.execute(
                sa.select(self.effects.c.message_id, self.effects.c.consumer_group)
            ):
                found.setdefault(group, collections.Counter())[mid] += 1
        return found

    def deliveries(self, name: str) -> list[tuple[str, int]]:
        """`(message id, send count)` of every copy handed to a handler, from
        `<group>.deliveries` (guarded) or `<group>.careless`."""
        path = self.out / name
        if not path.exists():
            return []
        return [(mid, int(n)) for mid, n in (ln.split() for ln in path.read_text().splitlines())]

    def stubs(self) -> dict[str, Any]:
        t = self.tables.stub
        with self.engine.connect() as conn:
            return {
                row.message_id: row
                for row in conn.execute(
                    sa.select(
                        t.c.message_id,
                        t.c.status,
                        t.c.send_count,
                        t.c.queue_id,
                        t.c.queue_offset,
                        t.c.next_resend_at,
                        t.c.group_positions,
                        t.c.escalated_at,
                    )
                )
            }

    def passed(self, group: str, ids: set[str]) -> bool:
        """The broker's committed offset of `group` is past the first copy of each of `ids`
        (what the worker and reconciliation read as "passed")."""
        stubs = self.stubs()
        return all(
            (self.offsets.committed_offset(group, self.topic, stubs[m].queue_id) or 0)
            > stubs[m].queue_offset
            for m in ids
        )

    def positions(self, group: str, ids: set[str]) -> dict[int, tuple[int | None, int]]:
        """Per queue: the group's committed offset and one past the last copy of `ids`."""
        stubs = self.stubs()
        ends: dict[int, int] = {}
        for m in ids:
            ends[stubs[m].queue_id] = max(ends.get(stubs[m].queue_id, 0), stubs[m].queue_offset + 1)
        return {
            q: (self.offsets.committed_offset(group, self.topic, q), end)
            for q, end in sorted(ends.items())
        }

    def due(self) -> bool:
        now = utcnow()
        return all(
            s.next_resend_at is None or s.next_resend_at <= now for s in self.stubs().values()
        )

    def close(self) -> None:
        for child in self.children:
            child.kill()
        if self.producer is not None:
            self.producer.shutdown()
        self.server.kill()
        self.engine.dispose()
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)'))
        self.admin.dispose()


def worker_events(child: Child) -> list[dict[str, Any]]:
    """The JSON lines `reliable worker resend --json` printed."""
    return [json.loads(ln) for ln in child.stdout().splitlines() if ln.startswith("{")]
