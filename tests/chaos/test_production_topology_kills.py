"""The production topology (tests/e2e/grpc/test_production_topology.py) with kills:
inventory's `reliable consume` process SIGKILLed while its handlers run, then started again;
then the broker (`reliable broker start --flush sync`) SIGKILLed while the new one works and
orders are published, and restarted on the same store. Over gRPC and over the native wire.

Sends made while the broker is down fail: their stubs wait for the resend worker, which
sends them to the topic. Billing's group acknowledges everything without processing it
until it is restarted with its guard; the worker resends it what it lost, to its retry
topic alone. Whatever was in flight at a kill is delivered again, and the guards absorb
what was already applied: every order has exactly one effect per group, every stub is
CONFIRMED, and the certificate goes from NOT CLEAN (exit 3) to CLEAN (exit 0; that last
run over gRPC only: it reads nothing the wire changes).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reliable_cli.exit_codes import ExitCode
from tests.e2e.grpc.topology import Child, Topology, wait_for, worker_events

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.spark,
    pytest.mark.slow,
]

# orders published before the outage, during it, and acknowledged after it (the service
# keeps publishing after the restart until that many went through)
BEFORE, DURING, AFTER = 20, 5, 20
HANDLER_S = 0.25  # each inventory run: a kill lands while some run
CONSUMING = "reliable consume: consuming"


@pytest.fixture(params=["grpc", "native"])
def topology(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Topology]:
    run = Topology(tmp_path, request.param, "--flush", "sync", delay_s=HANDLER_S)
    try:
        yield run.start()
    finally:
        for child in run.children:  # shown when the test failed
            print(child.output())
        print("--- broker\n" + "".join(run.server.output))
        run.close()


def test_killed_broker_and_consumer_lose_nothing_and_apply_nothing_twice(
    topology: Topology,
) -> None:
    run = topology
    say = _narrator()
    inventory = run.consume("inventory")
    careless = run.consume("billing_careless")
    inventory.wait_for_line(CONSUMING)
    careless.wait_for_line(CONSUMING)

    ids = run.publish(BEFORE)
    ids += _kill_inventory_while_its_handlers_run(run, inventory, ids, say)
    ids += _kill_the_broker_while_orders_are_published(run, say)
    assert len(set(ids)) == len(ids) >= BEFORE + DURING + AFTER

    stubs = run.stubs()
    sent = {m for m, s in stubs.items() if s.queue_id is not None and s.queue_id >= 0}
    unsent = set(ids) - sent
    assert unsent, "no send failed while the broker was down"
    _wait_for_every_stored_order_consumed(run, sent, say)
    say(f"{len(sent)} sent, {len(unsent)} sends failed")

    lost = run.reconcile()
    assert lost.returncode == ExitCode.UNACCOUNTED, lost.stdout + lost.stderr
    assert "NOT CLEAN (" in lost.stdout
    say("NOT CLEAN")

    stopped = _restart_billing_with_its_guard_and_resend(run, careless, say)
    _assert_one_effect_per_order_and_group_each_resent_once(run, ids, sent, stopped)

    if run.wire == "native":
        # the certificate reads the database alone, whose state the assertions above fixed
        # exactly (one effect per order and group, every stub resent once): the same over
        # either wire, so its CLEAN run (a Spark JVM, 10-15 s) is made over gRPC only
        return
    clean = run.reconcile()
    assert clean.returncode == ExitCode.OK, clean.stdout + clean.stderr
    assert "zero-loss certificate [-inf, +inf): CLEAN" in clean.stdout
    total = len(ids)
    assert f"produced {total}  confirmed {total}" in clean.stdout
    assert "unaccounted 0  duplicated 0" in clean.stdout
    say("CLEAN")


def _narrator() -> Callable[[str], None]:
    """Print each step with the seconds since the test began (shown when it failed)."""
    started = time.monotonic()

    def say(what: str) -> None:
        print(f"[{time.monotonic() - started:5.1f}s] {what}")

    return say


def _applying(run: Topology, more: int) -> None:
    """Wait until inventory applied `more` orders than it had."""
    a = run.group_a
    applied = len(run.effects_by_group()[a])
    wait_for(
        f"inventory to apply {more} more orders",
        lambda: len(run.effects_by_group()[a]) >= applied + more,
        30,
    )


def _kill_inventory_while_its_handlers_run(
    run: Topology, inventory: Child, ids: list[str], say: Callable[[str], None]
) -> list[str]:
    """Inventory is SIGKILLed while handlers run (each takes HANDLER_S), then started again;
    the ids of the orders published meanwhile.

    Inventory is frozen (SIGSTOP) to read what it was handed and what it applied, and
    killed frozen once that shows an order applied and one handed and not applied: the kill
    lands on the state read, however loaded the machine. Otherwise it is thawed, and given
    one more order when it applied them all (nothing would be left to interrupt)."""
    a = run.group_a
    more: list[str] = []
    seen: dict[str, set[str]] = {}

    def killed_mid_handler() -> bool:
        _freeze(inventory)
        seen["handed"] = {m for m, _ in run.deliveries(f"{a}.deliveries")}
        seen["done"] = set(run.effects_by_group()[a])
        if seen["done"] and seen["handed"] - seen["done"]:
            inventory.kill()
            return True
        os.kill(inventory.pid, signal.SIGCONT)
        if seen["done"] >= {*ids, *more}:
            more.extend(run.publish(1))
        return False

    wait_for("inventory to hold an order handed and not applied", killed_mid_handler, 30)
    handed, done = seen["handed"], seen["done"]
    say(
        f"inventory killed: {len(handed)} orders handed to it, {len(done)} applied"
        f" ({len(more)} published to keep it busy)"
    )
    assert handed - done, "the kill interrupted no handler"
    inventory = run.consume("inventory")
    inventory.wait_for_line(CONSUMING)
    return more


def _freeze(child: Child) -> None:
    """SIGSTOP `child` and wait until it stopped (every thread of it)."""
    os.kill(child.pid, signal.SIGSTOP)
    _, status = os.waitpid(child.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), f"{child.name} ended:\n{child.output()}"


def _kill_the_broker_while_orders_are_published(
    run: Topology, say: Callable[[str], None]
) -> list[str]:
    """The broker is SIGKILLed while the new inventory works, and restarted on its store;
    the ids of the orders published meanwhile and until AFTER sends went through."""
    _applying(run, 2)
    run.server.kill()
    say("broker killed")
    ids = run.publish(DURING)  # committed; their sends fail
    run.restart_server()
    say("broker restarted on its store")
    acknowledged = 0
    deadline = time.monotonic() + 30
    while acknowledged < AFTER:  # the first sends may fail while the clients reconnect
        assert time.monotonic() < deadline, f"{acknowledged} sends acknowledged after restart"
        [mid] = run.publish(1)
        ids.append(mid)
        if run.stubs()[mid].queue_id is None:
            time.sleep(0.1)
        else:
            acknowledged += 1
    return ids


def _wait_for_every_stored_order_consumed(
    run: Topology, sent: set[str], say: Callable[[str], None]
) -> None:
    """Every message the broker took reaches inventory (once) and billing (acknowledged,
    not processed), and billing's offsets pass them."""
    a, b = run.group_a, run.group_b
    wait_for("inventory's effects", lambda: set(run.effects_by_group()[a]) >= sent, 60)
    say("inventory applied every stored order")
    try:
        wait_for(
            "billing to acknowledge every stored order and its offsets to pass them",
            lambda: {m for m, _ in run.deliveries(f"{b}.careless")} >= sent and run.passed(b, sent),
            60,
        )
    except AssertionError:
        missing = sent - {m for m, _ in run.deliveries(f"{b}.careless")}
        print(f"billing never handed {sorted(missing)}; queues {run.positions(b, sent)}")
        raise
    wait_for("every stub due", run.due, 10)


