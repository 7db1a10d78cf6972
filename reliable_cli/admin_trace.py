"""`reliable admin message trace`: the broker's trace of one business message, and with
`--db` what the outbox and the consumers wrote about it, merged into one timeline.

The broker part is the admin service's `TraceMessage` (`broker.admin.trace`). The database
part lives here, in the composition root, because only here do broker and outbox meet:

    outbox stub        created (the business transaction committed), status, sends,
                       last error, last update
    consumption log    per group: processing started; dead-lettered (the group gave up)
    confirmation       per group: confirmed (outcome SUCCESS or DISCARDED)

Stubs are found by the message ids the broker knows and by the traced value itself (as a
message id, or as one of a stub's keys: a message the broker never received is found too).
Outbox timestamps are naive UTC, as the outbox writes them.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from reliable import admin_messages as api
from reliable.admin_messages import TraceEvent
from reliable_cli.admin_call import PROG, CommandFailed, print_json, table
from reliable_cli.exit_codes import ExitCode

if TYPE_CHECKING:
    from sqlalchemy import Connection, RowMapping, Table

    from outbox.models import OutboxTables


def run_trace(args: argparse.Namespace, admin: api.AdminCaller) -> int:
    if not 1 <= args.limit <= api.MAX_LIMIT:
        raise CommandFailed(f"--limit must be 1..{api.MAX_LIMIT}", ExitCode.USAGE)
    if args.scan is not None and args.scan < 0:
        raise CommandFailed("--scan must be >= 0", ExitCode.USAGE)
    doc = api.trace_message(
        admin, args.key_or_id, topic=args.topic, limit=args.limit, scan=args.scan
    )
    if args.db:
        outbox = outbox_trace(
            args.db, args.table_prefix, args.schema, args.key_or_id, doc["message_ids"]
        )
        doc["outbox"] = outbox
        doc["events"] = timeline(doc["events"], outbox.pop("events"))
        known = bool(
            doc["records"]
            or outbox["stubs"]
            or outbox["confirmations"]
            or outbox["consumption_log"]
        )
    else:
        known = bool(doc["records"])
    if args.json:
        print_json(doc)
    else:
        for line in render_trace(doc):
            print(line)
    if not known:
        if not args.json:
            print(f"{PROG}: nothing known about {args.key_or_id!r}", file=sys.stderr)
        return ExitCode.FAILURE
    return ExitCode.OK


# the broker's events that end a group's handling of a delivery: the group's consumer
# wrote its rows (processing, confirmed) before the broker heard of it
_GROUP_DONE = frozenset(
    {"acknowledged", "handed-back", "retry-scheduled", "dead-lettered", "dead-letter"}
)
_CONSUMER_STEP = {"processing": 0, "confirmed": 1}  # in a delivery's handling, in order


def _ms_of(event: TraceEvent) -> int:
    return int(event["time_ms"] or 0)


def _before_done(seq: list[TraceEvent], event: TraceEvent) -> int:
    """Where a consumer's row goes among one millisecond's events: before the broker's
    first event ending its group's handling (a confirmation, before the acknowledgement
    when there is one: an earlier attempt may have been handed back); else at the end."""
    ends = [
        i
        for i, x in enumerate(seq)
        if x["source"] == "broker" and x["group"] == event["group"] and x["kind"] in _GROUP_DONE
    ]
    if event["kind"] == "confirmed":
        acked = [i for i in ends if seq[i]["kind"] == "acknowledged"]
        ends = acked or ends
    return ends[0] if ends else len(seq)


def timeline(broker_events: list[TraceEvent], other_events: list[TraceEvent]) -> list[TraceEvent]:
    """The broker's trace events and the outbox's and consumers' (`outbox_trace`) as one
    timeline: in time order, and within one millisecond in causal order. The one ordering
    `reliable admin message trace` and the console's trace page both show.

    Within a millisecond: the outbox stub is written (the business transaction) before the
    broker stores the message; the broker's own events keep their order (the commitlog
    order of the records that say so); a group's consumer writes its rows (processing, then
    confirmed) after the broker delivered to it and before the broker records that group's
    acknowledgement, hand-back or dead letter; recording a dead letter ("gave-up", written
    by the handler reading the DLQ) comes after the broker's events; the stub's last update
    (confirmed by every group) and its escalation come last.
    """
    broker = sorted(broker_events, key=lambda e: (_ms_of(e), e.get("log_offset", 0)))
    others = sorted(other_events, key=lambda e: (_ms_of(e), _CONSUMER_STEP.get(e["kind"], 2)))
    out: list[TraceEvent] = []
    b = o = 0
    while b < len(broker) or o < len(others):
        ms = min(_ms_of(x[n]) for x, n in ((broker, b), (others, o)) if n < len(x))
        seq: list[TraceEvent] = []
        while b < len(broker) and _ms_of(broker[b]) == ms:
            seq.append(broker[b])
            b += 1
        first: list[TraceEvent] = []
        after: list[TraceEvent] = []
        last: list[TraceEvent] = []
        while o < len(others) and _ms_of(others[o]) == ms:
            e = others[o]
            o += 1
            if e["kind"] == "stub-created":
                first.append(e)
            elif e["kind"] in _CONSUMER_STEP:
                seq.insert(_before_done(seq, e), e)
            elif e["source"] == "outbox":
                last.append(e)
            else:
                after.append(e)
        out += first + seq + after + last
    return out


def _ms(value: datetime | None) -> int | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp() * 1000)


def _iso(value: datetime | None) -> str | None:
    ms = _ms(value)
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _event(
    at: datetime,
    source: str,
    kind: str,
    detail: str,
    *,
    group: str | None = None,
    message_id: str | None = None,
) -> TraceEvent:
    return {
        "time_ms": _ms(at),
        "time": _iso(at),
        "source": source,
        "kind": kind,
        "group": group,
        "detail": detail,
        "message_id": message_id,
    }


def outbox_trace(
    db_url: str, prefix: str, schema: str | None, key: str, message_ids: list[str]
) -> dict[str, Any]:
    """Stubs, consumption-log and confirmation rows of the message, and their events."""
    import sqlalchemy as sa

    from outbox.database import create_engine, require_existing_sqlite
    from outbox.errors import OutboxError
    from outbox.models import OutboxTables
    from outbox.schema import require_tables

    tables = OutboxTables(prefix=prefix, schema=schema)
    try:
        require_existing_sqlite(db_url)  # a wrong path is refused, not created empty
        engine = create_engine(db_url)
    except (sa.exc.SQLAlchemyError, ImportError, ValueError) as exc:
        raise CommandFailed(f"--db: {str(exc).splitlines()[0]}", ExitCode.USAGE) from None
    try:
        require_tables(engine, tables)
        with engine.connect() as conn:
            return _read(conn, tables, key, message_ids)
    except OutboxError as exc:
        raise CommandFailed(str(exc), ExitCode.FAILURE) from None
    except sa.exc.SQLAlchemyError as exc:
        raise CommandFailed(
            f"database unavailable: {str(exc).splitlines()[0]}", ExitCode.UNAVAILABLE
        ) from None
    finally:
        engine.dispose()


def _read(
    conn: Connection, tables: OutboxTables, key: str, message_ids: list[str]
) -> dict[str, Any]:
    """The outbox's rows about the message (its stubs, consumption-log and confirmation
    rows), each as a document, and the events they record."""
    ids = set(message_ids) | {key}
    stubs = _matching_stubs(conn, tables.stub, key, ids)
    ids |= {r["message_id"] for r in stubs}
    logs = _rows_about(conn, tables.consumption_log, ids)
    confs = _rows_about(conn, tables.confirmation, ids)
    return {
        "stubs": [_stub_doc(r) for r in stubs],
        "consumption_log": [_log_doc(r) for r in logs],
        "confirmations": [_confirmation_doc(r) for r in confs],
        "events": [*_stub_events(stubs), *_log_events(logs), *_confirmation_events(confs)],
    }


def _matching_stubs(conn: Connection, stub: Table, key: str, ids: set[str]) -> list[RowMapping]:
    """The stubs with one of the message ids, or with `key` among their keys."""
    import sqlalchemy as sa

    like = key.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    rows = (
        conn.execute(
            sa.select(stub).where(
                sa.or_(
                    stub.c.message_id.in_(sorted(ids)),
                    stub.c["keys"].like(f"%{like}%", escape="\\"),
                )
            )
        )
        .mappings()
        .all()
    )
    return [r for r in rows if r["message_id"] in ids or key in (r["keys"] or "").split()]


def _rows_about(conn: Connection, table: Table, ids: set[str]) -> list[RowMapping]:
    import sqlalchemy as sa

    return list(
        conn.execute(sa.select(table).where(table.c.message_id.in_(sorted(ids)))).mappings().all()
    )


def _stub_events(stubs: list[RowMapping]) -> list[TraceEvent]:
    events: list[TraceEvent] = []
    for r in stubs:
        mid = r["message_id"]
        events.append(
            _event(
                r["created_at"],
                "outbox",
                "stub-created",
                f"outbox stub written for {r['topic']} (the business transaction committed)",
                message_id=mid,
            )
        )
        error = f", last error: {r['last_error']}" if r["last_error"] else ""
        events.append(
            _event(
                r["updated_at"],
                "outbox",
                "stub-updated",
                f"outbox stub {r['status']}, sent {r['send_count']} time(s){error}",
                message_id=mid,
            )
        )
        if r["escalated_at"] is not None:
            events.append(
                _event(
                    r["escalated_at"],
                    "outbox",
                    "stub-escalated",
                    "outbox escalated it (sends exhausted)",
                    message_id=mid,
                )
            )
    return events


def _log_events(logs: list[RowMapping]) -> list[TraceEvent]:
    events: list[TraceEvent] = []
    for r in logs:
        events.append(
            _event(
                r["created_at"],
                "consumer",
                "processing",
                f"{r['consumer_group']} started processing it (consumption log, "
                f"{r['topic']} queue {r['queue_id']} offset {r['queue_offset']})",
                group=r["consumer_group"],
                message_id=r["message_id"],
            )
        )
        if r["dead_lettered_at"] is not None:
            events.append(
                _event(
                    r["dead_lettered_at"],
                    "consumer",
                    "gave-up",
                    f"{r['consumer_group']} recorded giving up on it (dead-lettered)",
                    group=r["consumer_group"],
                    message_id=r["message_id"],
                )
            )
    return events


def _confirmation_events(confs: list[RowMapping]) -> list[TraceEvent]:
    events: list[TraceEvent] = []
    for r in confs:
        events.append(
            _event(
                r["confirmed_at"],
                "consumer",
                "confirmed",
                f"{r['consumer_group']} confirmed it ({r['outcome'] or 'SUCCESS'})",
                group=r["consumer_group"],
                message_id=r["message_id"],
            )
        )
    return events


def _stub_doc(r: RowMapping) -> dict[str, object]:
    """A stub row as the trace document shows it."""
    return {
        "message_id": r["message_id"],
        "topic": r["topic"],
        "tags": r["tags"],
        "keys": (r["keys"] or "").split(),
        "status": r["status"],
        "send_count": r["send_count"],
        "max_sends": r["max_sends"],
        "last_error": r["last_error"],
        "queue_id": r["queue_id"],
        "queue_offset": r["queue_offset"],
        "broker_msg_id": r["broker_msg_id"],
        "expected_groups": [g for g in (r["expected_groups"] or "").split(",") if g],
        "created_at": _iso(r["created_at"]),
        "updated_at": _iso(r["updated_at"]),
        "next_resend_at": _iso(r["next_resend_at"]),
        "escalated_at": _iso(r["escalated_at"]),
    }


def _log_doc(r: RowMapping) -> dict[str, object]:
    """A consumption-log row as the trace document shows it."""
    return {
        "message_id": r["message_id"],
        "group": r["consumer_group"],
        "topic": r["topic"],
        "queue_id": r["queue_id"],
        "queue_offset": r["queue_offset"],
        "created_at": _iso(r["created_at"]),
        "dead_lettered_at": _iso(r["dead_lettered_at"]),
    }


def _confirmation_doc(r: RowMapping) -> dict[str, object]:
    """A confirmation row as the trace document shows it."""
    return {
        "message_id": r["message_id"],
        "group": r["consumer_group"],
        "topic": r["topic"],
        "outcome": r["outcome"],
        "confirmed_at": _iso(r["confirmed_at"]),
    }


def render_trace(doc: dict[str, Any]) -> list[str]:
    records = doc["records"]
    ids = ", ".join(doc["message_ids"]) or "-"
    lines = [f"trace of {doc['key']}: {len(records)} broker record(s), message id(s) {ids}"]
    if doc.get("more"):
        lines.append("(more records match: only the newest are shown; raise --limit)")
    if not doc["events"]:
        return lines
    lines.append("")
    lines += table(
        [(e["time"], e["source"], e["detail"]) for e in doc["events"]], ("TIME", "SOURCE", "WHAT")
    )
    if doc["groups"]:
        lines.append("")
        lines += table(
            [
                (
                    g["group"],
                    g["state"],
                    g["deliveries"],
                    g["retries"],
                    ", ".join(g["dead_lettered_at"]) or "no",
                    g["reconsumed"],
                    g.get("replayed", 0),
                )
                for g in doc["groups"]
            ],
            (
                "GROUP",
                "STATE",
                "DELIVERIES",
                "RETRIES",
                "DEAD-LETTERED",
                "RECONSUMED",
                "REPLAYED",
            ),
        )
    for s in doc.get("outbox", {}).get("stubs", []):
        lines.append("")
        lines.append(
            f"outbox stub {s['message_id']}: {s['status']}, sent {s['send_count']} "
            f"of {s['max_sends']} time(s), expects "
            f"{', '.join(s['expected_groups']) or '-'}; last error: "
            f"{s['last_error'] or '-'}"
        )
    if not doc["pop_log"]["complete"]:
        lines.append(
            f"(the invisible-time log was read for {doc['pop_log']['scanned']} "
            "entries only: later deliveries may be missing; raise --scan)"
        )
    return lines
