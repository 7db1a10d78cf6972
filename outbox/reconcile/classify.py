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

Watermark of a consumer group on a queue (offsets below it were passed by the group):
the group's committed offset from a snapshot when one is given, and the log's max offset
for that topic/queue/group (rows at lower offsets were received later, so the group got
that far), counting the log rows earlier repairs deleted (kept in the audit table,
`repair_evidence`); the greatest of them. A stub a repair marked due (the audit again)
stays LOST until it is confirmed. A stub with no expected groups is compared with the
greatest watermark of any group on its queue.

Queue bounds (optional, `bounds`): the offsets the broker still holds on a queue,
[min_offset, max_offset). A copy outside them is gone (the tail lost in a crash under async
flush, or files cleaned): a group without a log row will never receive it, so the stub is
lost once it is older than the grace period, whatever the watermarks say.

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

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

ANY_GROUP = "*"  # stands for "some group" when a stub declares no expected groups


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


_SEP = "\u0001"


def _wm_key(topic: Column, queue: Column, group: Column) -> Column:
    from pyspark.sql import functions as F

    return F.concat_ws(_SEP, topic, queue, group)


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


def repair_evidence(audit: DataFrame | None) -> DataFrame | None:
    """The log rows earlier repairs deleted (kept whole in the audit table): topic,
    queue_id, consumer_group, queue_offset. Their group received those messages, so they
    still count for its watermark: deleting a stale row never moves a watermark back."""
    from pyspark.sql import functions as F

    if audit is None:
        return None
    row = F.col("before")
    return audit.where(F.col("action") == RepairAction.CLOSE_STALE_LOG.value).select(
        F.get_json_object(row, "$.topic").alias("topic"),
        F.get_json_object(row, "$.queue_id").cast("int").alias("queue_id"),
        F.coalesce(F.get_json_object(row, "$.consumer_group"), F.col("consumer_group")).alias(
            "consumer_group"
        ),
        F.get_json_object(row, "$.queue_offset").cast("bigint").alias("queue_offset"),
    )


def watermarks(
    log: DataFrame, offsets: DataFrame | None, evidence: DataFrame | None = None
) -> DataFrame:
    """Per (topic, queue_id, consumer_group): the exclusive offset the group has passed,
    and where that figure came from (`log`, `audit`: a log row a repair deleted, or
    `committed`)."""
    from pyspark.sql import functions as F

    rows = log.select(
        "topic", "queue_id", "consumer_group", "queue_offset", F.lit("log").alias("src")
    )
    if evidence is not None:
        rows = rows.unionByName(evidence.select("*", F.lit("audit").alias("src")))
    from_log = (
        rows.where(F.col("queue_offset").isNotNull())
        .groupBy("topic", "queue_id", "consumer_group")
        .agg(
            F.max("queue_offset").alias("log_max"),
            F.max_by("src", F.struct("queue_offset", F.col("src") == "log")).alias("log_src"),
        )
    )
    if offsets is None:
        return from_log.select(
            "topic",
            "queue_id",
            "consumer_group",
            F.col("log_max").alias("watermark"),
            F.col("log_src").alias("watermark_source"),
        )
    committed = offsets.groupBy("topic", "queue_id", "consumer_group").agg(
        F.max("committed_offset").alias("committed")
    )
    both = from_log.join(committed, ["topic", "queue_id", "consumer_group"], "full_outer")
    return both.select(
        "topic",
        "queue_id",
        "consumer_group",
        F.greatest("log_max", "committed").alias("watermark"),
        F.when(F.col("committed").isNull(), F.col("log_src"))
        .when(F.col("log_max").isNull() | (F.col("committed") >= F.col("log_max")), "committed")
        .otherwise(F.col("log_src"))
        .alias("watermark_source"),
    )


