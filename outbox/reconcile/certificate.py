"""Figures from a classified run: counts, per-queue lag, the zero-loss certificate.

All figures come from ONE aggregation over the classified rows ("facts"), whose result is
small (topics x queues x groups x classes); only that result reaches the driver.

Id-set digests are order-independent, so two runs over the same ids agree whatever the
partitioning: for a set S of message ids, with h = xxhash64(id) as an unsigned 64-bit value,
    digest(S) = sha256(f"{|S|}:{sum(h) mod 2^64}:{xor(h)}")[:32]   (hex)
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from outbox.reconcile.classes import UNACCOUNTED, LogClass, StubClass
from outbox.reconcile.classify import Classified, Window, log_class

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row

_MASK = (1 << 64) - 1


@dataclass
class IdDigest:
    """A mergeable, order-independent digest of a set of message ids."""

    count: int = 0
    hash_sum: int = 0
    hash_xor: int = 0

    def add(self, count: int, hash_sum: int, hash_xor: int) -> None:
        self.count += count
        self.hash_sum = (self.hash_sum + hash_sum) & _MASK
        self.hash_xor ^= hash_xor & _MASK

    @property
    def hex(self) -> str:
        text = f"{self.count}:{self.hash_sum}:{self.hash_xor}"
        return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass
class Oldest:
    """The oldest message of a class: id, position, age reference."""

    message_id: str
    topic: str | None
    queue_id: int | None
    queue_offset: int | None
    created_at: datetime | None


@dataclass
class Unaccounted:
    """One unaccounted message of the window: its id, the groups missing it, and why."""

    message_id: str
    topic: str | None
    missing_groups: str
    reason: str
    created_at: datetime | None


# how many unaccounted messages the certificate names (the detail rows hold them all)
NAMED_UNACCOUNTED = 20


@dataclass
class QueueFigures:
    """Counts per class for one topic/queue, and how far each group lags behind."""

    topic: str
    queue_id: int | None
    stubs: dict[str, int] = field(default_factory=dict)
    head: int | None = None  # highest stub offset + 1
    lag: dict[str, dict[str, Any]] = field(default_factory=dict)  # group -> figures


@dataclass
class Certificate:
    """The zero-loss certificate of one time window."""

    since: datetime | None
    until: datetime | None
    produced: int
    confirmed: int
    confirmed_per_group: dict[str, int]
    duplicated: int  # confirmation rows beyond the first per (message, group)
    in_flight: int
    backlogged: int
    dead_lettered: int
    manual: int
    void: int
    unaccounted: int
    orphan_log_rows: int
    stale_log_rows: int
    digests: dict[str, str]
    oldest_unaccounted: Oldest | None = None
    # the oldest unaccounted messages, by name (at most NAMED_UNACCOUNTED)
    unaccounted_messages: list[Unaccounted] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """Nothing unaccounted and no escalation open: a message the resend worker handed
        to an operator (`manual`) was not consumed either, until the operator requeues it
        (and it is confirmed) or voids it."""
        return self.unaccounted == 0 and self.manual == 0

    @property
    def verdict(self) -> str:
        """`CLEAN`, or `NOT CLEAN (...)` naming what keeps the window open."""
        if self.clean:
            return "CLEAN"
        reasons = []
        if self.unaccounted:
            reasons.append(f"{self.unaccounted:,} unaccounted")
        if self.manual:
            reasons.append(f"{self.manual:,} awaiting manual handling")
        return f"NOT CLEAN ({', '.join(reasons)})"


@dataclass
class Summary:
    """Whole-run figures (every row read), plus the certificate of the window."""

    stubs: dict[str, int]
    log_rows: dict[str, int]
    queues: list[QueueFigures]
    oldest_unaccounted: Oldest | None
    certificate: Certificate

    @property
    def total_stubs(self) -> int:
        return sum(self.stubs.values())


def facts(c: Classified) -> DataFrame:
    """One small aggregate of every classified row (stubs, log rows, confirmations)."""
    from pyspark.sql import functions as F

    m = c.messages
    # one fact per stub (position 0), per confirmed group (1..nc) and per log row
    # (nc+1..nc+nl), addressed by position: plain expressions, no per-row lambdas
    nc, nl = F.size("confirmed_groups"), F.size("logs")
    e = m.select("*", F.explode(F.sequence(F.lit(0), nc + nl)).alias("i"))
    e = e.where((F.col("i") > 0) | F.col("has_stub"))
    i = F.col("i")
    is_stub, is_conf = i == 0, (i > 0) & (i <= nc)
    is_log = i > nc
    lg = F.try_element_at("logs", F.when(is_log, i - nc))
    facts_row = e.select(
        "message_id",
        F.when(is_stub, "stub").when(is_conf, "conf").otherwise("log").alias("section"),
        F.when(is_log, lg["topic"]).otherwise(F.col("topic")).alias("topic"),
        F.when(is_log, lg["queue_id"]).otherwise(F.col("queue_id")).alias("queue_id"),
        F.when(is_conf, F.try_element_at("confirmed_groups", F.when(is_conf, i)))
        .when(is_log, lg["consumer_group"])
        .alias("grp"),
        F.when(is_stub, F.col("stub_class")).when(is_log, log_class(lg)).alias("cls"),
        F.when(is_log & ~F.col("has_stub"), lg["in_window"])
        .otherwise(F.col("in_window"))
        .alias("in_window"),
        F.when(is_log, lg["created_at"]).otherwise(F.col("created_at")).alias("created_at"),
        F.when(is_log, lg["queue_offset"]).otherwise(F.col("queue_offset")).alias("queue_offset"),
        F.when(is_stub, F.col("duplicate_confirmations")).otherwise(0).cast("bigint").alias("dups"),
    )
    h = F.xxhash64("message_id")
    return facts_row.groupBy("section", "topic", "queue_id", "grp", "cls", "in_window").agg(
        F.count(F.lit(1)).alias("n"),
        F.min_by("message_id", F.struct("created_at", "message_id")).alias("oldest_id"),
        F.min("created_at").alias("oldest_at"),
        F.min_by("queue_offset", F.struct("created_at", "message_id")).alias("oldest_offset"),
        # sum(h) as two long sums (high and low 32 bits) keeps the aggregation
        # hash-based (a decimal(38) sum would force a sort); exact up to 2^31 rows
        F.sum(F.shiftright(h, 32)).alias("hash_hi"),
        F.sum(h.bitwiseAND(F.lit(0xFFFFFFFF))).alias("hash_lo"),
        F.bit_xor(h).alias("hash_xor"),
        F.max("queue_offset").alias("max_offset"),
        F.sum("dups").alias("dups"),
    )


def unaccounted_messages(c: Classified, limit: int = NAMED_UNACCOUNTED) -> list[Unaccounted]:
    """The oldest unaccounted stubs of the window (one small bounded action)."""
    from pyspark.sql import functions as F

    rows = (
        c.messages.where(
            F.col("in_window") & F.col("stub_class").isin([k.value for k in UNACCOUNTED])
        )
        .select(
            "message_id",
            "topic",
            F.array_join("missing_groups", ",").alias("groups"),
            "reason",
            "created_at",
        )
        .orderBy("created_at", "message_id")
        .limit(limit)
        .collect()
    )
    return [
        Unaccounted(
            r["message_id"], r["topic"], r["groups"] or "", r["reason"] or "", r["created_at"]
        )
        for r in rows
    ]


def summarize(fact_rows: list[Row], watermark_rows: list[Row], window: Window) -> Summary:
    """Fold the collected facts and watermarks into the report's figures."""
    stubs: dict[str, int] = {c.value: 0 for c in StubClass}
    logs: dict[str, int] = {c.value: 0 for c in LogClass}
    queues: dict[tuple[str, int | None], QueueFigures] = {}
    per_group: dict[str, int] = defaultdict(int)
    win: dict[str, int] = defaultdict(int)
    duplicated = 0
    win_logs: dict[str, int] = defaultdict(int)
    digests: dict[str, IdDigest] = defaultdict(IdDigest)
    oldest_all: tuple[Any, ...] | None = None
    oldest_win: tuple[Any, ...] | None = None

    def older(cur: tuple[Any, ...] | None, row: Row) -> tuple[Any, ...]:
        cand = (
            row["oldest_at"],
            row["oldest_id"],
            row["topic"],
            row["queue_id"],
            row["oldest_offset"],
        )
        if cur is None or (cand[0], cand[1]) < (cur[0], cur[1]):
            return cand
        return cur

    for row in fact_rows:
        section, cls, n = row["section"], row["cls"], int(row["n"])
        hash_sum = (int(row["hash_hi"] or 0) << 32) + int(row["hash_lo"] or 0)
        hash_xor = int(row["hash_xor"] or 0)
        if section == "stub":
            stubs[cls] += n
            key = (row["topic"], row["queue_id"])
            q = queues.setdefault(key, QueueFigures(topic=key[0], queue_id=key[1]))
            q.stubs[cls] = q.stubs.get(cls, 0) + n
            if row["max_offset"] is not None:
                head = int(row["max_offset"]) + 1
                q.head = head if q.head is None else max(q.head, head)
            if StubClass(cls) in UNACCOUNTED:
                oldest_all = older(oldest_all, row)
            if row["in_window"]:
                win[cls] += n
                duplicated += int(row["dups"] or 0)
                digests["produced"].add(n, hash_sum, hash_xor)
                if cls == StubClass.CONFIRMED.value:
                    digests["consumed"].add(n, hash_sum, hash_xor)
                if StubClass(cls) in UNACCOUNTED:
                    digests["unaccounted"].add(n, hash_sum, hash_xor)
                    oldest_win = older(oldest_win, row)
        elif section == "log":
            logs[cls] += n
            if row["in_window"]:
                win_logs[cls] += n
        elif section == "conf" and row["in_window"]:
            per_group[row["grp"]] += n
            digests[f"confirmed:{row['grp']}"].add(n, hash_sum, hash_xor)
    for w in watermark_rows:
        key = (w["topic"], w["queue_id"])
        q = queues.setdefault(key, QueueFigures(topic=key[0], queue_id=key[1]))
        mark = None if w["watermark"] is None else int(w["watermark"])
        lag = None if mark is None or q.head is None else max(0, q.head - mark)
        q.lag[w["consumer_group"]] = {
            "watermark": mark,
            "source": w["watermark_source"],
            "lag": lag,
        }
    for digest_name in ("produced", "consumed", "unaccounted"):
        digests.setdefault(digest_name, IdDigest())
    cert = Certificate(
        since=window.since,
        until=window.until,
        produced=sum(win.values()),
        confirmed=win[StubClass.CONFIRMED.value],
        confirmed_per_group=dict(sorted(per_group.items())),
        duplicated=duplicated,
        in_flight=win[StubClass.IN_PROCESSING.value],
        backlogged=win[StubClass.BACKLOGGED.value],
        dead_lettered=win[StubClass.DEAD_LETTERED.value],
        manual=win[StubClass.EXHAUSTED.value],
        void=win[StubClass.VOID.value],
        unaccounted=sum(win[c.value] for c in UNACCOUNTED),
        orphan_log_rows=win_logs[LogClass.ORPHAN.value],
        stale_log_rows=win_logs[LogClass.STALE.value],
        digests={k: v.hex for k, v in sorted(digests.items())},
        oldest_unaccounted=_oldest(oldest_win),
    )
    ordered = sorted(queues.values(), key=lambda q: (q.topic or "", q.queue_id or -1))
    return Summary(
        stubs=stubs,
        log_rows=logs,
        queues=ordered,
        oldest_unaccounted=_oldest(oldest_all),
        certificate=cert,
    )


def _oldest(t: tuple[Any, ...] | None) -> Oldest | None:
    if t is None:
        return None
    return Oldest(message_id=t[1], topic=t[2], queue_id=t[3], queue_offset=t[4], created_at=t[0])
