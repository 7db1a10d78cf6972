"""`reliable worker resend` as a real process, and the webhook and SMTP notifiers."""

from __future__ import annotations

import http.server
import json
import os
import signal
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from outbox import Escalation, NotifyFailed, Outbox, SmtpNotifier, WebhookNotifier
from reliable import Message

HERE = Path(__file__).parent
ROOT = HERE.parents[2]


def _cli(db_url: str, prefix: str, *args: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}",
        "OUTBOX_TEST_DB": db_url,
        "OUTBOX_TEST_PREFIX": prefix,
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reliable_cli",
            "worker",
            "resend",
            "--db",
            db_url,
            "--table-prefix",
            prefix,
            "--sender",
            "outbox_testkit:sender_from_env",
            "--offsets",
            "outbox_testkit:FixedOffsets",
            "--json",
            *args,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _due_stubs(engine, tables, sender, n: int) -> list[str]:  # type: ignore[no-untyped-def]
    sender.fail_all = True
    outbox = Outbox(tables, sender, clock=lambda: datetime(2000, 1, 1))  # long due
    with Session(engine) as session, session.begin():
        ids = [outbox.publish(session, Message(topic="T", body=b"x")) for _ in range(n)]
    sender.fail_all = False
    return ids


def test_cli_once_resends_due_stubs_and_prints_json(
    db_url, engine, tables, sender, table_prefix
) -> None:
    ids = _due_stubs(engine, tables, sender, 3)
    proc = _cli(db_url, table_prefix, "--once", "--ensure-schema")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["event"] == "done"
    assert (report["selected"], report["resent"], report["errors"]) == (3, 3, 0)
    assert sender.counts() == dict.fromkeys(ids, 1)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_cli_daemon_stops_cleanly_on_sigterm(db_url, engine, tables, sender, table_prefix) -> None:
    ids = _due_stubs(engine, tables, sender, 5)
    proc = _cli(db_url, table_prefix, "--interval", "0.05")
    assert proc.stdout is not None
    assert json.loads(proc.stdout.readline())["event"] == "started"
    deadline = time.monotonic() + 30
    while sender.counts() != dict.fromkeys(ids, 1) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    last = json.loads(out.strip().splitlines()[-1])
    assert last["event"] == "stopped" and last["resent"] == 5
    assert sender.counts() == dict.fromkeys(ids, 1)
    with engine.connect() as conn:
        assert (
            conn.execute(
                sa.select(sa.func.count()).where(tables.stub.c.claimed_by.is_not(None))
            ).scalar()
            == 0
        )


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_cli_bad_target_is_a_usage_error(db_url, tables, table_prefix) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "reliable_cli",
            "worker",
            "resend",
            "--db",
            db_url,
            "--sender",
            "no_such_module:x",
            "--once",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "cannot import" in proc.stderr
    for bad in (
        ["--sender", "os:path", "--once"],  # no send() method
        ["--sender", "os", "--once"],  # not MODULE:ATTR
        ["--sender", "outbox_testkit:sender_from_env", "--batch-size", "0"],
        ["--sender", "outbox_testkit:sender_from_env", "--notify", "pager:x"],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "reliable_cli", "worker", "resend", "--db", db_url, *bad],
            env={
                **env,
                "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}",
                "OUTBOX_TEST_DB": db_url,
                "OUTBOX_TEST_PREFIX": table_prefix,
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, (bad, proc.stderr)
        assert proc.stderr.startswith("reliable worker resend:"), proc.stderr
    down = subprocess.run(
        [
            sys.executable,
            "-m",
            "reliable_cli",
            "worker",
            "resend",
            "--db",
            "postgresql+psycopg2://postgres@127.0.0.1:1/none",
            "--sender",
            "outbox_testkit:sender_from_env",
            "--once",
        ],
        env={
            **env,
            "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}",
            "OUTBOX_TEST_DB": db_url,
            "OUTBOX_TEST_PREFIX": table_prefix,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert down.returncode == 4 and "database unavailable" in down.stderr, down.stderr


ESCALATION = Escalation(
    message_id="M1",
    topic="T",
    send_count=16,
    max_sends=16,
    missing_groups=("billing",),
    created_at=datetime(2026, 1, 1),
    last_error=None,
)


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, object]], list[int]]]:
    received: list[dict[str, object]] = []
    status = [204]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            received.append(json.loads(self.rfile.read(length)))
            self.send_response(status[0])
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", received, status
    server.shutdown()
    server.server_close()


def test_webhook_notifier_posts_json_and_reports_failures(webhook) -> None:
    url, received, status = webhook
    WebhookNotifier(url).notify(ESCALATION)
    assert received[0]["message_id"] == "M1" and received[0]["missing_groups"] == ["billing"]
    status[0] = 500
    with pytest.raises(NotifyFailed):
        WebhookNotifier(url).notify(ESCALATION)
    with pytest.raises(NotifyFailed):
        WebhookNotifier("http://127.0.0.1:1/nothing", timeout=2).notify(ESCALATION)


class _SmtpHandler(socketserver.StreamRequestHandler):
    """Just enough SMTP (RFC 5321) to accept one mail per session."""

    def handle(self) -> None:
        mails = self.server.mails  # type: ignore[attr-defined]
        self.wfile.write(b"220 test ESMTP\r\n")
        data: list[bytes] | None = None
        while line := self.rfile.readline():
            if data is not None:
                if line == b".\r\n":
                    mails.append(b"".join(data).decode())
                    data = None
                    self.wfile.write(b"250 queued\r\n")
                else:
                    data.append(line)
                continue
            verb = line[:4].upper()
            if verb == b"DATA":
                data = []
                self.wfile.write(b"354 go on\r\n")
            elif verb == b"QUIT":
                self.wfile.write(b"221 bye\r\n")
                return
            else:
                self.wfile.write(b"250 ok\r\n")


def test_smtp_notifier_sends_one_mail() -> None:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _SmtpHandler)
    server.mails = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        SmtpNotifier(
            "127.0.0.1",
            server.server_address[1],
            sender="worker@example.com",
            recipients=["ops@example.com"],
        ).notify(ESCALATION)
    finally:
        server.shutdown()
        server.server_close()
    [mail] = server.mails  # type: ignore[attr-defined]
    assert "Subject: [reliable] message M1 needs manual handling" in mail
    assert "ops@example.com" in mail