def _bounds_map(bounds: DataFrame) -> DataFrame:
    """One row: maps "topic SEP queue" -> max_offset (bmax) and -> min_offset (bmin)."""
    from pyspark.sql import functions as F

    keyed = bounds.select(
        F.concat_ws(_SEP, F.col("topic"), F.col("queue_id").cast("string")).alias("k"),
        "max_offset",
        "min_offset",
    )
    # several rows for one queue: the widest range (the fewest copies called gone)
    per = keyed.groupBy("k").agg(F.max("max_offset").alias("hi"), F.min("min_offset").alias("lo"))
    return per.agg(
        F.map_from_entries(
            F.collect_list(F.when(F.col("hi").isNotNull(), F.struct("k", "hi")))
        ).alias("bmax"),
        F.map_from_entries(
            F.collect_list(F.when(F.col("lo").isNotNull(), F.struct("k", "lo")))
        ).alias("bmin"),
    )


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
    from pyspark.sql import functions as F

    window = window or Window()
    latency = latency or ExpectedLatency()
    now_lit = ts_lit(now)
    stub = inputs.stub

    # expected groups: the stub's own list, plus the topic's declared groups
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
    # settled stubs (CONFIRMED / VOID status: nearly all of them) skip the array work
    settled = F.upper(F.coalesce("status", F.lit(""))).isin("CONFIRMED", "VOID")
    no_groups = F.array().cast("array<string>")
    stub = stub.select(
        "*",
        F.when(settled, no_groups)
        .otherwise(F.array_distinct(F.concat(declared, F.coalesce("topic_groups", no_groups))))
        .alias("expected"),
        F.lit(True).alias("has_stub"),
    )

    # consumer side, one row per message id
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
    side = side_rows.groupBy("message_id").agg(
        F.collect_set(F.when(F.col("kind") == "C", F.col("consumer_group"))).alias(
            "confirmed_groups"
        ),
        F.count(F.when(F.col("kind") == "C", F.lit(1))).alias("confirmation_rows"),
        F.collect_list(F.when(F.col("kind") == "L", F.col("l"))).alias("logs"),
        F.max(F.col("kind") == "R").alias("marked_due"),
    )

    joined = stub.join(side, "message_id", "full_outer")

    # watermarks as one small map, "topic SEP queue SEP group" -> offset, broadcast to
    # the join output (the ANY_GROUP entry of a queue is the greatest of its groups)
    wm = watermarks(inputs.log, inputs.offsets, repair_evidence(inputs.audit))
    keyed = wm.select(
        _wm_key(F.col("topic"), F.col("queue_id").cast("string"), F.col("consumer_group")).alias(
            "k"
        ),
        "watermark",
    )
    anyg = (
        wm.groupBy("topic", "queue_id")
        .agg(F.max("watermark").alias("watermark"))
        .select(
            _wm_key(F.col("topic"), F.col("queue_id").cast("string"), F.lit(ANY_GROUP)).alias("k"),
            "watermark",
        )
    )
    wm_map = (
        keyed.unionByName(anyg)
        .where(F.col("watermark").isNotNull())
        .groupBy("k")
        .agg(F.max("watermark").alias("watermark"))  # keys unique
        .agg(F.map_from_entries(F.collect_list(F.struct("k", "watermark"))).alias("wm"))
    )
    joined = joined.crossJoin(F.broadcast(wm_map))
    if inputs.bounds is None:
        joined = joined.withColumns(
            {
                "bmax": F.lit(None).cast("map<string,bigint>"),
                "bmin": F.lit(None).cast("map<string,bigint>"),
            }
        )
    else:
        joined = joined.crossJoin(F.broadcast(_bounds_map(inputs.bounds)))

    m = (
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

    status = F.upper(F.coalesce("status", F.lit("")))
    is_open = F.col("has_stub") & ~status.isin("CONFIRMED", "VOID")
    empty = F.array().cast("array<string>")
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
    log_groups, dlq_groups = F.col("log_groups"), F.col("dlq_groups")
    is_any = F.array_contains("missing_groups", ANY_GROUP)
    unlogged = (
        F.when(is_any & (F.size("logs") > 0), F.array().cast("array<string>"))
        .when(is_any, F.array(F.lit(ANY_GROUP)))
        .otherwise(F.array_except("missing_groups", log_groups))
    )
    m = m.withColumn("unlogged_groups", F.when(is_open, unlogged).otherwise(empty))
    # where each group's copy sits: the stub's position, or the group's own retry-topic
    # copy recorded by the resend worker in group_positions
    m = m.withColumn(
        "positions",
        F.when(
            is_open & F.col("group_positions").isNotNull(),
            F.from_json("group_positions", "map<string,array<string>>"),
        ),
    )
    positions = F.col("positions")

    def passed_by(g: Column) -> Column:
        pos = F.try_element_at(positions, g)
        topic = F.coalesce(F.try_element_at(pos, F.lit(1)), F.col("topic"))
        queue = F.coalesce(F.try_element_at(pos, F.lit(2)), F.col("queue_id").cast("string"))
        offset = F.coalesce(F.try_element_at(pos, F.lit(3)).cast("bigint"), F.col("queue_offset"))
        mark = F.try_element_at("wm", _wm_key(topic, queue, g))
        return offset < F.coalesce(mark, F.lit(-1))

    unsent = F.col("queue_offset").isNull()
    aged = F.col("created_at") < (now_lit - F.lit(grace))

    def gone_for(g: Column) -> Column:
        """The broker no longer holds the group's copy: at/after the queue's end, or below
        its start (no bound known: not gone)."""
        pos = F.try_element_at(positions, g)
        topic = F.coalesce(F.try_element_at(pos, F.lit(1)), F.col("topic"))
        queue = F.coalesce(F.try_element_at(pos, F.lit(2)), F.col("queue_id").cast("string"))
        offset = F.coalesce(F.try_element_at(pos, F.lit(3)).cast("bigint"), F.col("queue_offset"))
        key = F.concat_ws(_SEP, topic, queue)
        high = F.try_element_at("bmax", key)
        low = F.try_element_at("bmin", key)
        return F.coalesce(
            (offset >= high) | (offset < low), offset >= high, offset < low, F.lit(False)
        )

    # a copy whose queue is unknown (a send through an Apache RocketMQ proxy), or, when no
    # committed offsets were given, one whose queue is known but for which the group has
    # no watermark (no log row there): nothing can speak for it, so it is overdue once the
    # stub is older than the group's expected latency (the resend worker's rule too). With
    # offsets given, a group without one there has not reached the copy: backlogged.
    judge_silence = inputs.offsets is None
    deadlines = [x for g, t in sorted(latency.groups.items()) for x in (F.lit(g), ts_lit(now - t))]
    default_deadline = ts_lit(now - latency.default)

    def overdue_for(g: Column) -> Column:
        pos = F.try_element_at(positions, g)
        topic = F.coalesce(F.try_element_at(pos, F.lit(1)), F.col("topic"))
        queue = F.coalesce(
            F.try_element_at(pos, F.lit(2)).cast("int"), F.col("queue_id"), F.lit(-1)
        )
        offset = F.coalesce(F.try_element_at(pos, F.lit(3)).cast("bigint"), F.col("queue_offset"))
        no_mark = (
            F.try_element_at("wm", _wm_key(topic, queue.cast("string"), g)).isNull()
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

    unlogged_sent = F.col("queue_offset").isNotNull() & (F.size("unlogged_groups") > 0)
    m = m.withColumn(
        "gone_groups",
        F.when(unlogged_sent & aged, F.filter("unlogged_groups", gone_for)).otherwise(empty),
    )
    m = m.withColumn(
        "overdue_groups",
        F.when(unlogged_sent, F.filter("unlogged_groups", overdue_for)).otherwise(empty),
    )
    passed = F.filter(
        "unlogged_groups",
        lambda g: (
            passed_by(g)
            | F.array_contains("gone_groups", g)
            | F.array_contains("overdue_groups", g)
        ),
    )
    m = m.withColumn("passed_groups", F.when(unlogged_sent, passed).otherwise(empty))
    due = (F.size("passed_groups") > 0) | (unsent & aged & (F.size("unlogged_groups") > 0))
    no_sends_left = (
        F.coalesce("send_count", F.lit(0)) >= F.coalesce("max_sends", F.lit(16))
    ) | F.col("escalated_at").isNotNull()
    dead = (F.size(F.array_intersect("missing_groups", dlq_groups)) > 0) | (
        is_any & (F.size(dlq_groups) > 0)
    )
    held = (F.size(F.array_intersect("missing_groups", log_groups)) > 0) | (
        is_any & (F.size("logs") > 0)
    )
    stub_class = (
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
    passed_txt = F.array_join("passed_groups", ",")
    reason = (
        F.when(
            stub_class == StubClass.LOST.value,
            F.when(~due, F.lit("marked due by a repair; not confirmed since"))
            .when(unsent, F.lit("never sent; older than the grace period"))
            .when(
                F.size("gone_groups") > 0,
                F.concat(
                    F.lit("no longer held by the broker (queue "),
                    F.coalesce(
                        F.try_element_at(
                            "bmin", F.concat_ws(_SEP, "topic", F.col("queue_id").cast("string"))
                        ).cast("string"),
                        F.lit("?"),
                    ),
                    F.lit(".."),
                    F.coalesce(
                        F.try_element_at(
                            "bmax", F.concat_ws(_SEP, "topic", F.col("queue_id").cast("string"))
                        ).cast("string"),
                        F.lit("?"),
                    ),
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
            .otherwise(F.concat(F.lit("passed by "), passed_txt, F.lit(" without a log row"))),
        )
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
                F.array_join(F.array_intersect("missing_groups", dlq_groups), ","),
            ),
        )
        .when(
            stub_class == StubClass.BACKLOGGED.value,
            F.when(unsent, F.lit("awaiting first send")).otherwise(F.lit("offset not reached yet")),
        )
        .when(
            (stub_class == StubClass.CONFIRMED.value) & (status != "CONFIRMED"),
            F.lit("every expected group confirmed; status not updated yet"),
        )
        .otherwise(F.lit(""))
    )
    m = m.select(
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
        reason.alias("reason"),
        (is_open & due).alias("resend_due"),
        _in_window(F.col("created_at"), window).alias("in_window"),
    )
    return Classified(messages=m, watermarks=wm)
