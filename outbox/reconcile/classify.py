"""Classification: one pass over stubs and the consumer side, as DataFrame operations.

Shape (one full-outer join, no driver-side collect of any table):

    confirmation ─┐ union                          topic_group ─(broadcast)─┐
    log ──────────┴─► group by message_id ─┐                                 │
                                           ├─ full outer join on message_id ─┤
    stub ──────────────────────────────────┘                                 │
    watermarks (log max offset + committed offsets, per topic/queue/group) ──┘ (broadcast)

The consumer side is folded to one row per message (its confirmed groups, its log rows)
before the join, so the join's output is one row per message id: a stub, a consumer side,
or both. Every verdict is then a row-local expression over that row.

Watermarks (how far each group has got on each queue) and queue bounds (what the broker
still holds): `outbox.reconcile.watermarks`.

Unknown queue (`queue_id` -1, a send over gRPC): no watermark or bound speaks for the copy;
a group without a log row has lost it once the stub is older than the group's expected
latency (`outbox.latency.ExpectedLatency`, the resend worker's rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from outbox.errors import REFUSED_PREFIX
from outbox.latency import ExpectedLatency
from outbox.reconcile.classes import LogClass, RepairAction, StubClass
from outbox.reconcile.watermarks import (
    ANY_GROUP,
    bounds_map,
    copy_position,
    queue_key,
    repair_evidence,
    watermark_map,
    watermarks,
    wm_key,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import Column, DataFrame

__all__ = [
    "ANY_GROUP",
    "Classified",
    "Inputs",
    "Window",
    "classify",
    "log_class",
    "repair_evidence",
    "ts_lit",
    "watermarks",
]


@dataclass(frozen=True)
class Window:
    """[since, until) on the stub's created_at (naive UTC); None = open."""

    since: datetime | None = None
    until: datetime | None = None


@dataclass
class Inputs:
    """The canonical DataFrames (see `sources`)."""

    stub: DataFrame
    confirmation: DataFrame
    log: DataFrame
    topic_group: DataFrame | None = None
    offsets: DataFrame | None = None
    bounds: DataFrame | None = None  # topic, queue_id, max_offset, min_offset (`bounds`)
    audit: DataFrame | None = None  # earlier repairs' audit rows (`repair.audit_table`)


@dataclass
class Classified:
    """One row per message id (`messages`), and the views derived from it."""

    messages: DataFrame
    watermarks: DataFrame

    def stubs(self) -> DataFrame:
        """Stub detail rows."""
        from pyspark.sql import functions as F

        m = self.messages.where(F.col("has_stub"))
        return m.select(
            F.lit("stub").alias("kind"),
            "message_id",
            F.array_join("missing_groups", ",").alias("consumer_group"),
            "topic",
            "queue_id",
            "queue_offset",
            F.col("stub_class").alias("class"),
            "reason",
            "created_at",
            "in_window",
            "send_count",
            "max_sends",
        )

    def logs(self) -> DataFrame:
        """Consumption-log detail rows."""
        from pyspark.sql import functions as F

        m = self.messages.where(F.size("logs") > 0)
        e = m.select(
            "message_id",
            "has_stub",
            "in_window",
            "confirmed_groups",
            "status_confirmed",
            F.explode("logs").alias("l"),
        )
        cls = log_class(F.col("l"))
        reason = (
            F.when(~F.col("has_stub"), F.lit("no stub with this message id"))
            .when(F.col("l.dead_lettered_at").isNotNull(), F.lit("dead-lettered"))
            .when(
                cls == LogClass.STALE.value,
                F.lit("group confirmed the message; log row left behind"),
            )
            .otherwise(F.lit(""))
        )
        return e.select(
            F.lit("log").alias("kind"),
            "message_id",
            F.col("l.consumer_group").alias("consumer_group"),
            F.col("l.topic").alias("topic"),
            F.col("l.queue_id").alias("queue_id"),
            F.col("l.queue_offset").alias("queue_offset"),
            cls.alias("class"),
            reason.alias("reason"),
            F.col("l.created_at").alias("created_at"),
            F.when(F.col("has_stub"), F.col("in_window"))
            .otherwise(F.col("l.in_window"))
            .alias("in_window"),
            F.lit(None).cast("int").alias("send_count"),
            F.lit(None).cast("int").alias("max_sends"),
        )


