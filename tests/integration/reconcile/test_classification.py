"""Every stub and log row lands in its class: exact counts and exact ids, on real databases.

The data set (`dataset.build`) holds a known number of rows in every class; the job runs in
a real local Spark session over real SQLite, PostgreSQL and MariaDB through JDBC.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from broker.store.config import WATERMARKS_OFF
from outbox.reconcile import (
    InvalidBounds,
    LogClass,
    PartitionPolicy,
    ReconcileOptions,
    StubClass,
    reconcile,
)
from reliable_cli import main
from reliable_cli.exit_codes import ExitCode

from .conftest import ALL_BACKENDS, BACKENDS
from .dataset import BASE, NOW, Seeded, build

pytestmark = pytest.mark.spark


def _detail(spark, path: Path) -> tuple[dict[str, set[str]], dict[str, set[tuple[str, str]]]]:
    rows = spark.read.parquet(str(path)).collect()  # a few dozen rows
    stubs: dict[str, set[str]] = {c.value: set() for c in StubClass}
    logs: dict[str, set[tuple[str, str]]] = {c.value: set() for c in LogClass}
    for r in rows:
        if r["kind"] == "stub":
            stubs[r["class"]].add(r["message_id"])
        else:
            logs[r["class"]].add((r["message_id"], r["consumer_group"]))
    return stubs, logs


def _expect(seeded: Seeded) -> tuple[dict[str, set[str]], dict[str, set[tuple[str, str]]]]:
    return (
        {c.value: ids for c, ids in seeded.stubs.items()},
        {c.value: ids for c, ids in seeded.logs.items()},
    )


@pytest.mark.parametrize("db_url", ALL_BACKENDS, indirect=True)
def test_every_class_has_exactly_its_rows(spark, db_url, engine, table_prefix, tmp_path):
    seeded = build(table_prefix)
    seeded.insert(engine)
    out = tmp_path / "detail"
    # small partitions: every table is read in several JDBC ranges
    result = reconcile(
        ReconcileOptions(
            db_url=db_url,
            table_prefix=table_prefix,
            report_parquet=str(out),
            report_all=True,
            partitions=PartitionPolicy(rows_per_partition=8),
        ),
        spark=spark,
        now=NOW,
    )
    want_stubs, want_logs = _expect(seeded)
    s = result.summary
    assert s.stubs == {k: len(v) for k, v in want_stubs.items()}
    assert s.log_rows == {k: len(v) for k, v in want_logs.items()}
    got_stubs, got_logs = _detail(spark, out)
    assert got_stubs == want_stubs
    assert got_logs == want_logs
    cert = s.certificate
    assert (
        cert.produced,
        cert.unaccounted,
        cert.manual,
        cert.in_flight,
        cert.backlogged,
        cert.dead_lettered,
        cert.void,
        cert.confirmed,
    ) == (41, 6, 2, 6, 6, 1, 2, 18)
    assert cert.duplicated == 0
    assert cert.confirmed_per_group == {"billing": 17, "g1": 5, "g2": 1}
    assert (cert.orphan_log_rows, cert.stale_log_rows) == (2, 2)
    assert not cert.clean
    lost = want_stubs[StubClass.LOST.value]
    oldest = min(lost, key=lambda mid: seeded.created[mid])
    assert s.oldest_unaccounted is not None and s.oldest_unaccounted.message_id == oldest
    lag = {(q.topic, q.queue_id): q for q in s.queues}
    assert lag[("orders", 0)].head == 27
    assert lag[("orders", 0)].lag["billing"] == {"watermark": 20, "source": "log", "lag": 7}
    assert lag[("audit", 0)].lag["g2"]["watermark"] == 5
    # bounds and row counts come from the tables
    conf_column = "_rowid" if db_url.startswith("sqlite") else "confirmed_at"
    assert result.plans["stub"] == ("id", 6, 41)
    assert result.plans["confirmation"] == (conf_column, 3, 23)
    assert result.plans["log"] == ("queue_offset", 2, 11)


def test_window_certificate_and_digests(spark, sqlite_url, table_prefix, tmp_path):
    seeded = build(table_prefix)
    seeded.insert(sa.create_engine(sqlite_url))
    since, until = BASE + timedelta(minutes=12), BASE + timedelta(minutes=21)
    opts = ReconcileOptions(db_url=sqlite_url, table_prefix=table_prefix, since=since, until=until)
    first = reconcile(opts, spark=spark, now=NOW).summary.certificate
    in_window = {mid for mid, at in seeded.created.items() if since <= at < until}
    want = {c: len(ids & in_window) for c, ids in seeded.stubs.items()}
    assert first.produced == len(in_window) == 9
    assert (
        (first.unaccounted, first.manual, first.in_flight, first.dead_lettered)
        == (
            want[StubClass.LOST],
            want[StubClass.EXHAUSTED],
            want[StubClass.IN_PROCESSING],
            want[StubClass.DEAD_LETTERED],
        )
        == (3, 2, 3, 1)
    )
    # the same ids give the same digests, whichever source and partitioning
    export = tmp_path / "lake"
    src = sqlite_url
    for logical, table in (
        ("message_stub", "message_stub"),
        ("confirmation", "confirmation"),
        ("consumption_log", "consumption_log"),
        ("topic_group", "topic_group"),
    ):
        (
            spark.read.format("jdbc")
            .option("url", "jdbc:sqlite:" + src.split("///", 1)[1])
            .option("driver", "org.sqlite.JDBC")
            .option("dbtable", f"{table_prefix}{table}")
            .option(
                "customSchema",
                "created_at STRING, confirmed_at STRING, "
                "dead_lettered_at STRING, next_resend_at STRING, escalated_at STRING, "
                "updated_at STRING, queue_offset BIGINT, id BIGINT",
            )
            .load()
            .drop("body")
            .write.parquet(str(export / logical))
        )
    lake = ReconcileOptions(parquet=str(export), since=since, until=until)
    second = reconcile(lake, spark=spark, now=NOW).summary.certificate
    assert second.digests == first.digests
    assert (second.produced, second.unaccounted) == (first.produced, first.unaccounted)
    # different id sets give different digests
    assert (
        len({first.digests["produced"], first.digests["consumed"], first.digests["unaccounted"]})
        == 3
    )


def test_committed_offsets_decide_what_was_passed(spark, sqlite_url, table_prefix, tmp_path):
    seeded = build(table_prefix)
    seeded.insert(sa.create_engine(sqlite_url))
    snapshot = tmp_path / "consumerOffset.json"
    # billing committed up to 23 on orders/0: offsets 21 and 22 were passed without a log row
    snapshot.write_text(
        json.dumps({"offsetTable": {"orders@billing": {"0": 23, "1": 51}, "audit@g2": {"0": 6}}})
    )
    result = reconcile(
        ReconcileOptions(db_url=sqlite_url, table_prefix=table_prefix, offsets=str(snapshot)),
        spark=spark,
        now=NOW,
    )
    s = result.summary
    assert s.stubs[StubClass.LOST.value] == len(seeded.stubs[StubClass.LOST]) + 2
    assert s.stubs[StubClass.BACKLOGGED.value] == len(seeded.stubs[StubClass.BACKLOGGED]) - 2
    q0 = next(q for q in s.queues if (q.topic, q.queue_id) == ("orders", 0))
    assert q0.lag["billing"] == {"watermark": 23, "source": "committed", "lag": 4}


def test_empty_tables(spark, sqlite_url, table_prefix):
    build(table_prefix, stubs=False, logs=False).tables.create_all(sa.create_engine(sqlite_url))
    result = reconcile(
        ReconcileOptions(db_url=sqlite_url, table_prefix=table_prefix), spark=spark, now=NOW
    )
    assert sum(result.summary.stubs.values()) == 0
    assert sum(result.summary.log_rows.values()) == 0
    assert result.summary.certificate.clean
    assert result.summary.oldest_unaccounted is None


@pytest.mark.postgres
@pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_only_the_consumer_side(spark, db_url, engine, table_prefix):
    seeded = build(table_prefix, stubs=False)
    seeded.insert(engine)
    result = reconcile(
        ReconcileOptions(db_url=db_url, table_prefix=table_prefix), spark=spark, now=NOW
    )
    assert sum(result.summary.stubs.values()) == 0
    assert result.summary.log_rows == {"MATCHED": 0, "STALE": 0, "ORPHAN": len(seeded.log_rows)}
    assert result.summary.certificate.clean


def test_only_the_stub_side(spark, sqlite_url, table_prefix):
    seeded = build(table_prefix, logs=False)
    seeded.insert(sa.create_engine(sqlite_url))
    result = reconcile(
        ReconcileOptions(db_url=sqlite_url, table_prefix=table_prefix), spark=spark, now=NOW
    )
    # No consumer evidence at all (no log row, no confirmation row, no committed offsets):
    # nothing says how far any group got, so every copy older than the expected latency
    # (all of them but the unsent new one) is overdue: lost, or exhausted where its sends
    # are spent (orders/0 15 and 16). Silence never reads as "still coming"; only the
    # CONFIRMED and VOID statuses stand.
    confirmed = sum(1 for r in seeded.stub_rows if r["status"] == "CONFIRMED")
    assert result.summary.stubs == {
        "CONFIRMED": confirmed,
        "VOID": 2,
        "LOST": len(seeded.stub_rows) - confirmed - 5,
        "IN_PROCESSING": 0,
        "EXHAUSTED": 2,
        "DEAD_LETTERED": 0,
        "BACKLOGGED": 1,
    }
    assert sum(result.summary.log_rows.values()) == 0


# --- queue bounds: a stub whose copy the broker no longer holds is lost, not backlogged.
# The data set's orders/0 has backlogged stubs at offsets 21-24 (above billing's watermark,
# 20); audit/0 one at 7 (g2 has not reached it). A broker that lost the tail of orders/0
# (its end is now 23) no longer holds 23 and 24, and one whose audit/0 files were cleaned
# up to 8 no longer holds 7: with the bounds those three stubs are lost, without them
# backlogged. (In this module to share its Spark session.)

GONE = {"orders": {"0": 23, "1": 51}, "audit": {"0": {"max": 9, "min": 8}}}


def _gone_ids(seeded) -> set[str]:
    rows = {
        (r["topic"], r["queue_id"], r["queue_offset"]): r["message_id"] for r in seeded.stub_rows
    }
    return {rows[("orders", 0, 23)], rows[("orders", 0, 24)], rows[("audit", 0, 7)]}


@pytest.mark.parametrize("db_url", BACKENDS, indirect=True)
def test_a_stub_beyond_the_queue_end_is_lost_with_bounds_and_backlogged_without(
    spark, db_url, engine, table_prefix, tmp_path
):
    seeded = build(table_prefix)
    seeded.insert(engine)
    lost, backlogged = (len(seeded.stubs[StubClass.LOST]), len(seeded.stubs[StubClass.BACKLOGGED]))
    gone = _gone_ids(seeded)
    assert gone <= seeded.stubs[StubClass.BACKLOGGED]

    without = reconcile(
        ReconcileOptions(db_url=db_url, table_prefix=table_prefix), spark=spark, now=NOW
    )
    assert without.summary.stubs[StubClass.LOST.value] == lost
    assert without.summary.stubs[StubClass.BACKLOGGED.value] == backlogged

    bounds = tmp_path / "bounds.json"
    bounds.write_text(json.dumps(GONE))
    report = tmp_path / "report"
    with_bounds = reconcile(
        ReconcileOptions(
            db_url=db_url,
            table_prefix=table_prefix,
            queue_bounds=str(bounds),
            report_parquet=str(report),
        ),
        spark=spark,
        now=NOW,
    )
    s = with_bounds.summary
    assert s.stubs[StubClass.LOST.value] == lost + 3
    assert s.stubs[StubClass.BACKLOGGED.value] == backlogged - 3
    assert s.certificate.unaccounted == lost + 3
    rows = spark.read.parquet(str(report)).where("kind = 'stub' and class = 'LOST'").collect()
    assert {r["message_id"] for r in rows} == seeded.stubs[StubClass.LOST] | gone
    reasons = {r["message_id"]: r["reason"] for r in rows}
    assert reasons[min(gone)].startswith("no longer held by the broker")


def test_bounds_from_a_table_a_mapping_and_the_grace(spark, sqlite_url, table_prefix):
    seeded = build(table_prefix)
    engine = sa.create_engine(sqlite_url)
    seeded.insert(engine)
    lost = len(seeded.stubs[StubClass.LOST])
    table = f"{table_prefix}queue_bounds"
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                f'CREATE TABLE "{table}" (topic TEXT, queue_id INTEGER, '
                "max_offset INTEGER, min_offset INTEGER)"
            )
        )
        conn.execute(
            sa.text(f"INSERT INTO \"{table}\" VALUES ('orders', 0, 23, 0), ('audit', 0, 9, 8)")
        )
    result = reconcile(
        ReconcileOptions(
            db_url=sqlite_url, table_prefix=table_prefix, queue_bounds=f"table:{table}"
        ),
        spark=spark,
        now=NOW,
    )
    assert result.summary.stubs[StubClass.LOST.value] == lost + 3
    # a mapping (max offsets only): with a grace longer than the stubs' age nothing is gone
    # (and the old unsent stub is not lost either)
    young = reconcile(
        ReconcileOptions(
            db_url=sqlite_url,
            table_prefix=table_prefix,
            queue_bounds={("orders", 0): 23},
            grace=timedelta(days=30),
        ),
        spark=spark,
        now=NOW,
    )
    assert young.summary.stubs[StubClass.LOST.value] == lost - 1
    assert (
        young.summary.stubs[StubClass.BACKLOGGED.value]
        == len(seeded.stubs[StubClass.BACKLOGGED]) + 1
    )


def test_bad_bounds_are_typed_errors_with_their_exit_codes(
    spark, sqlite_url, table_prefix, tmp_path, capsys
):
    seeded = build(table_prefix)
    seeded.insert(sa.create_engine(sqlite_url))
    base = ["reconcile", "--db", sqlite_url, "--prefix", table_prefix, "--queue-bounds"]
    cases = {
        "not-json.json": "{orders: 1",
        "negative.json": json.dumps({"orders": {"0": -1}}),
        "min-above-max.json": json.dumps({"orders": {"0": {"max": 3, "min": 5}}}),
        "no-max.json": json.dumps([{"topic": "orders", "queue_id": 0}]),
        "text-offset.json": json.dumps({"orders": {"0": "twelve"}}),
        "bad-queue.json": json.dumps({"orders": {"first": 3}}),
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(InvalidBounds):
            reconcile(
                ReconcileOptions(
                    db_url=sqlite_url, table_prefix=table_prefix, queue_bounds=str(path)
                ),
                spark=spark,
                now=NOW,
            )
    good = tmp_path / "bounds.json"
    good.write_text(json.dumps(GONE))
    assert main([*base, str(good), "--json"]) == ExitCode.UNACCOUNTED
    doc = json.loads(capsys.readouterr().out)
    # +1: at the real time the data set's young unsent stub is past its grace as well
    assert doc["stubs"]["lost"] == len(seeded.stubs[StubClass.LOST]) + 3 + 1
    assert main([*base, str(tmp_path / "negative.json")]) == ExitCode.FAILURE
    assert "bad queue bounds" in capsys.readouterr().err
    assert main([*base, str(tmp_path / "absent.json")]) == ExitCode.UNAVAILABLE
    assert "absent.json" in capsys.readouterr().err
    assert main([*base, "grpc:no-port"]) == ExitCode.USAGE
    assert "grpc:HOST:PORT" in capsys.readouterr().err
    # nothing listens there: the broker is unavailable, not "no bounds"
    assert main([*base, "grpc:127.0.0.1:1"]) == ExitCode.UNAVAILABLE
    assert "queue bounds" in capsys.readouterr().err


STORE = {
    "mapped_file_size_commitlog": 1 << 20,
    "mapped_file_size_consume_queue": 20 * 2_000,
    "max_hash_slot_num": 2_000,
    "max_index_num": 8_000,
    **WATERMARKS_OFF,
}


def test_bounds_asked_live_of_an_embedded_broker(spark, sqlite_url, table_prefix, tmp_path):
    """A real broker whose orders/0 holds 23 messages and audit/0 holds 9: the stubs at 23
    and 24 of orders/0 are gone; through the transport, a TransportOffsets, or a Parquet
    export of the same figures."""
    from outbox.adapters import TransportOffsets
    from reliable import Message, connect

    seeded = build(table_prefix)
    seeded.insert(sa.create_engine(sqlite_url))
    lost = len(seeded.stubs[StubClass.LOST])
    transport = connect("embedded", store_dir=tmp_path / "store", **STORE)
    transport.start()
    try:
        for topic, count in (("orders", 23), ("audit", 9)):
            queue = next(q for q in transport.route(topic).write_queues if q.queue_id == 0)
            transport.send_batch(
                [Message(topic, f"{topic}-{i}".encode()) for i in range(count)], queue
            )
        found = {}
        for name, live in (("transport", transport), ("queue bounds", TransportOffsets(transport))):
            result = reconcile(
                ReconcileOptions(db_url=sqlite_url, table_prefix=table_prefix, queue_bounds=live),
                spark=spark,
                now=NOW,
            )
            found[name] = result.summary.stubs[StubClass.LOST.value]
        assert found == {"transport": lost + 2, "queue bounds": lost + 2}
    finally:
        transport.close()
    export = tmp_path / "bounds.parquet"
    spark.createDataFrame(
        [("orders", 0, 23, 0), ("audit", 0, 9, 0)],
        "topic string, queue_id int, max_offset long, min_offset long",
    ).write.parquet(str(export))
    result = reconcile(
        ReconcileOptions(db_url=sqlite_url, table_prefix=table_prefix, queue_bounds=str(export)),
        spark=spark,
        now=NOW,
    )
    assert result.summary.stubs[StubClass.LOST.value] == lost + 2
