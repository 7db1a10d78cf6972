"""The zero-loss certificate over the served topology: a real `reliable broker start`
process, outbox publish over the grpc transport, a consumer, the resend worker
(`reliable worker resend`, a real process) and `reliable reconcile` (real local Spark).

Our server says which queue each send went to, so a stub sent over gRPC records its queue
and offset as on the embedded path, and both the worker and the certificate judge it by the
group's committed offset (asked live: `--offsets grpc:HOST:PORT`), not by age. A consumer
that acknowledges without confirming (no guard) loses every message: NOT CLEAN at once
(with the default expected latency of 300 s, which no longer applies), exit 3, every id
named. The same flow with the guard confirming is CLEAN.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from idempotency import IdempotencyGuard
from outbox import Outbox, OutboxConfig, OutboxTables, declare_groups
from reliable import Message, Producer, SimpleConsumer, connect
from reliable_cli.exit_codes import ExitCode
from tests.e2e.grpc.server_process import REPO, ServerProcess

pytestmark = [pytest.mark.spark, pytest.mark.slow]

MESSAGES = 4


def _cli(*args: str, endpoint: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OUTBOX_E2E_ENDPOINT=endpoint)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "reliable_cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _flow(server: ServerProcess, db: Path, topic: str, group: str, guard: bool) -> set[str]:
    """Publish through the outbox over gRPC, consume (acknowledging every delivery), run
    the resend worker once, consume its resends: the published ids."""
    engine = sa.create_engine(f"sqlite:///{db}")
    tables = OutboxTables()
    tables.create_all(engine)
    declare_groups(engine, tables, topic, [group])
    transport = connect("grpc", endpoint=server.endpoint)
    transport.start()
    idem = IdempotencyGuard(engine, tables, None) if guard else None
    try:
        with (
            SimpleConsumer(
                group,
                {topic: "*"},
                transport=transport,
                await_duration_s=1,
                invisible_duration_s=15,
            ) as consumer,
            Producer(transport) as producer,
        ):
            consumer.receive(max_messages=1)  # the group exists before the first send
            outbox = Outbox(
                tables, producer, config=OutboxConfig(resend_after=timedelta(seconds=1))
            )
            ids = set()
            for i in range(MESSAGES):
                with Session(engine) as session, session.begin():
                    ids.add(outbox.publish(session, Message(topic, f"order {i}".encode())))
            with engine.connect() as conn:  # the server said where each copy went
                rows = conn.execute(
                    sa.select(tables.stub.c.queue_id, tables.stub.c.queue_offset)
                ).all()
            assert len(rows) == MESSAGES
            assert all(qid >= 0 and offset >= 0 for qid, offset in rows), rows

            def drain(want: int) -> int:
                seen = 0
                deadline = time.monotonic() + 60
                while seen < want and time.monotonic() < deadline:
                    for msg in consumer.receive(max_messages=16):
                        assert msg.message_id in ids
                        if idem is not None:
                            idem.consume(msg, group, lambda m: None)
                        consumer.ack(msg)  # without a guard: acknowledged, never confirmed
                        seen += 1
                return seen

            assert drain(MESSAGES) == MESSAGES
            time.sleep(1.5)  # the stubs are due (resend_after), far within the latency
            worker = _cli(
                "worker",
                "resend",
                "--db",
                f"sqlite:///{db}",
                "--once",
                "--json",
                "--sender",
                "tests.e2e.grpc.outbox_app:producer",
                "--offsets",
                "tests.e2e.grpc.outbox_app:offsets",
                endpoint=server.endpoint,
            )
            assert worker.returncode == 0, worker.stderr
            done = worker.stdout.strip().splitlines()[-1]
            resent = 0 if guard else MESSAGES  # the worker resends what nobody confirmed
            assert f'"resent": {resent}' in done, done
            assert drain(resent) == resent
    finally:
        transport.close()
        engine.dispose()
    return ids


def _reconcile(db: Path, endpoint: str) -> subprocess.CompletedProcess[str]:
    return _cli(
        "reconcile",
        "--db",
        f"sqlite:///{db}",
        "--offsets",
        f"grpc:{endpoint}",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        endpoint=endpoint,
    )


def _assert_spark_quiet(stderr: str) -> None:
    """By default only the job's own progress reaches stderr: no log4j WARN lines, no
    stage progress bars."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert lines and all(ln.startswith("reconcile: ") for ln in lines), stderr
    assert "[Stage" not in stderr


def test_acknowledged_but_unconfirmed_messages_make_the_certificate_not_clean(
    server: ServerProcess, tmp_path: Path
) -> None:
    db = tmp_path / "app.db"
    ids = _flow(server, db, "served-orders", "served-billing", guard=False)
    result = _reconcile(db, server.endpoint)
    assert result.returncode == ExitCode.UNACCOUNTED, result.stdout + result.stderr
    out = result.stdout
    assert f"NOT CLEAN ({MESSAGES} unaccounted)" in out
    for mid in ids:  # every unconfirmed message is named, with its group and why
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(mid))
        assert "missing served-billing" in line
        assert "passed by served-billing without a log row" in line
    _assert_spark_quiet(result.stderr)


def test_with_the_guard_confirming_the_certificate_is_clean(
    server: ServerProcess, tmp_path: Path
) -> None:
    db = tmp_path / "app.db"
    _flow(server, db, "served-orders-guarded", "served-billing-guarded", guard=True)
    result = _reconcile(db, server.endpoint)
    assert result.returncode == ExitCode.OK, result.stdout + result.stderr
    assert "CLEAN" in result.stdout and "NOT CLEAN" not in result.stdout
    assert f"confirmed {MESSAGES}" in result.stdout