def log_class(row: Column) -> Column:
    """The class of one log row (a `logs` element) of a classified message row."""
    from pyspark.sql import functions as F

    return (
        F.when(~F.col("has_stub"), LogClass.ORPHAN.value)
        .when(
            F.col("status_confirmed") | F.array_contains("confirmed_groups", row["consumer_group"]),
            LogClass.STALE.value,
        )
        .otherwise(LogClass.MATCHED.value)
    )


def ts_lit(value: datetime) -> Column:
    """A TIMESTAMP_NTZ literal of a naive UTC datetime (independent of the local zone)."""
    from pyspark.sql import functions as F

    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return F.lit(value.strftime("%Y-%m-%d %H:%M:%S.%f")).cast("timestamp_ntz")


def _in_window(col: Column, window: Window) -> Column:
    from pyspark.sql import functions as F

    cond = F.lit(True)
    if window.since is not None:
        cond = cond & (col >= ts_lit(window.since))
    if window.until is not None:
        cond = cond & (col < ts_lit(window.until))
    return F.coalesce(cond, F.lit(False))


def classify(
    inputs: Inputs,
    now: datetime,
    grace: timedelta = timedelta(minutes=5),
    window: Window | None = None,
    latency: ExpectedLatency | None = None,
) -> Classified:
    """Build the classified, one-row-per-message DataFrame (lazily: nothing runs here).

    `latency`: how long each group may take to confirm; a copy whose queue is unknown
    (`queue_id` -1, a send over gRPC) that a group has not confirmed nor logged by then
    is lost (the resend worker's rule, `outbox.latency`)."""
    window = window or Window()
    latency = latency or ExpectedLatency()
    stub = _expecting_stubs(inputs)
    side = _consumer_side(inputs, window)
    wm = watermarks(inputs.log, inputs.offsets, repair_evidence(inputs.audit))
    joined = _with_broker_maps(stub.join(side, "message_id", "full_outer"), wm, inputs.bounds)
    m = _group_sets(_filled(joined))
    m = _unlogged_fates(m, now, grace, latency, judge_silence=inputs.offsets is None)
    return Classified(messages=_verdicts(m, now, grace, window), watermarks=wm)


# ---------------------------------------------------------------- shared expressions


def _no_groups() -> Column:
    from pyspark.sql import functions as F

    return F.array().cast("array<string>")


def _status() -> Column:
    """The stub's status, upper case ("" when there is no stub)."""
    from pyspark.sql import functions as F

    return F.upper(F.coalesce("status", F.lit("")))


def _is_open() -> Column:
    """A stub that is neither confirmed nor void."""
    from pyspark.sql import functions as F

    return F.col("has_stub") & ~_status().isin("CONFIRMED", "VOID")


def _unsent() -> Column:
    from pyspark.sql import functions as F

    return F.col("queue_offset").isNull()


def _aged(now: datetime, grace: timedelta) -> Column:
    """Older than the grace period."""
    from pyspark.sql import functions as F

    return F.col("created_at") < (ts_lit(now) - F.lit(grace))


def _is_any() -> Column:
    """The stub declares no group, and none confirmed it: "some group" misses it."""
    from pyspark.sql import functions as F

    return F.array_contains("missing_groups", ANY_GROUP)


# ---------------------------------------------------------------- the two sides, joined


