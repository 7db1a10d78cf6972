"""`reliable outbox list|show|void|requeue`: an operator's view of the outbox stubs and the
two manual actions on them, each audited in `<prefix>reconcile_audit` (see
`outbox.stub_admin`).

    void     the stub becomes VOID: never resent; reconciliation counts it void
    requeue  the stub is due now with a fresh send budget (send count back to 0, escalation
             cleared): the resend worker sends it on its next pass

Exit codes: 0 done; 1 no such stub, or it is not UNCONFIRMED; 2 bad command line; 4 the
database is unreachable.

Examples:
    reliable outbox list --db postgresql://app@db/orders --status UNCONFIRMED --older-than 1h
    reliable outbox show 0A0B0C... --db sqlite:///orders.db
    reliable outbox void 0A0B0C... --db sqlite:///orders.db --yes
    reliable outbox requeue 0A0B0C... --db sqlite:///orders.db --yes --json
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from reliable_cli.admin_call import CommandFailed as _Failed
from reliable_cli.admin_call import print_json, table
from reliable_cli.exit_codes import ExitCode

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from outbox.models import OutboxTables
    from reliable_cli import Subparsers

PROG = "reliable outbox"
_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "outbox",
        help="list, show, void and requeue outbox stubs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = p.add_subparsers(dest="verb", metavar="<list|show|void|requeue>")
    ls = verbs.add_parser("list", help="stubs, oldest first")
    ls.add_argument("--status", type=str.upper, choices=("UNCONFIRMED", "CONFIRMED", "VOID"))
    ls.add_argument(
        "--older-than", metavar="DURATION", help="created more than DURATION ago (30s, 15m, 2h, 1d)"
    )
    ls.add_argument("--topic")
    ls.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    _db(ls)
    ls.set_defaults(handler=_handler(_list))
    for verb, text in (
        ("show", "one stub with its log, confirmation and audit rows"),
        ("void", "never send this stub again (status VOID)"),
        ("requeue", "send this stub again now, with a fresh send budget"),
    ):
        v = verbs.add_parser(verb, help=text)
        v.add_argument("message_id", metavar="ID")
        if verb != "show":
            v.add_argument("--yes", action="store_true", help="really do it")
            v.add_argument(
                "--operator",
                default=None,
                help="who does this, for the audit (default: the login name)",
            )
            v.add_argument("--reason", default=None, help="why, for the audit")
        _db(v)
        v.set_defaults(handler=_handler({"show": _show, "void": _void, "requeue": _requeue}[verb]))

    def usage(_args: argparse.Namespace) -> int:
        p.print_help(sys.stderr)
        return ExitCode.USAGE

    p.set_defaults(handler=usage)


def _db(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--db",
        required=True,
        metavar="URL",
        help="SQLAlchemy URL of the database holding the outbox tables",
    )
    p.add_argument("--table-prefix", default="reliable_", help="table name prefix")
    p.add_argument("--schema", default=None, help="database schema of the outbox tables")
    p.add_argument("--json", action="store_true", help="print one JSON document")


def open_tables(url: str, prefix: str, schema: str | None) -> tuple[Engine, OutboxTables]:
    """(engine, OutboxTables) of an outbox database whose tables exist; OutboxError or
    `_Failed` otherwise."""
    import sqlalchemy as sa

    from outbox.database import create_engine, require_existing_sqlite
    from outbox.models import OutboxTables
    from outbox.schema import require_tables

    try:
        require_existing_sqlite(url)  # a wrong path is refused, not created empty
        engine = create_engine(url)
    except (sa.exc.SQLAlchemyError, ImportError, ValueError) as exc:
        raise _Failed(f"--db: {str(exc).splitlines()[0]}", ExitCode.USAGE) from None
    tables = OutboxTables(prefix=prefix, schema=schema)
    try:
        require_tables(engine, tables)
    except sa.exc.SQLAlchemyError as exc:
        engine.dispose()
        raise _Failed(
            f"database unavailable: {str(exc).splitlines()[0]}", ExitCode.UNAVAILABLE
        ) from None
    return engine, tables


def _handler(
    run: Callable[[argparse.Namespace, Engine, OutboxTables], int],
) -> Callable[[argparse.Namespace], int]:
    def handle(args: argparse.Namespace) -> int:
        import sqlalchemy as sa

        from outbox.errors import OutboxError
        from outbox.stub_admin import StubNotFound, StubNotOpen

        try:
            engine, tables = open_tables(args.db, args.table_prefix, args.schema)
            try:
                return run(args, engine, tables)
            finally:
                engine.dispose()
        except _Failed as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return exc.exit_code
        except (StubNotFound, StubNotOpen) as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return ExitCode.FAILURE
        except OutboxError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return ExitCode.FAILURE
        except sa.exc.SQLAlchemyError as exc:
            print(f"{PROG}: database unavailable: {str(exc).splitlines()[0]}", file=sys.stderr)
            return ExitCode.UNAVAILABLE

    return handle


def parse_duration(text: str) -> timedelta:
    m = _DURATION.match(text.strip())
    if not m:
        raise _Failed(f"{text!r} is not a duration: use 30s, 15m, 2h or 1d", ExitCode.USAGE)
    return timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})


def _list(args: argparse.Namespace, engine: Engine, tables: OutboxTables) -> int:
    from outbox.stub_admin import MAX_LIST, list_stubs

    if not 1 <= args.limit <= MAX_LIST:
        raise _Failed(f"--limit must be 1..{MAX_LIST}", ExitCode.USAGE)
    older = parse_duration(args.older_than) if args.older_than else None
    stubs, more = list_stubs(
        engine, tables, status=args.status, older_than=older, topic=args.topic, limit=args.limit
    )
    if args.json:
        print_json({"stubs": stubs, "more": more})
        return ExitCode.OK
    for line in table(
        [
            (
                s["message_id"],
                s["topic"],
                s["status"],
                f"{s['send_count']}/{s['max_sends']}",
                s["queue_id"],
                s["queue_offset"],
                s["created_at"],
                s["next_resend_at"],
                "yes" if s["escalated_at"] else None,
                (s["last_error"] or "")[:60],
            )
            for s in stubs
        ],
        (
            "MESSAGE ID",
            "TOPIC",
            "STATUS",
            "SENDS",
            "QUEUE",
            "OFFSET",
            "CREATED",
            "NEXT RESEND",
            "ESCALATED",
            "LAST ERROR",
        ),
    ):
        print(line)
    if more:
        print(f"(more stubs match: only the oldest {len(stubs)} are shown; raise --limit)")
    return ExitCode.OK


def _show(args: argparse.Namespace, engine: Engine, tables: OutboxTables) -> int:
    from outbox.stub_admin import show_stub

    doc = show_stub(engine, tables, args.message_id)
    if args.json:
        print_json(doc)
        return ExitCode.OK
    for name, value in doc["stub"].items():
        print(f"{name:<16} {'-' if value is None or value == '' else value}")
    for title, rows, cols in (
        (
            "confirmations",
            doc["confirmations"],
            ("consumer_group", "topic", "confirmed_at", "outcome"),
        ),
        (
            "consumption log",
            doc["consumption_log"],
            (
                "consumer_group",
                "topic",
                "queue_id",
                "queue_offset",
                "created_at",
                "dead_lettered_at",
            ),
        ),
        ("audit", doc["audit"], ("changed_at", "action", "consumer_group", "reason")),
    ):
        print(f"\n{title}: {len(rows)}")
        if rows:
            for line in table(
                [[r[c] for c in cols] for r in rows], [c.upper().replace("_", " ") for c in cols]
            ):
                print("  " + line)
    return ExitCode.OK


def _act(args: argparse.Namespace, engine: Engine, tables: OutboxTables, verb: str) -> int:
    from outbox.stub_admin import requeue_stub, void_stub
    from reliable_cli.admin_message import _login

    if not args.yes:
        raise _Failed(f"{verb} changes stub {args.message_id}: add --yes to do it", ExitCode.USAGE)
    action = void_stub if verb == "void" else requeue_stub
    kwargs: dict[str, Any] = {"operator": args.operator or _login()}
    if args.reason:
        kwargs["reason"] = args.reason
    done = action(engine, tables, args.message_id, **kwargs)
    if args.json:
        print_json(done.to_json())
    else:
        print(
            f"{verb}: stub {done.message_id}: status {done.before['status']} -> "
            f"{done.after['status']}, send count {done.before['send_count']} -> "
            f"{done.after['send_count']} (audit run {done.run_id})"
        )
    return ExitCode.OK


def _void(args: argparse.Namespace, engine: Engine, tables: OutboxTables) -> int:
    return _act(args, engine, tables, "void")


def _requeue(args: argparse.Namespace, engine: Engine, tables: OutboxTables) -> int:
    return _act(args, engine, tables, "requeue")
