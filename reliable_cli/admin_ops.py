"""`reliable admin dlq list|replay|audit`, `admin group show|reset-offset|delete` and
`admin topic delete`: dead letters, a group's progress and offsets, deletions.

Every command runs against a running broker (`--endpoint HOST:PORT`) or a stopped store
(`--store DIR`) with the same output: aligned tables, or one JSON document with `--json`.

Exit codes: 0 done; 1 refused (a group with live consumers, no such group or topic);
2 bad command line; 4 the broker is unreachable.

Examples:
    reliable admin dlq list --group billing --since 2h --endpoint 127.0.0.1:8081
    reliable admin dlq replay --group billing --since 2h --rate 50 --endpoint 127.0.0.1:8081
    reliable admin dlq replay --group billing --id 0A0B... --to-topic --dry-run --store ./store
    reliable admin dlq audit --group billing --endpoint 127.0.0.1:8081
    reliable admin group show billing --endpoint 127.0.0.1:8081
    reliable admin group reset-offset billing --topic orders --to-time 2026-11-23T10:00Z \\
        --execute --endpoint 127.0.0.1:8081
    reliable admin group delete billing --yes --store ./store
    reliable admin topic delete old-orders --yes --endpoint 127.0.0.1:8081
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from reliable import admin_messages as api
from reliable.naming import retry_topic
from reliable_cli.admin_call import PROG, CommandFailed, print_json, table
from reliable_cli.admin_call import handler as _handler
from reliable_cli.admin_message import _login, parse_time
from reliable_cli.exit_codes import ExitCode

if TYPE_CHECKING:
    from reliable_cli import Subparsers

PAGE = 1000  # dead letters per listing call while collecting a replay
Target = Callable[[argparse.ArgumentParser], None]


# ---------------------------------------------------------------------- command line
def register(
    nouns: Subparsers, topic_verbs: Subparsers, group_verbs: Subparsers, target: Target
) -> argparse.ArgumentParser:
    """Add the `dlq` noun, `group show|reset-offset|delete` and `topic delete`; returns
    the `dlq` parser."""
    dlq: argparse.ArgumentParser = nouns.add_parser(
        "dlq",
        help="list, replay and audit a group's dead letters",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = dlq.add_subparsers(dest="verb", metavar="<list|replay|audit>")
    _register_dlq_list(verbs, target)
    _register_dlq_replay(verbs, target)
    _register_dlq_audit(verbs, target)
    _register_group_verbs(group_verbs, target)
    _register_topic_delete(topic_verbs, target)
    return dlq


def _register_dlq_list(verbs: Subparsers, target: Target) -> None:
    ls = verbs.add_parser(
        "list",
        help="a group's dead letters, oldest first",
        description="The messages in %%DLQ%%<group>, oldest first, with "
        "their original topic and whether (when, by whom) "
        "they were replayed.",
    )
    ls.add_argument("--group", required=True)
    ls.add_argument(
        "--since",
        metavar="TIME",
        help="stored at or after TIME: ISO-8601, epoch milliseconds, or 30m/2h/1d ago",
    )
    ls.add_argument("--until", metavar="TIME", help="stored at or before TIME")
    ls.add_argument("--limit", type=int, default=32, help="at most this many (default 32)")
    ls.add_argument("--pending", action="store_true", help="only those not replayed yet")
    target(ls)
    ls.set_defaults(handler=_handler(_dlq_list))


def _register_dlq_replay(verbs: Subparsers, target: Target) -> None:
    rp = verbs.add_parser(
        "replay",
        help="deliver dead letters again (to the group, or the original topic)",
        description="Replay dead letters of GROUP: by default each to %%RETRY%%<group>, so "
        "only GROUP receives it again; with --to-topic to its original topic "
        "(every subscribed group receives it). The copy keeps the client "
        "message id and starts the retry ladder again. A dead letter is "
        "replayed at most once, whoever runs the command again; every replay "
        "is recorded (who, when, which) in the store's replay audit (`dlq "
        "audit`). Progress goes to stderr.",
    )
    rp.add_argument("--group", required=True)
    rp.add_argument(
        "--id",
        action="append",
        default=[],
        dest="ids",
        metavar="ID",
        help="a dead letter's client message id or offset message id (repeat; "
        "default: every dead letter in the time range)",
    )
    rp.add_argument("--since", metavar="TIME", help="stored at or after TIME")
    rp.add_argument("--until", metavar="TIME", help="stored at or before TIME")
    rp.add_argument(
        "--rate",
        type=float,
        default=None,
        metavar="N",
        help="at most N messages per second (default: no limit)",
    )
    rp.add_argument(
        "--to-topic",
        action="store_true",
        help="replay to each message's original topic instead of the group's retry topic",
    )
    rp.add_argument("--dry-run", action="store_true", help="show what would be replayed")
    rp.add_argument(
        "--operator", default=None, help="who does this, for the audit (default: the login name)"
    )
    rp.add_argument(
        "--db",
        metavar="URL",
        default=None,
        help="the outbox database: mark the group's consumption-log rows of the "
        "replayed messages as in processing again (not dead-lettered)",
    )
    rp.add_argument("--table-prefix", default="reliable_", help="outbox table name prefix")
    rp.add_argument("--schema", default=None, help="database schema of the outbox tables")
    target(rp)
    rp.set_defaults(handler=_handler(_dlq_replay))


def _register_dlq_audit(verbs: Subparsers, target: Target) -> None:
    au = verbs.add_parser(
        "audit",
        help="who replayed which dead letters, when",
        description="The replay audit of the store, newest first: one row "
        "per replay run (a run records one entry per batch; "
        "--json prints the entries with every message id).",
    )
    au.add_argument("--group", default=None)
    au.add_argument(
        "--limit", type=int, default=100, help="read the newest N entries (default 100)"
    )
    target(au)
    au.set_defaults(handler=_handler(_dlq_audit))


def _register_group_verbs(group_verbs: Subparsers, target: Target) -> None:
    """`group show`, `group reset-offset`, `group delete`."""
    gs = group_verbs.add_parser(
        "show",
        help="one group: settings, consumers, per-queue progress, retry and DLQ "
        "depth (mqadmin consumerProgress)",
    )
    gs.add_argument("name")
    gs.add_argument("--topic", default=None, help="only this topic's queues")
    target(gs)
    gs.set_defaults(handler=_handler(_group_show))

    rs = group_verbs.add_parser(
        "reset-offset",
        help="move a group's offsets on a topic (kafka-consumer-groups --reset-offsets)",
        description="Print the before/after offsets per queue and, with --execute, move "
        "them. Refused while the group has live consumers unless --force (a "
        "running consumer would write its own position back). The group's "
        "invisible-time state on the topic is reset too, so the next receive "
        "starts at the new offsets.",
    )
    rs.add_argument("name", metavar="GROUP")
    rs.add_argument("--topic", required=True)
    to = rs.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-time", metavar="TIME", help="the first message stored at or after TIME")
    to.add_argument(
        "--to-offset", type=int, metavar="N", help="offset N in every queue (clamped to the queue)"
    )
    to.add_argument("--earliest", action="store_true", help="the oldest message held")
    to.add_argument("--latest", action="store_true", help="the end: skip everything held")
    mode = rs.add_mutually_exclusive_group(required=True)
    mode.add_argument("--dry-run", action="store_true", help="only print the table")
    mode.add_argument("--execute", action="store_true", help="move the offsets")
    target(rs)
    rs.set_defaults(handler=_handler(_group_reset))

    gd = group_verbs.add_parser(
        "delete",
        help="delete a group: its config, offsets and invisible-time state",
        description="Delete GROUP's config, its offsets (on every topic, its retry topic "
        "included) and its invisible-time state. The messages of its retry and "
        "dead-letter topics stay. Refused while it has live consumers unless "
        "--force.",
    )
    gd.add_argument("name", metavar="GROUP")
    gd.add_argument("--yes", action="store_true", help="really delete it")
    target(gd)
    gd.set_defaults(handler=_handler(_group_delete))


def _register_topic_delete(topic_verbs: Subparsers, target: Target) -> None:
    td = topic_verbs.add_parser(
        "delete",
        help="delete a topic: its config, queues and every group's offsets",
        description="Delete TOPIC's config, its consume queues and every group's offsets "
        "on it. Its messages stay in the commitlog until the commitlog files "
        "expire (RocketMQ's deleteTopic). System topics are refused.",
    )
    td.add_argument("name", metavar="TOPIC")
    td.add_argument("--yes", action="store_true", help="really delete it")
    target(td)
    td.set_defaults(handler=_handler(_topic_delete))


def _times(args: argparse.Namespace) -> dict[str, int]:
    out: dict[str, int] = {}
    if args.since:
        out["since_ms"] = parse_time(args.since)
    if args.until:
        out["until_ms"] = parse_time(args.until)
    return out


# ---------------------------------------------------------------------- dlq
def _dlq_list(args: argparse.Namespace, admin: api.AdminCaller) -> int:
    if not 1 <= args.limit <= api.MAX_LIMIT:
        raise CommandFailed(f"--limit must be 1..{api.MAX_LIMIT}", ExitCode.USAGE)
    found = admin.call(
        "ListDeadLetters",
        group=args.group,
        limit=args.limit,
        pending_only=args.pending,
        **_times(args),
    )
    if args.json:
        print_json(found)
        return ExitCode.OK
    print(
        f"{found['dlq_topic']}: {found['depth']} held, {found['replayed']} replayed, "
        f"{found['pending']} not replayed"
    )
    if found["messages"]:
        for line in _dead_table(found["messages"]):
            print(line)
    if found["more"]:
        print(
            f"(more: only the first {len(found['messages'])} are shown; raise --limit or "
            "narrow --since/--until)"
        )
    return ExitCode.OK


def _dead_table(messages: list[dict[str, Any]]) -> list[str]:
    return table(
        [
            (
                m["dlq_offset"],
                m["store_time"],
                m["msg_id"],
                m["origin_topic"],
                m["tags"],
                " ".join(m["keys"]),
                m["reconsume_times"],
                (
                    f"{m['replayed']['at']} by {m['replayed']['operator']}"
                    if m["replayed"]
                    else None
                ),
            )
            for m in messages
        ],
        (
            "DLQ OFFSET",
            "STORED",
            "MSG ID",
            "ORIGIN TOPIC",
            "TAGS",
            "KEYS",
            "RECONSUMED",
            "REPLAYED",
        ),
    )


def collect(
    admin: api.AdminCaller, group: str, times: dict[str, int], ids: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(dead letters to replay, those already replayed) of `group` in the time range, or
    with `ids` only those whose client or offset message id is one of them."""
    wanted = set(ids)
    pending: list[dict[str, Any]] = []
    done: list[dict[str, Any]] = []
    after = -1
    while True:
        page = admin.call("ListDeadLetters", group=group, limit=PAGE, after=after, **times)
        for m in page["messages"]:
            if wanted and m["msg_id"] not in wanted and m["offset_msg_id"] not in wanted:
                continue
            (done if m["replayed"] else pending).append(m)
        if not page["more"]:
            return pending, done
        after = page["next_after"]