def _expecting_stubs(inputs: Inputs) -> DataFrame:
    """The stubs with the groups each expects (`expected`): its own list plus the topic's
    declared groups; settled stubs (CONFIRMED / VOID: nearly all of them) expect none, so
    they skip the array work."""
    from pyspark.sql import functions as F

    stub = inputs.stub
    declared = F.filter(
        F.transform(F.split(F.coalesce("expected_groups", F.lit("")), ","), lambda g: F.trim(g)),
        lambda g: F.length(g) > 0,
    )
    if inputs.topic_group is not None:
        per_topic = inputs.topic_group.groupBy("topic").agg(
            F.collect_set("consumer_group").alias("topic_groups")
        )
        stub = stub.join(F.broadcast(per_topic), "topic", "left")
    else:
        stub = stub.withColumn("topic_groups", F.lit(None).cast("array<string>"))
    settled = _status().isin("CONFIRMED", "VOID")
    no_groups = _no_groups()
    return stub.select(
        "*",
        F.when(settled, no_groups)
        .otherwise(F.array_distinct(F.concat(declared, F.coalesce("topic_groups", no_groups))))
        .alias("expected"),
        F.lit(True).alias("has_stub"),
    )


def _consumer_side(inputs: Inputs, window: Window) -> DataFrame:
    """One row per message id: the groups that confirmed it, how many confirmation rows,
    its log rows (structs), and whether an earlier repair marked its stub due."""
    from pyspark.sql import functions as F

    log = inputs.log.withColumn("in_window", _in_window(F.col("created_at"), window))
    conf = inputs.confirmation.select(
        "message_id",
        "consumer_group",
        F.lit("C").alias("kind"),
        F.lit(None)
        .cast(
            "struct<consumer_group:string,topic:string,queue_id:int,"
            "queue_offset:bigint,created_at:timestamp_ntz,"
            "dead_lettered_at:timestamp_ntz,in_window:boolean>"
        )
        .alias("l"),
    )
    logs = log.select(
        "message_id",
        "consumer_group",
        F.lit("L").alias("kind"),
        F.struct(
            "consumer_group",
            "topic",
            "queue_id",
            "queue_offset",
            "created_at",
            "dead_lettered_at",
            "in_window",
        ).alias("l"),
    )
    side_rows = conf.unionByName(logs)
    if inputs.audit is not None:  # stubs an earlier repair marked due
        marked = inputs.audit.where(F.col("action") == RepairAction.MARK_RESEND_DUE.value).select(
            "message_id",
            F.lit(None).cast("string").alias("consumer_group"),
            F.lit("R").alias("kind"),
            F.lit(None).cast(conf.schema["l"].dataType).alias("l"),
        )
        side_rows = side_rows.unionByName(marked)
    return side_rows.groupBy("message_id").agg(
        F.collect_set(F.when(F.col("kind") == "C", F.col("consumer_group"))).alias(
            "confirmed_groups"
        ),
        F.count(F.when(F.col("kind") == "C", F.lit(1))).alias("confirmation_rows"),
        F.collect_list(F.when(F.col("kind") == "L", F.col("l"))).alias("logs"),
        F.max(F.col("kind") == "R").alias("marked_due"),
    )


def _with_broker_maps(joined: DataFrame, wm: DataFrame, bounds: DataFrame | None) -> DataFrame:
    """Every message row with the watermark map (`wm`) and the queue bounds maps (`bmax`,
    `bmin`; null maps without bounds), each one small row broadcast to the join output."""
    from pyspark.sql import functions as F

    joined = joined.crossJoin(F.broadcast(watermark_map(wm)))
    if bounds is None:
        return joined.withColumns(
            {
                "bmax": F.lit(None).cast("map<string,bigint>"),
                "bmin": F.lit(None).cast("map<string,bigint>"),
            }
        )
    return joined.crossJoin(F.broadcast(bounds_map(bounds)))


