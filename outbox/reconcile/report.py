"""What a run found, rendered: the summary for people and the JSON document for machines.

The detail rows (one per stub and per log row) are written by `outbox.reconcile.details`.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from outbox.reconcile.classes import LOG_LABELS, STUB_LABELS, StubClass
from protocol.names import is_dlq_topic, is_retry_topic, is_system_topic

if TYPE_CHECKING:
    from outbox.reconcile.job import ReconcileResult


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def as_json(result: ReconcileResult, *, exit_code: int | None = None) -> str:
    """The machine-readable summary (stable keys; see docs/reconcile.md). A command line
    passes the exit code it ends with, which the document then reports last as
    `exit_code`; this layer does not know exit codes."""
    s = result.summary
    doc = {
        "run_id": result.run_id,
        "source": result.source,
        "master": result.master,
        "generated_at": _plain(result.now),
        "elapsed_s": round(result.elapsed_s, 3),
        "tasks": result.tasks,
        "shuffle_partitions": result.shuffle_partitions,
        "stubs": {"total": s.total_stubs, **{k.lower(): v for k, v in s.stubs.items()}},
        "log_rows": {
            "total": sum(s.log_rows.values()),
            **{k.lower(): v for k, v in s.log_rows.items()},
        },
        "queues": [_plain(q) for q in s.queues],
        "oldest_unaccounted": _plain(s.oldest_unaccounted),
        "certificate": {**_plain(s.certificate), "clean": s.certificate.clean},
        "repair": _plain(result.repair),
        "partitions": {
            k: {"column": v[0], "partitions": v[1], "rows": v[2]} for k, v in result.plans.items()
        },
    }
    if exit_code is not None:
        doc["exit_code"] = int(exit_code)
    return json.dumps(doc, indent=2, sort_keys=False)


def as_text(result: ReconcileResult) -> str:
    """The summary for people."""
    s = result.summary
    cert = s.certificate
    out: list[str] = []
    out.append(
        f"reconciliation {result.run_id}  source {result.source}  "
        f"at {result.now:%Y-%m-%d %H:%M:%S} UTC  ({result.elapsed_s:.1f} s, "
        f"{result.tasks:,} tasks)"
    )
    out.append("")
    out.append(f"stubs {s.total_stubs:>14,}")
    for cls, label in STUB_LABELS.items():
        out.append(f"  {label:<22}{s.stubs.get(cls.value, 0):>12,}")
    out.append(f"log rows {sum(s.log_rows.values()):>11,}")
    for lcls, label in LOG_LABELS.items():
        out.append(f"  {label:<28}{s.log_rows.get(lcls.value, 0):>6,}")
    if s.queues:
        out.append("")
        cols = [
            StubClass.CONFIRMED,
            StubClass.IN_PROCESSING,
            StubClass.BACKLOGGED,
            StubClass.LOST,
            StubClass.EXHAUSTED,
            StubClass.DEAD_LETTERED,
            StubClass.VOID,
        ]
        heads = ["confirmed", "in-proc", "backlog", "lost", "manual", "dlq", "void"]
        out.append(
            f"{'topic':<24}{'queue':>6}" + "".join(f"{h:>11}" for h in heads) + f"{'head':>10}"
        )
        # the application's topics first, then the broker's, kind by kind (a stable sort)
        queues = sorted(s.queues, key=lambda q: _KINDS.index(_internal(q.topic) or ""))
        kinds: set[str] = set()
        for q in queues:
            kind = _internal(q.topic)
            if kind is not None and kind not in kinds:
                kinds.add(kind)
                out.append(f"  ({kind} topic: the broker's, not the application's)")
            qid = "-" if q.queue_id is None else str(q.queue_id)
            out.append(
                f"{(q.topic or '-')[:24]:<24}{qid:>6}"
                + "".join(f"{q.stubs.get(c.value, 0):>11,}" for c in cols)
                + f"{'-' if q.head is None else q.head:>10}"
            )
        lag_lines = [(q, g, f) for q in queues for g, f in sorted(q.lag.items())]
        if lag_lines:
            out.append("")
            out.append(
                f"{'lag: topic':<24}{'queue':>6}  {'group':<24}{'watermark':>12}{'lag':>10}  source"
            )
            for q, g, f in lag_lines:
                qid = "-" if q.queue_id is None else str(q.queue_id)
                out.append(
                    f"{(q.topic or '-')[:24]:<24}{qid:>6}  {g[:24]:<24}"
                    f"{_dash(f['watermark']):>12}{_dash(f['lag']):>10}  {f['source']}"
                )
    if s.oldest_unaccounted is not None:
        o = s.oldest_unaccounted
        out.append("")
        out.append(
            f"oldest unaccounted: {o.message_id}  {o.topic} queue {o.queue_id} "
            f"offset {_dash(o.queue_offset)}  created {o.created_at}"
        )
    out.append("")
    since = cert.since.isoformat(sep=" ") if cert.since else "-inf"
    until = cert.until.isoformat(sep=" ") if cert.until else "+inf"
    out.append(f"zero-loss certificate [{since}, {until}): " + cert.verdict)
    out.append(
        f"  produced {cert.produced:,}  confirmed {cert.confirmed:,}  "
        f"in flight {cert.in_flight:,}  backlogged {cert.backlogged:,}  "
        f"dead-lettered {cert.dead_lettered:,}  manual {cert.manual:,}  "
        f"void {cert.void:,}  unaccounted {cert.unaccounted:,}  "
        f"duplicated {cert.duplicated:,}"
    )
    if cert.confirmed_per_group:
        out.append(
            "  confirmed per group: "
            + ", ".join(f"{g} {n:,}" for g, n in cert.confirmed_per_group.items())
        )
    out.append(f"  log rows: orphan {cert.orphan_log_rows:,}  stale {cert.stale_log_rows:,}")
    if cert.unaccounted_messages:
        shown = len(cert.unaccounted_messages)
        out.append(
            f"  unaccounted ({'all' if shown == cert.unaccounted else 'oldest'} "
            f"{shown:,} of {cert.unaccounted:,}):"
        )
        for u in cert.unaccounted_messages:
            out.append(
                f"    {u.message_id}  {u.topic or '-'}  missing {u.missing_groups or '-'}"
                f"  created {u.created_at}  {u.reason}"
            )
    out.append(
        "  digests: " + "  ".join(f"{k}={v}" for k, v in cert.digests.items() if ":" not in k)
    )
    if result.repair is not None:
        r = result.repair
        out.append("")
        verb = "would change" if r.dry_run else "changed"
        out.append(
            f"repair{' (dry run)' if r.dry_run else ''}: {verb} "
            f"{r.marked_due:,} stubs to resend now, "
            f"{r.closed_stale:,} stale log rows closed; {r.already_due:,} already "
            f"due; {r.skipped:,} skipped (moved on since the read); "
            f"{r.batches} batches"
        )
    return "\n".join(out)


_KINDS = ("", "retry", "dead-letter", "system")


def _internal(topic: str | None) -> str | None:
    """What kind of broker topic `topic` is (retry, dead-letter, system), None for the
    application's own: a stub resent to one group alone sits in `%RETRY%<group>`."""
    if not topic:
        return None
    if is_retry_topic(topic):
        return "retry"
    if is_dlq_topic(topic):
        return "dead-letter"
    return "system" if is_system_topic(topic) else None


def _dash(value: object) -> str:
    return "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


__all__ = ["as_json", "as_text"]
