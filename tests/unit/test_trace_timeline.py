"""One order for a message's trace: the broker's events and the outbox's and consumers'
rows merged in time order and, within one millisecond, in causal order; the command line
(`reliable admin message trace --db`) and the console's trace page show the same one."""

from __future__ import annotations

import argparse
import json
import random
import re
from typing import Any

import pytest

from reliable import admin_messages
from reliable_cli import admin_trace
from reliable_cli.admin_trace import timeline
from reliable_cli.console import app as console_app
from reliable_cli.console.security import Authenticator

MS = 1_795_478_400_000


def broker(kind: str, seq: int, group: str | None = None, ms: int = MS) -> dict[str, Any]:
    return {
        "time_ms": ms,
        "source": "broker",
        "kind": kind,
        "group": group,
        "detail": f"{kind} {group or ''}".strip(),
        "log_offset": seq,
    }


def row(source: str, kind: str, group: str | None = None, ms: int | None = MS) -> dict[str, Any]:
    return {
        "time_ms": ms,
        "source": source,
        "kind": kind,
        "group": group,
        "detail": f"{kind} {group or ''}".strip(),
    }


def causal() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """One millisecond in which everything happened: (broker's, others', the causal order)."""
    ours = [
        broker("original", 100),
        broker("delivered", 200, "billing"),
        broker("delivered", 210, "shipping"),
        broker("handed-back", 300, "shipping"),
        broker("delivered", 400, "shipping"),
        broker("acknowledged", 500, "billing"),
        broker("acknowledged", 600, "shipping"),
    ]
    theirs = [
        row("outbox", "stub-created"),
        row("consumer", "processing", "billing"),
        row("consumer", "confirmed", "billing"),
        row("consumer", "processing", "shipping"),
        row("consumer", "confirmed", "shipping"),
        row("outbox", "stub-updated"),
    ]
    order = [
        "stub-created",
        "original",
        "delivered billing",
        "delivered shipping",
        "processing shipping",  # before the broker heard back from shipping at all
        "handed-back shipping",
        "delivered shipping",
        "processing billing",
        "confirmed billing",
        "acknowledged billing",
        "confirmed shipping",  # its second attempt succeeded
        "acknowledged shipping",
        "stub-updated",
    ]
    return ours, theirs, order


@pytest.mark.parametrize("seed", range(20))
def test_one_milliseconds_events_are_in_causal_order_whatever_order_they_come_in(
    seed: int,
) -> None:
    ours, theirs, order = causal()
    rng = random.Random(seed)
    rng.shuffle(ours)
    rng.shuffle(theirs)
    assert [e["detail"] for e in timeline(ours, theirs)] == order, f"seed {seed}"


def test_time_comes_first_and_a_dead_letter_is_recorded_after_the_broker_wrote_it() -> None:
    ours = [
        broker("original", 1, ms=MS),
        broker("delivered", 2, "billing", ms=MS + 5),
        broker("dead-letter", 3, "billing", ms=MS + 9),
        broker("dead-lettered", 4, "billing", ms=MS + 9),
    ]
    theirs = [
        row("consumer", "gave-up", "billing", ms=MS + 9),
        row("consumer", "processing", "billing", ms=MS + 5),
        row("outbox", "stub-created", ms=MS),
        row("outbox", "stub-escalated", ms=None),  # no time: first, as time 0
    ]
    assert [e["detail"] for e in timeline(ours, theirs)] == [
        "stub-escalated",
        "stub-created",
        "original",
        "delivered billing",
        "processing billing",
        "dead-letter billing",
        "dead-lettered billing",
        "gave-up billing",
    ]
    assert timeline(ours, []) == sorted(ours, key=lambda e: e["log_offset"])


class _Admin:
    def call(self, method: str, **params: Any) -> dict[str, Any]:
        raise AssertionError("not called: the trace is given")


class _View:
    def trace(self, key: str) -> dict[str, Any]:
        ours, _, _ = causal()
        random.Random(7).shuffle(ours)
        return _doc(ours)

    def groups(self) -> list[dict[str, Any]]:
        return []


def _doc(events: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "key": "k",
        "records": [{"keys": [], "role": "original"}],
        "groups": [],
        "events": events,
        "message_ids": ["M1"],
        "more": False,
    }


def _outbox(*_args: Any) -> dict[str, Any]:
    _, theirs, _ = causal()
    random.Random(11).shuffle(theirs)
    return {"stubs": [], "consumption_log": [], "confirmations": [], "events": theirs}


def test_the_command_and_the_console_show_the_same_order(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(admin_trace, "outbox_trace", _outbox)
    monkeypatch.setattr(admin_messages, "trace_message", lambda *a, **k: _View().trace("k"))
    args = argparse.Namespace(
        key_or_id="k",
        topic=None,
        limit=32,
        scan=None,
        db="sqlite://",
        table_prefix="reliable_",
        schema=None,
        json=True,
    )
    assert admin_trace.run_trace(args, _Admin()) == 0
    command = [e["detail"] for e in json.loads(capsys.readouterr().out)["events"]]

    settings = console_app.Settings(
        endpoint="127.0.0.1:1", auth=Authenticator(mode="none"), db_url="sqlite://"
    )
    flask_app = console_app.create_app(settings, _View(), None, None)  # type: ignore[arg-type]
    page = flask_app.test_client().get("/trace?key=k")
    assert page.status_code == 200
    timeline_html = page.get_data(as_text=True).split('id="timeline"', 1)[1].split("</ol>")[0]
    console = re.findall(r"<span>([^<]*)</span></li>", timeline_html)
    _, _, order = causal()
    assert command == console == order