def _dlq_replay(args: argparse.Namespace, admin: api.AdminCaller) -> int:
    if args.rate is not None and args.rate <= 0:
        raise CommandFailed("--rate must be positive", ExitCode.USAGE)
    pending, done = collect(admin, args.group, _times(args), args.ids)
    known = {m["msg_id"] for m in pending + done} | {m["offset_msg_id"] for m in pending + done}
    unknown = [i for i in args.ids if i not in known]
    operator = args.operator or _login()
    run = uuid.uuid4().hex[:12]
    target = "original topics" if args.to_topic else retry_topic(args.group)
    if args.dry_run or not pending:
        doc = {
            "group": args.group,
            "dry_run": args.dry_run,
            "run": None,
            "to": target,
            "replayed": [],
            "would_replay": pending if args.dry_run else [],
            "already_replayed": done,
            "unknown_ids": unknown,
        }
        _replay_output(
            args, doc, pending if args.dry_run else [], done, unknown, dry_run=args.dry_run
        )
        return ExitCode.FAILURE if unknown and not (pending or done) else ExitCode.OK
    if args.db:
        with _ConsumptionLog(args, [m["msg_id"] for m in pending]) as logs:
            replayed, skipped = _paced_replay(args, admin, pending, operator, run)
            logs.reopen([r["msg_id"] for r in replayed], operator, run)
    else:
        replayed, skipped = _paced_replay(args, admin, pending, operator, run)
    doc = {
        "group": args.group,
        "dry_run": False,
        "run": run,
        "operator": operator,
        "to": target,
        "replayed": replayed,
        "skipped": skipped,
        "already_replayed": done,
        "unknown_ids": unknown,
    }
    _replay_output(args, doc, replayed, done, unknown, dry_run=False, skipped=skipped)
    return ExitCode.OK


