"""`reliable admin dlq ...`, `admin group show|reset-offset|delete` and `admin topic delete`
against a real server process, with real consumers counting what they receive, and the
same answers from the stopped store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from reliable import (
    ConsumeContext,
    ConsumeFrom,
    ConsumeResult,
    Message,
    Producer,
    PushConsumer,
    ReceivedMessage,
    connect,
)
from reliable.admin import AdminClient
from tests.e2e.grpc import official
from tests.e2e.grpc.server_process import REPO, ServerProcess
from tests.e2e.grpc.server_process import admin_cli as cli
from tests.e2e.grpc.server_process import admin_json as doc


def send(endpoint: str, topic: str, n: int, prefix: str) -> list[str]:
    t = connect("grpc", endpoint=endpoint)
    t.start()
    try:
        with Producer(t) as producer:
            return [
                producer.send(
                    Message(topic, f"{prefix}-{i}".encode(), keys=[f"{prefix}-{i}"])
                ).message_id
                for i in range(n)
            ]
    finally:
        t.close()


class Counting:
    """A listener that counts deliveries per client message id; fails while `failing`."""

    def __init__(self, failing: bool = False) -> None:
        self.failing = failing
        self.seen: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, messages: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        if self.failing:
            return ConsumeResult.RECONSUME_LATER
        with self.lock:
            for m in messages:
                self.seen[m.message_id] += 1
        return ConsumeResult.SUCCESS

    def total(self) -> int:
        with self.lock:
            return sum(self.seen.values())


@contextmanager
def consuming(endpoint: str, group: str, topic: str, listener: Counting) -> Iterator[None]:
    t = connect("grpc", endpoint=endpoint)
    t.start()
    try:
        with PushConsumer(
            group,
            listener,
            {topic: "*"},
            transport=t,
            consume_from=ConsumeFrom.FIRST,
            consume_threads=2,
            heartbeat_interval_s=0.5,
            receive_long_poll_ms=1000,
        ):
            yield
    finally:
        t.close()


def admin(endpoint: str) -> AdminClient:
    return AdminClient(endpoint)


def no_consumers(endpoint: str, group: str) -> bool:
    client = admin(endpoint)
    try:
        return not client.call("GetGroup", name=group)["consumers"]
    finally:
        client.close()


def dlq_depth(endpoint: str, group: str) -> int:
    client = admin(endpoint)
    try:
        return int(client.call("ListDeadLetters", group=group, limit=1)["depth"])
    finally:
        client.close()


def test_dlq_replay_is_rate_limited_once_only_audited_and_agrees_when_stopped(
    tmp_path: Path, make_server: Callable[..., ServerProcess]
) -> None:
    topic, group = "dl-payments", "dl-billing"
    store = tmp_path / "store"
    server = make_server(store=store)
    ep = ("--endpoint", server.endpoint)
    assert cli("topic", "create", topic, "--queues", "2", *ep).returncode == 0
    assert cli("group", "create", group, "--max-retries", "0", *ep).returncode == 0
    sent = send(server.endpoint, topic, 100, "pay")
    listener = Counting(failing=True)  # a bad deploy: every payment fails
    with consuming(server.endpoint, group, topic, listener):
        assert official.wait_for(
            lambda: dlq_depth(server.endpoint, group) == 100, timeout_s=90, interval_s=0.5
        )
        listed = doc("dlq", "list", "--group", group, "--limit", "1000", *ep)
        assert sorted(m["msg_id"] for m in listed["messages"]) == sorted(sent)
        assert {m["origin_topic"] for m in listed["messages"]} == {topic}
        assert (listed["depth"], listed["pending"], listed["replayed"]) == (100, 100, 0)
        dry = doc("dlq", "replay", "--group", group, "--dry-run", *ep)
        assert len(dry["would_replay"]) == 100 and dry["replayed"] == []
        listener.failing = False  # the fix is deployed
        started = time.monotonic()
        done = cli(
            "dlq", "replay", "--group", group, "--rate", "50", "--operator", "oncall", "--json", *ep
        )
        elapsed = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        replay = json.loads(done.stdout)
        assert "replayed 100/100" in done.stderr  # progress on stderr
        assert elapsed >= 1.6, elapsed  # 100 at 50/s, a burst of 10 first
        assert sorted(r["msg_id"] for r in replay["replayed"]) == sorted(sent)
        assert {r["topic"] for r in replay["replayed"]} == {f"%RETRY%{group}"}
        assert official.wait_for(lambda: listener.total() >= 100, timeout_s=60)
        again = doc("dlq", "replay", "--group", group, "--rate", "50", *ep)
        assert again["replayed"] == [] and len(again["already_replayed"]) == 100
        time.sleep(3)  # anything delivered twice would have arrived by now
        assert dict(listener.seen) == {mid: 1 for mid in sent}
        audit = doc("dlq", "audit", "--group", group, *ep)["entries"]
        assert {e["operator"] for e in audit} == {"oncall"}
        assert {e["run"] for e in audit} == {replay["run"]}
        assert sorted(r["msg_id"] for e in audit for r in e["replayed"]) == sorted(sent)
        assert official.wait_for(
            lambda: doc("group", "show", group, *ep)["total"]["lag"] == 0, timeout_s=30
        )
    assert official.wait_for(lambda: no_consumers(server.endpoint, group), timeout_s=30)
    running_list = doc("dlq", "list", "--group", group, "--limit", "1000", *ep)
    running_show = doc("group", "show", group, *ep)
    assert running_show["total"]["last_consume_time_ms"] is not None
    assert (
        running_show["dlq_depth"],
        running_show["dlq_replayed"],
        running_show["dlq_pending"],
        running_show["retry_depth"],
    ) == (100, 100, 0, 0)
    assert all(m["replayed"]["operator"] == "oncall" for m in running_list["messages"])
    text = cli("group", "show", group, *ep).stdout
    assert "LAST CONSUMED" in text and "depth 100 (100 replayed, 0 not replayed)" in text
    assert server.terminate() == 0
    offline = ("--store", str(store))
    assert doc("dlq", "list", "--group", group, "--limit", "1000", *offline) == running_list
    assert doc("group", "show", group, *offline) == running_show
    assert doc("dlq", "audit", "--group", group, *offline)["entries"] == audit


def test_dlq_replay_to_the_original_topic_reaches_every_group_the_retry_topic_one(
    tmp_path: Path, make_server: Callable[..., ServerProcess]
) -> None:
    topic, bad, good = "tt-orders", "tt-failing", "tt-fine"
    server = make_server()
    ep = ("--endpoint", server.endpoint)
    assert cli("topic", "create", topic, "--queues", "2", *ep).returncode == 0
    assert cli("group", "create", bad, "--max-retries", "0", *ep).returncode == 0
    sent = send(server.endpoint, topic, 5, "tt")
    failing, fine = Counting(failing=True), Counting()
    with (
        consuming(server.endpoint, bad, topic, failing),
        consuming(server.endpoint, good, topic, fine),
    ):
        assert official.wait_for(
            lambda: dlq_depth(server.endpoint, bad) == 5 and fine.total() == 5,
            timeout_s=90,
            interval_s=0.5,
        )
        failing.failing = False
        picked = sent[:2]
        done = doc(
            "dlq", "replay", "--group", bad, "--to-topic", "--id", picked[0], "--id", picked[1], *ep
        )
        assert sorted(r["msg_id"] for r in done["replayed"]) == sorted(picked)
        assert {r["topic"] for r in done["replayed"]} == {topic}
        assert official.wait_for(lambda: failing.total() == 2 and fine.total() == 7, timeout_s=60)
        # replayed to the group's retry topic instead, a message reaches that group alone
        alone = doc("dlq", "replay", "--group", bad, "--id", sent[2], *ep)
        assert [r["topic"] for r in alone["replayed"]] == [f"%RETRY%{bad}"]
        assert official.wait_for(lambda: failing.total() == 3, timeout_s=60)
        time.sleep(2)
    assert dict(failing.seen) == {mid: 1 for mid in sent[:3]}
    assert dict(fine.seen) == {mid: 2 if mid in picked else 1 for mid in sent}
    unknown = cli("dlq", "replay", "--group", bad, "--id", "NO-SUCH-ID", *ep)
    assert unknown.returncode == 1 and "no dead letter" in unknown.stderr


def test_reset_offset_to_a_time_redelivers_exactly_what_came_after(
    tmp_path: Path, make_server: Callable[..., ServerProcess]
) -> None:
    topic, group = "rs-orders", "rs-billing"
    server = make_server()
    ep = ("--endpoint", server.endpoint)
    assert cli("topic", "create", topic, "--queues", "2", *ep).returncode == 0
    assert cli("group", "create", group, *ep).returncode == 0
    first = send(server.endpoint, topic, 20, "early")
    time.sleep(0.05)
    cut = time.time_ns() // 1_000_000
    time.sleep(0.05)
    second = send(server.endpoint, topic, 20, "late")
    before = Counting()
    reset = ("group", "reset-offset", group, "--topic", topic, "--to-time", str(cut))
    with consuming(server.endpoint, group, topic, before):
        assert official.wait_for(lambda: before.total() == 40, timeout_s=60)
        assert official.wait_for(
            lambda: doc("group", "show", group, *ep)["total"]["lag"] == 0, timeout_s=30
        )
        planned = doc(*reset, "--dry-run", *ep)  # a dry run is allowed under consumers
        assert planned["executed"] is False and planned["consumers"]
        refused = cli(*reset, "--execute", *ep)
        assert refused.returncode == 1 and "live consumer" in refused.stderr
    assert set(before.seen) == set(first) | set(second)
    assert official.wait_for(lambda: no_consumers(server.endpoint, group), timeout_s=30)
    table = cli(*reset, "--execute", *ep)
    assert table.returncode == 0, table.stderr
    assert "BEFORE" in table.stdout and "AFTER" in table.stdout
    shown = doc("group", "show", group, *ep)
    assert shown["total"]["lag"] == 20
    after = Counting()
    with consuming(server.endpoint, group, topic, after):
        assert official.wait_for(lambda: after.total() >= 20, timeout_s=60)
        time.sleep(2)
        assert dict(after.seen) == {mid: 1 for mid in second}
        # with --force the reset applies under a live consumer, and reaches it at once
        forced = doc(*reset, "--execute", "--force", *ep)
        assert forced["executed"] and forced["consumers"]
        assert official.wait_for(lambda: after.total() >= 40, timeout_s=60)
        time.sleep(2)
    assert dict(after.seen) == {mid: 2 for mid in second}


def test_group_show_counts_lag_retry_and_dlq_then_group_and_topic_delete(
    tmp_path: Path, make_server: Callable[..., ServerProcess]
) -> None:
    topic, group = "gs-orders", "gs-billing"
    store = tmp_path / "store"
    server = make_server(store=store)
    ep = ("--endpoint", server.endpoint)
    assert cli("topic", "create", topic, "--queues", "2", *ep).returncode == 0
    assert cli("group", "create", group, "--max-retries", "0", *ep).returncode == 0
    sent = send(server.endpoint, topic, 10, "gs")
    listener = Counting(failing=True)
    with consuming(server.endpoint, group, topic, listener):
        assert official.wait_for(
            lambda: dlq_depth(server.endpoint, group) == 10, timeout_s=90, interval_s=0.5
        )
        assert official.wait_for(
            lambda: doc("group", "show", group, *ep)["total"]["lag"] == 0, timeout_s=30
        )
    assert official.wait_for(lambda: no_consumers(server.endpoint, group), timeout_s=30)
    for mid in sent[:3]:  # three copies for the group alone: its retry topic
        assert (
            cli("message", "reconsume", mid, "--group", group, "--topic", topic, *ep).returncode
            == 0
        )
    later = send(server.endpoint, topic, 5, "later")
    shown = doc("group", "show", group, *ep)
    assert (
        shown["total"]["lag"],
        shown["retry_depth"],
        shown["dlq_depth"],
        shown["dlq_pending"],
        shown["total"]["in_flight"],
    ) == (5, 3, 10, 10, 0)
    [orders] = shown["topics"]
    assert orders["topic"] == topic and len(orders["queues"]) == 2
    assert sum(q["max_offset"] for q in orders["queues"]) == 15
    assert sum(q["committed_offset"] for q in orders["queues"]) == 10
    assert len(later) == 5
    # deletions ask for --yes; the group goes with its offsets, the topic with its queues
    assert cli("group", "delete", group, *ep).returncode == 2
    gone = doc("group", "delete", group, "--yes", *ep)
    assert topic in gone["offsets_removed_on"]
    missing = cli("group", "show", group, *ep)
    assert missing.returncode == 1 and "CONSUMER_GROUP_NOT_FOUND" in missing.stderr
    assert cli("topic", "delete", topic, *ep).returncode == 2
    deleted = doc("topic", "delete", topic, "--yes", *ep)
    assert deleted["deleted"] is True
    assert cli("topic", "show", topic, *ep).returncode == 1
    system = cli("topic", "delete", "SCHEDULE_TOPIC_XXXX", "--yes", *ep)
    assert system.returncode != 0 and "SCHEDULE_TOPIC_XXXX" in system.stderr
    assert server.terminate() == 0
    offline = ("--store", str(store))
    assert cli("group", "show", group, *offline).returncode == 1
    names = [t["name"] for t in doc("topic", "list", *offline)["topics"]]
    assert topic not in names


def test_a_replay_killed_midway_and_run_again_replays_each_dead_letter_once(
    tmp_path: Path, make_server: Callable[..., ServerProcess]
) -> None:
    topic, group = "kr-orders", "kr-billing"
    server = make_server()
    ep = ("--endpoint", server.endpoint)
    assert cli("topic", "create", topic, "--queues", "2", *ep).returncode == 0
    assert cli("group", "create", group, "--max-retries", "0", *ep).returncode == 0
    sent = send(server.endpoint, topic, 40, "kr")
    listener = Counting(failing=True)
    with consuming(server.endpoint, group, topic, listener):
        assert official.wait_for(
            lambda: dlq_depth(server.endpoint, group) == 40, timeout_s=90, interval_s=0.5
        )
        listener.failing = False
        env = dict(os.environ, PYTHONPATH=str(REPO))
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reliable_cli",
                "admin",
                "dlq",
                "replay",
                "--group",
                group,
                "--rate",
                "20",
                *ep,
            ],
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert official.wait_for(lambda: listener.total() >= 4, timeout_s=30)
        proc.kill()  # SIGKILL, midway through the replay
        proc.wait(10)
        partial = listener.total()
        assert 0 < partial < 40
        rest = doc("dlq", "replay", "--group", group, *ep)
        assert len(rest["replayed"]) + len(rest["already_replayed"]) == 40
        assert len(rest["replayed"]) == 40 - len(rest["already_replayed"])
        assert rest["replayed"] and rest["already_replayed"]  # it was stopped midway
        assert official.wait_for(lambda: listener.total() >= 40, timeout_s=60)
        time.sleep(2)
    assert dict(listener.seen) == {mid: 1 for mid in sent}