def _filled(joined: DataFrame) -> DataFrame:
    """A message with only one side: the other side's columns as empty, not null."""
    from pyspark.sql import functions as F

    return (
        joined.select(
            "*",
            F.coalesce("has_stub", F.lit(False)).alias("_has_stub"),
            F.coalesce("confirmed_groups", F.array().cast("array<string>")).alias("_conf"),
            F.coalesce("logs", F.array()).alias("_logs"),
            F.coalesce("marked_due", F.lit(False)).alias("_marked"),
        )
        .drop("has_stub", "confirmed_groups", "logs", "marked_due")
        .withColumnsRenamed(
            {
                "_has_stub": "has_stub",
                "_conf": "confirmed_groups",
                "_logs": "logs",
                "_marked": "marked_due",
            }
        )
    )


# ---------------------------------------------------------------- per-group verdicts


def _group_sets(m: DataFrame) -> DataFrame:
    """The groups an open stub still misses (`missing_groups`; ANY_GROUP when it declares
    none), those of them without a log row (`unlogged_groups`), the groups with a log row
    (`log_groups`) or a dead-lettered one (`dlq_groups`), and where each group's copy sits
    (`positions`: the group's own retry-topic copy the resend worker recorded)."""
    from pyspark.sql import functions as F

    is_open = _is_open()
    empty = _no_groups()
    no_expected = F.size("expected") == 0
    missing = (
        F.when(no_expected & (F.size("confirmed_groups") > 0), F.array().cast("array<string>"))
        .when(no_expected, F.array(F.lit(ANY_GROUP)))
        .otherwise(F.array_except("expected", "confirmed_groups"))
    )
    m = m.withColumn("missing_groups", F.when(is_open, missing).otherwise(empty))
    has_logs = F.size("logs") > 0
    m = m.withColumn(
        "log_groups",
        F.when(has_logs, F.transform("logs", lambda x: x["consumer_group"])).otherwise(empty),
    )
    m = m.withColumn(
        "dlq_groups",
        F.when(
            has_logs,
            F.transform(
                F.filter("logs", lambda x: x["dead_lettered_at"].isNotNull()),
                lambda x: x["consumer_group"],
            ),
        ).otherwise(empty),
    )
    is_any = _is_any()
    unlogged = (
        F.when(is_any & (F.size("logs") > 0), F.array().cast("array<string>"))
        .when(is_any, F.array(F.lit(ANY_GROUP)))
        .otherwise(F.array_except("missing_groups", F.col("log_groups")))
    )
    m = m.withColumn("unlogged_groups", F.when(is_open, unlogged).otherwise(empty))
    return m.withColumn(
        "positions",
        F.when(
            is_open & F.col("group_positions").isNotNull(),
            F.from_json("group_positions", "map<string,array<string>>"),
        ),
    )


def _passed_by(g: Column) -> Column:
    """The group's watermark is past its copy."""
    from pyspark.sql import functions as F

    topic, queue, offset = copy_position(F.col("positions"), g)
    mark = F.try_element_at("wm", wm_key(topic, queue, g))
    return offset < F.coalesce(mark, F.lit(-1))


def _gone_for(g: Column) -> Column:
    """The broker no longer holds the group's copy: at/after the queue's end, or below
    its start (no bound known: not gone)."""
    from pyspark.sql import functions as F

    topic, queue, offset = copy_position(F.col("positions"), g)
    key = queue_key(topic, queue)
    high = F.try_element_at("bmax", key)
    low = F.try_element_at("bmin", key)
    return F.coalesce((offset >= high) | (offset < low), offset >= high, offset < low, F.lit(False))