def _paced_replay(
    args: argparse.Namespace,
    admin: api.AdminCaller,
    pending: list[dict[str, Any]],
    operator: str,
    run: str,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Replay in batches, at most `--rate` messages a second; progress on stderr."""
    from reliable.ratelimit import TokenBucket

    batch = 100 if args.rate is None else max(1, min(100, int(args.rate // 5) or 1))
    bucket = None if args.rate is None else TokenBucket(args.rate, burst=float(batch))
    replayed: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    started = time.monotonic()
    last_report = 0.0
    for i in range(0, len(pending), batch):
        chunk = pending[i : i + batch]
        if bucket is not None:
            bucket.acquire(len(chunk))
        done = admin.call(
            "ReplayDeadLetters",
            group=args.group,
            offsets=[m["dlq_offset"] for m in chunk],
            to_topic=args.to_topic,
            operator=operator,
            run=run,
        )
        replayed += done["replayed"]
        skipped += done["skipped"]
        now = time.monotonic()
        if now - last_report >= 1.0 or i + batch >= len(pending):
            last_report = now
            elapsed = max(now - started, 1e-6)
            print(
                f"replayed {len(replayed)}/{len(pending)} ({len(skipped)} skipped) "
                f"{len(replayed) / elapsed:.1f} msg/s",
                file=sys.stderr,
                flush=True,
            )
    return replayed, skipped


class _ConsumptionLog:
    """`--db`: the group's consumption-log rows of the messages to replay, opened before
    the replay (an unreachable database stops it before anything is replayed) and their
    dead-letter marks read then, so that a row a fast consumer settles between the replay
    and `reopen` still counts as brought back."""

    def __init__(self, args: argparse.Namespace, message_ids: list[str]) -> None:
        self.args = args
        self.message_ids = message_ids
        self.engine: Any = None

    def __enter__(self) -> _ConsumptionLog:
        from outbox.errors import OutboxError
        from outbox.stub_admin import dead_lettered
        from reliable_cli.outbox import open_tables

        args = self.args
        try:
            self.engine, self.tables = open_tables(args.db, args.table_prefix, args.schema)
        except OutboxError as exc:
            raise CommandFailed(f"--db: {exc}", ExitCode.UNAVAILABLE) from None
        self.marked = dead_lettered(self.engine, self.tables, args.group, self.message_ids)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.engine is not None:
            self.engine.dispose()

    def reopen(self, message_ids: list[str], operator: str, run: str) -> None:
        """The consumption-log rows of the replayed messages are no longer dead-lettered."""
        from outbox.stub_admin import reopen_dead_lettered

        n = reopen_dead_lettered(
            self.engine,
            self.tables,
            self.args.group,
            message_ids,
            operator=operator,
            run_id=run,
            marked_before=self.marked,
        )
        print(
            f"consumption log: {n} dead-lettered row(s) of {self.args.group} back in processing",
            file=sys.stderr,
        )


def _replay_output(
    args: argparse.Namespace,
    doc: dict[str, Any],
    shown: list[dict[str, Any]],
    done: list[dict[str, Any]],
    unknown: list[str],
    *,
    dry_run: bool,
    skipped: list[dict[str, Any]] | None = None,
) -> None:
    if args.json:
        print_json(doc)
        return
    if dry_run:
        print(f"dry run: would replay {len(shown)} dead letter(s) of {args.group} to {doc['to']}")
        if shown:
            for line in _dead_table(shown):
                print(line)
    elif shown:
        print(
            f"replayed {len(shown)} dead letter(s) of {args.group} to {doc['to']} "
            f"(run {doc['run']}, operator {doc['operator']})"
        )
        for line in table(
            [
                (
                    r["dlq_offset"],
                    r["msg_id"],
                    r["topic"],
                    r["queue_id"],
                    r["queue_offset"],
                    r["offset_msg_id"],
                )
                for r in shown
            ],
            ("DLQ OFFSET", "MSG ID", "COPY IN", "QUEUE", "OFFSET", "OFFSET MSG ID"),
        ):
            print(line)
    else:
        print(f"nothing to replay for {args.group}")
    if done:
        print(
            f"{len(done)} already replayed (not again): "
            + ", ".join(str(m["dlq_offset"]) for m in done[:20])
            + (" ..." if len(done) > 20 else "")
        )
    for s in skipped or []:
        print(f"skipped DLQ offset {s['dlq_offset']}: {s['reason']}")
    for i in unknown:
        print(f"{i}: no dead letter of {args.group} with this id", file=sys.stderr)


def _dlq_audit(args: argparse.Namespace, admin: api.AdminCaller) -> int:
    if not 1 <= args.limit <= api.MAX_LIMIT:
        raise CommandFailed(f"--limit must be 1..{api.MAX_LIMIT}", ExitCode.USAGE)
    params: dict[str, object] = {"limit": args.limit}
    if args.group:
        params["group"] = args.group
    found = admin.call("DeadLetterAudit", **params)
    if args.json:
        print_json(found)
        return ExitCode.OK
    # one row per run (a run writes one entry per batch it replayed), newest first
    runs: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for e in found["entries"]:
        runs.setdefault(
            (e.get("run"), e.get("group"), e.get("operator"), e.get("mode")), []
        ).append(e)
    rows = []
    for (run, group, operator, mode), entries in runs.items():
        ids = [r["msg_id"] for e in reversed(entries) for r in e.get("replayed", [])]
        rows.append(
            (
                entries[-1].get("at"),
                entries[0].get("at"),
                run,
                operator,
                group,
                "original topic" if mode == "topic" else retry_topic(group),
                len(ids),
                " ".join(ids[:2]) + (" ..." if len(ids) > 2 else ""),
            )
        )
    for line in table(
        rows, ("FROM", "UNTIL", "RUN", "OPERATOR", "GROUP", "TO", "MESSAGES", "MSG IDS")
    ):
        print(line)
    if found["more"]:
        print("(more entries: raise --limit)")
    return ExitCode.OK


# ---------------------------------------------------------------------- groups and topics
def _group_show(args: argparse.Namespace, admin: api.AdminCaller) -> int:
    params: dict[str, object] = {"name": args.name}
    if args.topic:
        params["topic"] = args.topic
    doc: dict[str, Any] = dict(admin.call("GetGroup", **params))
    progress = admin.call("GroupProgress", group=args.name)
    if args.topic:
        progress["topics"] = [t for t in progress["topics"] if t["topic"] == args.topic]
    doc.update(progress)
    if args.json:
        print_json(doc)
        return ExitCode.OK
    consumers = doc["consumers"]
    print(
        f"group {doc['group']}: {'FIFO' if doc['fifo'] else 'concurrent'}, max retries "
        f"{doc['max_retries']}, {len(consumers)} live consumer(s)"
        + (f": {', '.join(consumers)}" if consumers else "")
    )
    rows: list[tuple[object, ...]] = []
    for t in doc["topics"]:
        for q in t["queues"]:
            rows.append(
                (
                    t["topic"],
                    q["queue_id"],
                    q["committed_offset"],
                    q["max_offset"],
                    q["lag"],
                    q["in_flight"],
                    q["last_consume_time"],
                )
            )
        rows.append((t["topic"], "total", "", "", t["lag"], t["in_flight"], t["last_consume_time"]))
    if rows:
        for line in table(
            rows, ("TOPIC", "QUEUE", "COMMITTED", "MAX OFFSET", "LAG", "IN FLIGHT", "LAST CONSUMED")
        ):
            print(line)
    total = doc["total"]
    print(
        f"retry topic {doc['retry_topic']}: depth {doc['retry_depth']}, in flight "
        f"{doc['retry_in_flight']}"
    )
    print(
        f"dead letters {doc['dlq_topic']}: depth {doc['dlq_depth']} ({doc['dlq_replayed']} "
        f"replayed, {doc['dlq_pending']} not replayed)"
    )
    print(
        f"total: lag {total['lag']}, in flight {total['in_flight']}, last consumed "
        f"{total['last_consume_time'] or 'never'}"
    )
    return ExitCode.OK


def _group_reset(args: argparse.Namespace, admin: api.AdminCaller) -> int:
    params: dict[str, object] = {
        "group": args.name,
        "topic": args.topic,
        "execute": args.execute,
        "force": args.force,
    }
    if args.to_time:
        params.update(to="time", time_ms=parse_time(args.to_time))
    elif args.to_offset is not None:
        if args.to_offset < 0:
            raise CommandFailed("--to-offset must not be negative", ExitCode.USAGE)
        params.update(to="offset", offset=args.to_offset)
    else:
        params["to"] = "earliest" if args.earliest else "latest"
    done = admin.call("ResetGroupOffset", **params)
    _warn_clamped(args.to_offset, done["queues"])
    if args.json:
        print_json(done)
        return ExitCode.OK
    target = args.to_time or (args.to_offset if args.to_offset is not None else done["to"])
    print(
        f"{'reset' if done['executed'] else 'dry run: would reset'} group {done['group']} "
        f"on {done['topic']} to {target}"
        + (
            f" ({len(done['consumers'])} live consumer(s)"
            + (", forced)" if done["executed"] else ": --execute needs --force)")
            if done["consumers"]
            else ""
        )
    )
    for line in table(
        [
            (
                q["queue_id"],
                q["min_offset"],
                q["max_offset"],
                q["before"],
                q["after"],
                q["lag_before"],
                q["lag_after"],
            )
            for q in done["queues"]
        ],
        ("QUEUE", "MIN OFFSET", "MAX OFFSET", "BEFORE", "AFTER", "LAG BEFORE", "LAG AFTER"),
    ):
        print(line)
    return ExitCode.OK


def _warn_clamped(offset: int | None, queues: list[dict[str, Any]]) -> None:
    """`--to-offset` past a queue's end (or before its start) is clamped: say so."""
    for side, edge, key in (
        ("past the end", "max", "max_offset"),
        ("before the start", "min", "min_offset"),
    ):
        hit = [q for q in queues if q.get("clamped") == ("end" if edge == "max" else "start")]
        if hit:
            where = ", ".join(f"{q['queue_id']} ({edge} {q[key]})" for q in hit[:8])
            more = f" and {len(hit) - 8} more" if len(hit) > 8 else ""
            print(
                f"{PROG}: warning: --to-offset {offset} is {side} of queue(s) {where}{more}: "
                f"clamped to each one's {edge} offset",
                file=sys.stderr,
            )


def _needs_yes(args: argparse.Namespace, what: str) -> None:
    if not args.yes:
        raise CommandFailed(f"this deletes {what}: add --yes to do it", ExitCode.USAGE)


def _group_delete(args: argparse.Namespace, admin: api.AdminCaller) -> int:
    _needs_yes(args, f"group {args.name!r} (config, offsets, invisible-time state)")
    done = admin.call("DeleteGroup", group=args.name, force=args.force)
    if args.json:
        print_json(done)
    else:
        print(
            f"deleted group {done['group']}; offsets removed on: "
            f"{', '.join(done['offsets_removed_on']) or 'none'}"
        )
    return ExitCode.OK


def _topic_delete(args: argparse.Namespace, admin: api.AdminCaller) -> int:
    _needs_yes(args, f"topic {args.name!r} (config, queues, offsets)")
    done = admin.call("DeleteTopic", topic=args.name)
    if args.json:
        print_json(done)
    else:
        print(
            f"deleted topic {done['topic']} ({len(done['queues'])} queues); its messages "
            "stay in the commitlog until its files expire"
        )
    return ExitCode.OK
