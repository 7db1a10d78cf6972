"""Many groups, many processes: the served flow, every part its own process.

PostgreSQL; a served broker (`reliable broker start`); two consumer groups, each in its own
`reliable consume` process with the idempotency guard; the resend worker started as the
README shows it (`reliable worker resend --db URL --sender module:producer`); `reliable
reconcile` on real local Spark. Over gRPC and over the native wire.

Billing's group first runs a handler that acknowledges without processing (no effect, no
confirmation): it loses every message, and the certificate says so at once (NOT CLEAN,
exit 3, each message LOST to billing alone, "passed by billing without a log row": the
server said where each send went, the broker says how far the group got). Billing is then
restarted with its guard and the worker started: it resends every message to billing's
retry topic alone (counted as per-group resends, none to the whole topic), billing applies
each once, inventory sees no second copy, and the certificate is CLEAN (exit 0).
"""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from outbox.reconcile.details import report_table
from reliable_cli.exit_codes import ExitCode
from tests.e2e.grpc.topology import Topology, connections, wait_for, worker_events

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.spark, pytest.mark.slow]

ORDERS = 40
REPORT = "topology_report"


@pytest.fixture(params=["grpc", "native"])
def topology(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Topology]:
    run = Topology(tmp_path, request.param)
    try:
        yield run.start()
    finally:
        for child in run.children:  # shown when the test failed
            print(child.output())
        run.close()


def _over_the_chosen_wire(run: Topology, *pids: int) -> None:
    """Each process reaches the broker over the wire the run chose, and only over it."""
    for pid in pids:
        wire, grpc = connections(pid, run.wire_port), connections(pid, run.server.port)
        if run.wire == "native":
            assert wire >= 1, f"process {pid}: no native-wire connection"
        else:
            assert wire == 0 and grpc >= 1, f"process {pid}: wire {wire}, gRPC {grpc}"


def test_a_group_that_lost_messages_gets_them_again_alone_and_the_certificate_closes(
    topology: Topology,
) -> None:
    run = topology
    a, b = run.group_a, run.group_b
    started = time.monotonic()
    inventory = run.consume("inventory")
    careless = run.consume("billing_careless")
    inventory.wait_for_line("reliable consume: consuming")
    careless.wait_for_line("reliable consume: consuming")

    ids = set(run.publish(ORDERS))
    assert len(ids) == ORDERS
    stubs = run.stubs()
    assert all(s.send_count == 1 and s.queue_id >= 0 for s in stubs.values()), stubs

    # inventory applies every order once; billing acknowledges every one, applies none
    wait_for(
        "inventory's effects",
        lambda: set(run.effects_by_group()[a]) == ids,
        60,
    )
    wait_for(
        "billing to acknowledge every order and its offsets to pass them",
        lambda: {m for m, _ in run.deliveries(f"{b}.careless")} >= ids and run.passed(b, ids),
        60,
    )
    wait_for("every stub due", run.due, 10)
    assert run.effects_by_group()[b] == collections.Counter()

    print(f"[{time.monotonic() - started:5.1f}s] billing lost every order")
    lost = run.reconcile("--report-table", REPORT)
    assert lost.returncode == ExitCode.UNACCOUNTED, lost.stdout + lost.stderr
    assert f"NOT CLEAN ({ORDERS} unaccounted)" in lost.stdout
    assert f"confirmed per group: {a} {ORDERS}" in lost.stdout
    detail = report_table(sa.MetaData(), REPORT)
    with run.engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                detail.c.message_id, detail.c["class"], detail.c.consumer_group, detail.c.reason
            ).where(detail.c.kind == "stub")
        ).all()
    assert {r.message_id for r in rows} == ids
    assert {(r[1], r.consumer_group, r.reason) for r in rows} == {
        ("LOST", b, f"passed by {b} without a log row")
    }

    print(f"[{time.monotonic() - started:5.1f}s] NOT CLEAN")
    careless.terminate()
    billing = run.consume("billing")
    worker = run.worker()
    billing.wait_for_line("reliable consume: consuming")
    wait_for("billing's effects", lambda: set(run.effects_by_group()[b]) == ids, 60)
    wait_for(
        "every stub CONFIRMED",
        lambda: {s.status for s in run.stubs().values()} == {"CONFIRMED"},
        30,
    )
    _over_the_chosen_wire(run, inventory.pid, billing.pid, worker.pid)
    assert worker.terminate() == ExitCode.OK, worker.output()
    [stopped] = [e for e in worker_events(worker) if e["event"] == "stopped"]
    assert (stopped["resent"], stopped["group_resends"], stopped["topic_fallbacks"]) == (
        ORDERS,
        ORDERS,
        0,
    ), stopped
    assert (stopped["errors"], stopped["escalated"], stopped["refused"]) == (0, 0, 0), stopped

    # exactly one effect per (order, group)
    assert run.effects_by_group() == {
        a: collections.Counter(dict.fromkeys(ids, 1)),
        b: collections.Counter(dict.fromkeys(ids, 1)),
    }
    # inventory was handed the first copies only; billing's guard the resends only
    assert sorted(run.deliveries(f"{a}.deliveries")) == sorted((m, 1) for m in ids)
    assert sorted(run.deliveries(f"{b}.deliveries")) == sorted((m, 2) for m in ids)
    for stub in run.stubs().values():  # each resent once, to billing's retry topic
        assert stub.send_count == 2, stub
        assert set(json.loads(stub.group_positions)) == {b}, stub
        assert json.loads(stub.group_positions)[b][0] == f"%RETRY%{b}", stub

    print(f"[{time.monotonic() - started:5.1f}s] resent, applied once")
    if run.wire == "native":
        # the certificate reads the database alone, whose state the assertions above fixed
        # exactly: the same over either wire, so its CLEAN run (a Spark JVM, 10-15 s) is
        # made over gRPC only
        return
    clean = run.reconcile()
    assert clean.returncode == ExitCode.OK, clean.stdout + clean.stderr
    assert "zero-loss certificate [-inf, +inf): CLEAN" in clean.stdout
    assert f"produced {ORDERS}  confirmed {ORDERS}" in clean.stdout
    assert "unaccounted 0  duplicated 0" in clean.stdout
    print(f"observed ({run.wire}): {ORDERS} orders, {time.monotonic() - started:.1f} s")
