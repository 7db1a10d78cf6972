"""`reliable demo` end to end, as a user runs it: a subprocess, its summary line, and the
database it leaves behind (every effect applied once, none twice)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reliable_cli.demo import FaultPlan, FaultRates

ORDERS = 40
RATES = {"--fail-rate": 0.2, "--drop-rate": 0.15, "--duplicate-rate": 0.15, "--rollback-rate": 0.1}
POISON = 2


def _demo(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reliable_cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _summary(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = done.stdout.strip().splitlines()
    assert lines, f"no output; stderr:\n{done.stderr[-4000:]}"
    summary: dict[str, Any] = json.loads(lines[-1])
    return summary


def _plan(seed: int) -> FaultPlan:
    return FaultPlan.draw(
        seed,
        ORDERS,
        FaultRates(
            fail=RATES["--fail-rate"],
            drop=RATES["--drop-rate"],
            duplicate=RATES["--duplicate-rate"],
            rollback=RATES["--rollback-rate"],
            poison=POISON,
        ),
    )


@pytest.mark.redis
@pytest.mark.spark
@pytest.mark.slow
def test_demo_summary_accounts_for_every_message(tmp_path: Path, seed: int) -> None:
    store = tmp_path / "work"
    rates = [x for k, v in RATES.items() for x in (k, str(v))]
    done = _demo(
        "--orders",
        str(ORDERS),
        "--seed",
        str(seed),
        "--poison",
        str(POISON),
        *rates,
        "--store",
        str(store),
        "--json",
    )
    assert done.returncode == 0, f"seed {seed}: exit {done.returncode}\n{done.stderr[-6000:]}"
    s = _summary(done)
    plan = _plan(seed)
    committed = [f for f in plan.fates if not f.rolled_back]
    assert s["seed"] == seed and s["reconciled"] and s["settled"] and s["problems"] == []
    assert s["unaccounted"] == 0
    assert s["consumed_once"] == s["published"] == len(committed) - POISON
    assert s["dead_lettered"] == s["poison"] == POISON
    assert s["rolled_back"] == ORDERS - len(committed)
    assert s["dropped"] == sum(f.dropped for f in committed)
    assert s["resent"] >= s["dropped"]
    assert s["duplicated"] == sum(f.duplicated for f in committed)
    assert s["retried"] >= sum(1 for f in committed if f.failures) + POISON
    # every run of the handler is accounted: one success per order plus the planned failures
    # (poison: 1 + max reconsume times each); more runs only where a copy raced another
    planned_failures = sum(f.failures for f in committed) + POISON * (1 + 3)
    assert s["handler_runs"] >= s["consumed_once"] + planned_failures
    assert set(s) >= {
        "published",
        "consumed_once",
        "handler_runs",
        "retried",
        "dead_lettered",
        "resent",
        "unaccounted",
    }
    assert "reconciliation" in done.stderr and "CLEAN" in done.stderr  # the report, for people

    # The handler-side effects, read from the database the demo left: once each, never twice.
    with sqlite3.connect(store / "shop.db") as db:
        reserved = db.execute("select order_id, sku, quantity from demo_reservations").fetchall()
        orders = {r[0]: r for r in db.execute("select order_id, sku, quantity from demo_orders")}
        stock = db.execute("select sku, available, reserved from demo_stock").fetchall()
        confirmed = db.execute(
            "select count(*), count(distinct message_id) from demo_confirmation"
        ).fetchone()
    good = {f.order_id for f in committed if not f.poison}
    assert sorted(r[0] for r in reserved) == sorted(good)  # each valid order exactly once
    assert all(orders[r[0]] == r for r in reserved)
    per_sku: dict[str, int] = {}
    for _, sku, quantity in reserved:
        per_sku[sku] = per_sku.get(sku, 0) + quantity
    for sku, available, reserved_qty in stock:
        assert reserved_qty == per_sku.get(sku, 0), f"seed {seed}: {sku} reserved twice"
        assert available + reserved_qty == 10 * ORDERS + 10
    assert confirmed == (len(good), len(good))


@pytest.mark.redis
@pytest.mark.postgres
def test_demo_on_postgresql_without_reconciliation(seed: int) -> None:
    from tests.conftest import POSTGRES_URL

    prefix = f"demo{seed % 100000}_"
    done = _demo(
        "--orders",
        "25",
        "--seed",
        str(seed),
        "--db",
        POSTGRES_URL,
        "--table-prefix",
        prefix,
        "--no-reconcile",
        "--json",
    )
    assert done.returncode == 0, f"seed {seed}: exit {done.returncode}\n{done.stderr[-6000:]}"
    s = _summary(done)
    assert s["unaccounted"] == 0 and s["problems"] == [] and not s["reconciled"]
    assert s["consumed_once"] == s["published"] and s["dead_lettered"] == s["poison"] == 3
    assert s["resent"] >= s["dropped"]
    import sqlalchemy as sa

    from reliable_cli.demo import Shop

    engine = sa.create_engine(POSTGRES_URL)
    try:
        shop = Shop(prefix)
        shop.tables.drop_all(engine)
        shop.metadata.drop_all(engine)
    finally:
        engine.dispose()


def test_demo_rejects_bad_options() -> None:
    done = _demo("--orders", "0", timeout=60)
    assert done.returncode == 2 and "--orders" in done.stderr
    done = _demo("--fail-rate", "1.5", timeout=60)
    assert done.returncode == 2 and "rate" in done.stderr


def test_demo_with_redis_unreachable_exits_unavailable(tmp_path: Path) -> None:
    done = _demo(
        "--orders",
        "5",
        "--redis",
        "redis://127.0.0.1:1/0",
        "--store",
        str(tmp_path / "w"),
        "--no-reconcile",
        timeout=60,
    )
    assert done.returncode == 4 and "Redis" in done.stderr, done.stderr


def test_store_only_demo_still_finds_every_message(tmp_path: Path) -> None:
    done = _demo(
        "--store-only", "--messages", "200", "--store", str(tmp_path / "s"), "--json", timeout=120
    )
    assert done.returncode == 0, done.stderr
    s = json.loads(done.stdout.strip().splitlines()[-1])
    assert s["written"] == 200 and s["missing"] == 0


@pytest.mark.redis
def test_demo_against_a_remote_broker(tmp_path: Path, seed: int) -> None:
    """`--endpoint`: the same flow over the gRPC transport, the broker a separate process."""
    from tests.e2e.grpc.server_process import ServerProcess

    home = tmp_path / "home"
    home.mkdir()
    server = ServerProcess(
        tmp_path / "server-store",
        home,
        "--flush",
        "sync",
        "--delay-levels",
        "100ms 150ms 200ms 300ms 500ms 800ms 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s",
    ).start()
    try:
        done = _demo(
            "--orders",
            "30",
            "--seed",
            str(seed),
            "--drop-rate",
            "0.15",
            "--endpoint",
            server.endpoint,
            "--no-reconcile",
            "--json",
        )
    finally:
        server.kill()
    assert done.returncode == 0, f"seed {seed}: exit {done.returncode}\n{done.stderr[-6000:]}"
    s = _summary(done)
    assert s["unaccounted"] == 0 and s["problems"] == []
    assert s["consumed_once"] == s["published"] and s["dead_lettered"] == s["poison"] == 3
    assert s["resent"] >= s["dropped"]