def _overdue(
    now: datetime, latency: ExpectedLatency, judge_silence: bool
) -> Callable[[Column], Column]:
    """Whether a group's copy is overdue: nothing can speak for it (its queue unknown, a
    send through an Apache RocketMQ proxy; or, with no committed offsets given, no
    watermark of the group there) and the stub is older than the group's expected latency
    (the resend worker's rule too). With offsets given, a group without one there has not
    reached the copy: backlogged, not overdue."""
    from pyspark.sql import functions as F

    deadlines = [x for g, t in sorted(latency.groups.items()) for x in (F.lit(g), ts_lit(now - t))]
    default_deadline = ts_lit(now - latency.default)

    def overdue_for(g: Column) -> Column:
        topic, _, offset = copy_position(F.col("positions"), g)
        queue = F.coalesce(
            F.try_element_at(F.try_element_at(F.col("positions"), g), F.lit(2)).cast("int"),
            F.col("queue_id"),
            F.lit(-1),
        )
        no_mark = (
            F.try_element_at("wm", wm_key(topic, queue.cast("string"), g)).isNull()
            if judge_silence
            else F.lit(False)
        )
        deadline = (
            F.coalesce(F.try_element_at(F.create_map(*deadlines), g), default_deadline)
            if deadlines
            else default_deadline
        )
        return F.coalesce(
            ((queue < 0) | (offset < 0) | no_mark) & (F.col("created_at") < deadline),
            F.lit(False),
        )

    return overdue_for


def _unlogged_fates(
    m: DataFrame, now: datetime, grace: timedelta, latency: ExpectedLatency, judge_silence: bool
) -> DataFrame:
    """Of the groups without a log row for a sent copy: those whose copy the broker no
    longer holds (`gone_groups`, once past the grace period), those overdue
    (`overdue_groups`), and every group that will never receive it (`passed_groups`:
    passed by, gone or overdue)."""
    from pyspark.sql import functions as F

    empty = _no_groups()
    unlogged_sent = F.col("queue_offset").isNotNull() & (F.size("unlogged_groups") > 0)
    m = m.withColumn(
        "gone_groups",
        F.when(unlogged_sent & _aged(now, grace), F.filter("unlogged_groups", _gone_for)).otherwise(
            empty
        ),
    )
    m = m.withColumn(
        "overdue_groups",
        F.when(
            unlogged_sent, F.filter("unlogged_groups", _overdue(now, latency, judge_silence))
        ).otherwise(empty),
    )
    passed = F.filter(
        "unlogged_groups",
        lambda g: (
            _passed_by(g)
            | F.array_contains("gone_groups", g)
            | F.array_contains("overdue_groups", g)
        ),
    )
    return m.withColumn("passed_groups", F.when(unlogged_sent, passed).otherwise(empty))


# ---------------------------------------------------------------- the stub's class


def _stub_class(due: Column) -> Column:
    """The stub's class (`StubClass`); null for a message without a stub."""
    from pyspark.sql import functions as F

    status = _status()
    is_any = _is_any()
    no_sends_left = (
        F.coalesce("send_count", F.lit(0)) >= F.coalesce("max_sends", F.lit(16))
    ) | F.col("escalated_at").isNotNull()
    dead = (F.size(F.array_intersect("missing_groups", "dlq_groups")) > 0) | (
        is_any & (F.size("dlq_groups") > 0)
    )
    held = (F.size(F.array_intersect("missing_groups", "log_groups")) > 0) | (
        is_any & (F.size("logs") > 0)
    )
    return (
        F.when(~F.col("has_stub"), F.lit(None).cast("string"))
        .when(status == "VOID", StubClass.VOID.value)
        .when((status == "CONFIRMED") | (F.size("missing_groups") == 0), StubClass.CONFIRMED.value)
        .when(dead, StubClass.DEAD_LETTERED.value)
        # escalated (max sends reached, or the broker refused it for good): manual
        .when((due & no_sends_left) | F.col("escalated_at").isNotNull(), StubClass.EXHAUSTED.value)
        .when(due, StubClass.LOST.value)
        # a repair marked it due: unaccounted until every group confirms it
        .when(F.col("marked_due"), StubClass.LOST.value)
        # in processing only while a group still missing it holds a log row (a row left
        # behind by a group that confirmed says nothing about the others)
        .when(held, StubClass.IN_PROCESSING.value)
        .otherwise(StubClass.BACKLOGGED.value)
    )