def _restart_billing_with_its_guard_and_resend(
    run: Topology, careless: Child, say: Callable[[str], None]
) -> dict[str, Any]:
    """Billing is restarted with its guard and the resend worker runs until every stub is
    CONFIRMED; the worker's `stopped` event."""
    careless.terminate()
    billing = run.consume("billing")
    worker = run.worker()
    billing.wait_for_line(CONSUMING)
    wait_for(
        "every stub CONFIRMED",
        lambda: {s.status for s in run.stubs().values()} == {"CONFIRMED"},
        60,
    )
    assert worker.terminate() == ExitCode.OK, worker.output()
    [stopped] = [e for e in worker_events(worker) if e["event"] == "stopped"]
    say(f"worker: {stopped}")
    return stopped


def _assert_one_effect_per_order_and_group_each_resent_once(
    run: Topology, ids: list[str], sent: set[str], stopped: dict[str, Any]
) -> None:
    a, b = run.group_a, run.group_b
    # no loss, no duplicate effect: exactly one effect per (order, group)
    assert run.effects_by_group() == {
        a: collections.Counter(dict.fromkeys(ids, 1)),
        b: collections.Counter(dict.fromkeys(ids, 1)),
    }
    # each stub resent once: to billing's retry topic when inventory had it, to the topic
    # when nobody had it (a send that failed while the broker was down)
    assert stopped["resent"] == len(ids), stopped
    assert stopped["group_resends"] >= len(sent), stopped
    assert (stopped["topic_fallbacks"], stopped["errors"], stopped["escalated"]) == (0, 0, 0)
    # a failed send counts as a send: every stub was sent twice, the worker's send second;
    # inventory was never a group the worker aimed a copy at
    final = run.stubs()
    assert {s.send_count for s in final.values()} == {2}
    for m in sent:
        assert set(json.loads(final[m].group_positions)) == {b}, final[m]
    assert not any(a in json.loads(s.group_positions or "{}") for s in final.values())
    # billing's guard was handed the worker's copies only, each order's at least once
    assert {m for m, _ in run.deliveries(f"{b}.deliveries")} == set(ids)
    assert {n for _, n in run.deliveries(f"{b}.deliveries")} == {2}
