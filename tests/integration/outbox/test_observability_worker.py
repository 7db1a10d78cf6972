"""`reliable worker resend --metrics-port` as a real process on a real PostgreSQL database:
its counts after a known workload, and /readyz when the database is dropped under it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from outbox_testkit import RecordingSender
from sqlalchemy.orm import Session

from outbox import Outbox
from outbox.models import OutboxTables
from outbox.schema import ensure_schema
from reliable import Message
from tests.conftest import POSTGRES_URL
from tests.e2e.grpc.scrape import metrics_url, probe, scrape, wait_for

pytestmark = pytest.mark.postgres

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
STUBS = 4


@pytest.fixture
def own_database() -> Iterator[str]:
    """A database of this test alone, so that it can be dropped while the worker runs."""
    name = f"obs_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    try:
        yield POSTGRES_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


def test_worker_metrics_and_readyz_when_the_database_is_dropped(own_database: str) -> None:
    prefix = "obs_"
    engine = sa.create_engine(own_database)
    tables = OutboxTables(prefix=prefix)
    ensure_schema(engine, tables)
    sender = RecordingSender(engine, prefix)
    sender.fail_all = True  # published, never sent: every stub is due for a resend
    outbox = Outbox(tables, sender, clock=lambda: datetime(2000, 1, 1))
    with Session(engine) as session, session.begin():
        ids = [outbox.publish(session, Message(topic="T", body=b"x")) for _ in range(STUBS)]
    sender.fail_all = False
    engine.dispose()

    env = {
        **os.environ,
        "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}",
        "OUTBOX_TEST_DB": own_database,
        "OUTBOX_TEST_PREFIX": prefix,
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reliable_cli",
            "worker",
            "resend",
            "--db",
            own_database,
            "--table-prefix",
            prefix,
            "--sender",
            "outbox_testkit:sender_from_env",
            "--offsets",
            "outbox_testkit:FixedOffsets",
            "--interval",
            "0.2",
            "--metrics-port",
            "0",
            "--log-format",
            "json",
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out: list[str] = []
    err: list[str] = []
    for stream, sink in ((proc.stdout, out), (proc.stderr, err)):

        def pump(stream=stream, sink=sink) -> None:  # type: ignore[no-untyped-def]
            for line in stream:
                sink.append(line)

        threading.Thread(target=pump, daemon=True).start()
    try:
        url = metrics_url(out)
        wait_for(
            lambda: scrape(url).value("reliable_outbox_resends_total") == STUBS,
            30,
            "every stub resent",
        )
        s = scrape(url)
        assert s.value("reliable_outbox_up") == 1
        assert s.value("reliable_outbox_stubs", status="unconfirmed") == STUBS
        assert s.value("reliable_outbox_stubs", status="confirmed") == 0
        assert s.value("reliable_outbox_oldest_unconfirmed_age_seconds") > 365 * 86400
        assert s.value("reliable_outbox_escalations_total") == 0
        assert s.value("reliable_outbox_resend_errors_total") == 0
        assert s.value("reliable_outbox_resend_passes_total") >= 1
        assert sender.counts() == dict.fromkeys(ids, 1)
        code, body = probe(url, "/readyz")
        assert code == 200 and body["checks"]["database"] == {"ok": True}, body

        # the database goes away for real
        admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE {own_database.rsplit('/', 1)[1]} WITH (FORCE)"))
        admin.dispose()
        wait_for(lambda: probe(url, "/readyz")[0] == 503, 15, "readyz 503")
        assert probe(url, "/readyz")[1]["checks"]["database"] == {"ok": False}
        assert scrape(url).value("reliable_outbox_up") == 0
        assert probe(url, "/healthz")[0] == 200
        # the worker keeps trying, a line per failed pass
        wait_for(lambda: any("pass failed" in line for line in err), 15, "a failed pass")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    records = [json.loads(line) for line in err if line.strip()]
    failed = [r for r in records if "pass failed" in r["message"]]
    assert failed and all(r["level"] == "WARNING" and "exception" not in r for r in failed)
