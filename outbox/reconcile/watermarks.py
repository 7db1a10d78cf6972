"""Where each consumer group has got to on each queue, and what the broker still holds.

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

`watermark_map` and `bounds_map` fold them to one small row of maps that `classify`
broadcasts to every message row; `copy_position` finds where one group's copy of a
message sits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.reconcile.classes import RepairAction

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

SEP = "\u0001"  # joins topic, queue and group into one map key
ANY_GROUP = "*"  # stands for "some group" when a stub declares no expected groups


def wm_key(topic: Column, queue: Column, group: Column) -> Column:
    """The watermark map's key of a group on a queue."""
    from pyspark.sql import functions as F

    return F.concat_ws(SEP, topic, queue, group)


def queue_key(topic: Column, queue: Column) -> Column:
    """The bounds maps' key of a queue."""
    from pyspark.sql import functions as F

    return F.concat_ws(SEP, topic, queue)


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


def bounds_map(bounds: DataFrame) -> DataFrame:
    """One row: maps "topic SEP queue" -> max_offset (bmax) and -> min_offset (bmin)."""
    from pyspark.sql import functions as F

    keyed = bounds.select(
        queue_key(F.col("topic"), F.col("queue_id").cast("string")).alias("k"),
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


def watermark_map(wm: DataFrame) -> DataFrame:
    """One row, one map "topic SEP queue SEP group" -> watermark (`wm`); a queue's
    ANY_GROUP entry is the greatest watermark of its groups."""
    from pyspark.sql import functions as F

    keyed = wm.select(
        wm_key(F.col("topic"), F.col("queue_id").cast("string"), F.col("consumer_group")).alias(
            "k"
        ),
        "watermark",
    )
    anyg = (
        wm.groupBy("topic", "queue_id")
        .agg(F.max("watermark").alias("watermark"))
        .select(
            wm_key(F.col("topic"), F.col("queue_id").cast("string"), F.lit(ANY_GROUP)).alias("k"),
            "watermark",
        )
    )
    return (
        keyed.unionByName(anyg)
        .where(F.col("watermark").isNotNull())
        .groupBy("k")
        .agg(F.max("watermark").alias("watermark"))  # keys unique
        .agg(F.map_from_entries(F.collect_list(F.struct("k", "watermark"))).alias("wm"))
    )


def copy_position(positions: Column, group: Column) -> tuple[Column, Column, Column]:
    """Where a group's copy of the message row sits: (topic, queue_id as text, offset).
    The group's own retry-topic copy the resend worker recorded in `positions`, else the
    stub's position."""
    from pyspark.sql import functions as F

    pos = F.try_element_at(positions, group)
    topic = F.coalesce(F.try_element_at(pos, F.lit(1)), F.col("topic"))
    queue = F.coalesce(F.try_element_at(pos, F.lit(2)), F.col("queue_id").cast("string"))
    offset = F.coalesce(F.try_element_at(pos, F.lit(3)).cast("bigint"), F.col("queue_offset"))
    return topic, queue, offset