def _lost_reason(due: Column) -> Column:
    """Why a LOST stub is lost: marked due, never sent, gone from the broker, overdue, or
    passed by its groups."""
    from pyspark.sql import functions as F

    def bound(name: str) -> Column:
        key = queue_key(F.col("topic"), F.col("queue_id").cast("string"))
        return F.coalesce(F.try_element_at(name, key).cast("string"), F.lit("?"))

    return (
        F.when(~due, F.lit("marked due by a repair; not confirmed since"))
        .when(_unsent(), F.lit("never sent; older than the grace period"))
        .when(
            F.size("gone_groups") > 0,
            F.concat(
                F.lit("no longer held by the broker (queue "),
                bound("bmin"),
                F.lit(".."),
                bound("bmax"),
                F.lit("); not received by "),
                F.array_join("gone_groups", ","),
            ),
        )
        .when(
            F.size("overdue_groups") > 0,
            F.concat(
                F.lit("not confirmed by "),
                F.array_join("overdue_groups", ","),
                F.when(
                    F.coalesce(F.col("queue_id"), F.lit(-1)) < 0,
                    F.lit(" within the expected latency (queue unknown)"),
                ).otherwise(F.lit(" within the expected latency (no offset for the group)")),
            ),
        )
        .otherwise(
            F.concat(
                F.lit("passed by "), F.array_join("passed_groups", ","), F.lit(" without a log row")
            )
        )
    )


def _reason(stub_class: Column, due: Column) -> Column:
    """The stub's class in words, for the report."""
    from pyspark.sql import functions as F

    return (
        F.when(stub_class == StubClass.LOST.value, _lost_reason(due))
        .when(
            (stub_class == StubClass.EXHAUSTED.value)
            & F.coalesce(F.col("last_error"), F.lit("")).startswith(REFUSED_PREFIX),
            F.concat(
                F.lit("refused by the broker, cannot be sent: "),
                F.substring(F.col("last_error"), len(REFUSED_PREFIX) + 1, 300),
            ),
        )
        .when(
            stub_class == StubClass.EXHAUSTED.value,
            F.concat(
                F.lit("lost after "),
                F.coalesce("send_count", F.lit(0)).cast("string"),
                F.lit(" sends; manual handling"),
            ),
        )
        .when(
            stub_class == StubClass.DEAD_LETTERED.value,
            F.concat(
                F.lit("dead-lettered by "),
                F.array_join(F.array_intersect("missing_groups", "dlq_groups"), ","),
            ),
        )
        .when(
            stub_class == StubClass.BACKLOGGED.value,
            F.when(_unsent(), F.lit("awaiting first send")).otherwise(
                F.lit("offset not reached yet")
            ),
        )
        .when(
            (stub_class == StubClass.CONFIRMED.value) & (_status() != "CONFIRMED"),
            F.lit("every expected group confirmed; status not updated yet"),
        )
        .otherwise(F.lit(""))
    )


def _verdicts(m: DataFrame, now: datetime, grace: timedelta, window: Window) -> DataFrame:
    """The classified message rows: each stub's class, its reason, whether a resend is
    due, and the consumer side's facts the detail views read."""
    from pyspark.sql import functions as F

    status = _status()
    due = (F.size("passed_groups") > 0) | (
        _unsent() & _aged(now, grace) & (F.size("unlogged_groups") > 0)
    )
    stub_class = _stub_class(due)
    return m.select(
        "message_id",
        "has_stub",
        "topic",
        "queue_id",
        "queue_offset",
        "status",
        "send_count",
        "max_sends",
        "created_at",
        "next_resend_at",
        "expected",
        "confirmed_groups",
        "missing_groups",
        "passed_groups",
        "logs",
        (F.coalesce("confirmation_rows", F.lit(0)) - F.size("confirmed_groups")).alias(
            "duplicate_confirmations"
        ),
        (status == "CONFIRMED").alias("status_confirmed"),
        stub_class.alias("stub_class"),
        _reason(stub_class, due).alias("reason"),
        (_is_open() & due).alias("resend_due"),
        _in_window(F.col("created_at"), window).alias("in_window"),
    )
