"""The console's outbox and reconciliation pages, on real databases, in a real browser.

The outbox page counts the stub table exactly (by status, by age, by topic, the oldest
unconfirmed first); the reconciliation page shows the run the real Spark job just wrote to
its report table, with the certificate the job printed; and the console cannot write to
the database even if it tried (its sessions are read-only in the database itself).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from outbox.models import OutboxTables
from reliable_cli.console.database import DatabaseUnavailable, OutboxView
from tests.e2e.console.harness import ConsoleProcess, login, save
from tests.e2e.grpc.server_process import REPO, ServerProcess
from tests.integration.reconcile.dataset import build

PG_URL = os.environ.get("RELIABLE_TEST_PG", "postgresql+psycopg2://postgres@127.0.0.1:5432/test")


@pytest.fixture
def pg_prefix(request: pytest.FixtureRequest) -> Iterator[str]:
    prefix = f"console_{os.getpid()}_"
    yield prefix
    engine = sa.create_engine(PG_URL)
    md = sa.MetaData()
    for name in sa.inspect(engine).get_table_names():
        if name.startswith(prefix):
            sa.Table(name, md)
    md.drop_all(engine)
    engine.dispose()


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ],
)
def test_the_console_cannot_write_to_the_outbox_database(
    backend: str, tmp_path: Path, pg_prefix: str
) -> None:
    url = f"sqlite:///{tmp_path / 'shop.db'}" if backend == "sqlite" else PG_URL
    prefix = "reliable_" if backend == "sqlite" else pg_prefix
    tables = OutboxTables(prefix=prefix)
    writer = sa.create_engine(url)
    tables.create_all(writer)
    writer.dispose()
    view = OutboxView(url, prefix=prefix)
    try:
        assert view.backlog().by_status == {}
        with pytest.raises(sa.exc.DBAPIError), view.engine.begin() as conn:
            conn.execute(sa.insert(tables.topic_group).values(topic="t", consumer_group="g"))
        with view.engine.connect() as conn:
            assert (
                conn.execute(
                    sa.select(sa.func.count()).select_from(tables.topic_group)
                ).scalar_one()
                == 0
            )
    finally:
        view.close()
    with pytest.raises(DatabaseUnavailable):
        OutboxView("nosuchdialect://x").backlog()


@pytest.mark.slow
@pytest.mark.spark
def test_outbox_backlog_and_the_last_reconciliation_certificate(
    tmp_path: Path,
    broker: ServerProcess,
    browser: Any,
    make_console: Callable[..., ConsoleProcess],
    shots: Path | None,
) -> None:
    prefix = "shop_"
    db = f"sqlite:///{tmp_path / 'shop.db'}"
    seeded = build(prefix)
    engine = sa.create_engine(db)
    seeded.insert(engine)
    with engine.connect() as conn:
        stub = seeded.tables.stub
        statuses = dict(
            conn.execute(sa.select(stub.c.status, sa.func.count()).group_by(stub.c.status)).all()
        )
        oldest = conn.execute(
            sa.select(stub.c.message_id)
            .where(stub.c.status == "UNCONFIRMED")
            .order_by(stub.c.created_at, stub.c.id)
            .limit(1)
        ).scalar_one()
    engine.dispose()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    job = subprocess.run(
        [
            sys.executable,
            "-m",
            "reliable_cli",
            "reconcile",
            "--db",
            db,
            "--prefix",
            prefix,
            "--json",
            "--report-table",
            f"{prefix}reconcile_report",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=2",
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert job.returncode == 3, job.stderr[-2000:]  # the data set has lost messages
    doc = json.loads(job.stdout)
    unaccounted = doc["certificate"]["unaccounted"]
    assert unaccounted > 0

    console = make_console(broker.endpoint, "--db", db, "--prefix", prefix)
    browser.delete_all_cookies()
    login(browser, console.url)
    browser.get(console.url + "outbox")
    for status in ("UNCONFIRMED", "CONFIRMED", "VOID"):
        shown = browser.find_element("id", f"status-{status}").text.replace(",", "")
        assert int(shown) == statuses.get(status, 0), status
    ages = {
        r.find_elements("css selector", "td")[0].text: int(
            r.find_elements("css selector", "td")[1].text.replace(",", "")
        )
        for r in browser.find_elements("css selector", "#ages tr")
    }
    assert ages["> 24 h"] == statuses["UNCONFIRMED"]  # the data set is from 2026-01-01
    assert sum(ages.values()) == statuses["UNCONFIRMED"]
    first = browser.find_elements("css selector", "#oldest tr")[1]
    assert first.text.startswith(oldest)
    save(browser, shots, "outbox")

    browser.get(console.url + "reconcile")
    [run] = browser.find_elements("css selector", "#runs tr")[1:]
    assert run.text.startswith(doc["run_id"])
    cert = run.find_element("css selector", ".cert").text
    manual = doc["certificate"]["manual"]  # escalations awaiting an operator keep it open too
    assert manual > 0
    assert cert == f"NOT CLEAN ({unaccounted} unaccounted, {manual} awaiting manual handling)"
    lost = run.find_elements("css selector", "td")[3].text
    assert int(lost) == doc["stubs"]["lost"]
    save(browser, shots, "reconcile")
