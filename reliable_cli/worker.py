"""`reliable worker resend`: run the outbox resend worker (a daemon, or one pass)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import urllib.parse
from typing import Any

from reliable_cli import observe
from reliable_cli.errors import TargetError
from reliable_cli.exit_codes import ExitCode
from reliable_cli.targets import load_target

log = logging.getLogger("reliable.worker")


def register(subparsers: Any) -> None:
    worker = subparsers.add_parser(
        "worker", help="background workers (outbox resend)", description="Background workers."
    )
    verbs = worker.add_subparsers(dest="verb", metavar="<worker>")
    p = verbs.add_parser(
        "resend",
        help="resend lost outbox messages",
        description="Find outbox stubs whose message was lost (the consumer group passed "
        "it without confirming, or it was never sent) and send them again, with "
        "backoff, up to max_sends; then escalate once through the notifier. "
        "Several workers may run at once. SIGTERM/SIGINT finish the current "
        "pass and exit 0.",
    )
    p.add_argument(
        "--db",
        required=True,
        metavar="URL",
        help="SQLAlchemy URL of the database holding the outbox tables",
    )
    p.add_argument("--table-prefix", default="reliable_", help="outbox table name prefix")
    p.add_argument("--schema", default=None, help="database schema of the outbox tables")
    p.add_argument(
        "--sender",
        required=True,
        metavar="MODULE:ATTR",
        help="object with send(Message) -> SendReceipt, or a factory returning "
        "one (e.g. a reliable Producer)",
    )
    p.add_argument(
        "--offsets",
        metavar="MODULE:ATTR",
        help="object with committed_offset(group, topic, queue_id), or a factory; "
        "without it only never-sent or broker-lost stubs are resent",
    )
    p.add_argument(
        "--bounds",
        metavar="MODULE:ATTR",
        help="object with max_offset(topic, queue_id), or a factory (optional)",
    )
    p.add_argument(
        "--notify",
        action="append",
        default=[],
        metavar="SPEC",
        help="escalation target: 'log' (default), 'webhook:URL', or "
        "'smtp://HOST:PORT?from=ADDR&to=ADDR[,ADDR]'; repeatable",
    )
    p.add_argument(
        "--expected-latency",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long a group may take to confirm a message whose queue is "
        "unknown (a send over gRPC) before it is resent; give `reliable "
        "reconcile` the same value (%(default)s)",
    )
    p.add_argument(
        "--group-latency",
        action="append",
        default=[],
        metavar="GROUP=SECONDS",
        help="the expected latency of one group (repeatable)",
    )
    p.add_argument("--batch-size", type=int, default=200, help="stubs claimed per pass")
    p.add_argument(
        "--interval",
        type=float,
        default=5.0,
        help="seconds to wait after a pass that found less than a full batch",
    )
    p.add_argument(
        "--ensure-schema",
        action="store_true",
        help="create missing outbox tables and add missing columns/indexes first",
    )
    p.add_argument("--once", action="store_true", help="run one pass and exit")
    p.add_argument("--json", action="store_true", help="print metrics as JSON on stdout")
    observe.add_arguments(p)
    p.set_defaults(handler=_resend)
    worker.set_defaults(handler=lambda _args: _usage(worker))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return ExitCode.USAGE


def _notifier(specs: list[str]) -> Any:
    from outbox.notify import LogNotifier, SmtpNotifier, WebhookNotifier

    notifiers: list[Any] = []
    for spec in specs or ["log"]:
        if spec == "log":
            notifiers.append(LogNotifier())
        elif spec.startswith("webhook:"):
            notifiers.append(WebhookNotifier(spec[len("webhook:") :]))
        elif spec.startswith("smtp://"):
            url = urllib.parse.urlsplit(spec)
            query = urllib.parse.parse_qs(url.query)
            if not url.hostname or "from" not in query or "to" not in query:
                raise TargetError(f"{spec!r}: expected smtp://HOST:PORT?from=ADDR&to=ADDR")
            notifiers.append(
                SmtpNotifier(
                    url.hostname,
                    url.port or 25,
                    sender=query["from"][0],
                    recipients=[a for v in query["to"] for a in v.split(",") if a],
                    username=url.username,
                    password=url.password,
                )
            )
        else:
            raise TargetError(f"unknown notifier {spec!r}")
    return notifiers[0] if len(notifiers) == 1 else _AllNotifiers(notifiers)


class _AllNotifiers:
    """Every notifier must deliver; the first failure makes the escalation retry later."""

    def __init__(self, notifiers: list[Any]) -> None:
        self.notifiers = notifiers

    def notify(self, escalation: Any) -> None:
        for notifier in self.notifiers:
            notifier.notify(escalation)


def _resend(args: argparse.Namespace) -> int:
    import sqlalchemy as sa

    from outbox.latency import ExpectedLatency
    from outbox.models import OutboxTables
    from outbox.schema import TablesMissing, require_tables
    from outbox.worker import ResendPolicy, ResendWorker, describe

    if args.batch_size < 1 or args.interval < 0:
        print(
            "reliable worker resend: --batch-size must be >= 1 and --interval >= 0", file=sys.stderr
        )
        return ExitCode.USAGE
    try:
        sender = load_target(args.sender, method="send")
        offsets = load_target(args.offsets, method="committed_offset") if args.offsets else None
        bounds = load_target(args.bounds, method="max_offset") if args.bounds else None
        notifier = _notifier(args.notify)
        latency = ExpectedLatency.parse(args.expected_latency, args.group_latency)
    except (TargetError, ValueError) as exc:
        print(f"reliable worker resend: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        engine = sa.create_engine(args.db, pool_pre_ping=True)
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
    except (sa.exc.SQLAlchemyError, ImportError) as exc:
        print(f"reliable worker resend: database unavailable: {_first_line(exc)}", file=sys.stderr)
        return ExitCode.UNAVAILABLE
    tables = OutboxTables(prefix=args.table_prefix, schema=args.schema)
    if args.ensure_schema:
        from outbox.schema import SchemaMismatch, ensure_schema

        try:
            report = ensure_schema(engine, tables)
        except SchemaMismatch as exc:
            print(f"reliable worker resend: {exc}", file=sys.stderr)
            return ExitCode.FAILURE
        if report.changed:
            log.warning(
                "schema updated: tables %s, columns %s, indexes %s",
                report.created_tables,
                report.added_columns,
                report.created_indexes,
            )
    try:
        require_tables(engine, tables)
    except TablesMissing as exc:
        print(f"reliable worker resend: {exc}", file=sys.stderr)
        engine.dispose()
        return ExitCode.FAILURE
    except sa.exc.SQLAlchemyError as exc:
        print(f"reliable worker resend: database unavailable: {_first_line(exc)}", file=sys.stderr)
        engine.dispose()
        return ExitCode.UNAVAILABLE
    worker = ResendWorker(
        engine,
        tables,
        sender,
        offsets=offsets,
        bounds=bounds,
        notifier=notifier,
        policy=ResendPolicy(batch_size=args.batch_size, expected_latency=latency),
    )

    def emit(kind: str, metrics: Any) -> None:
        if args.json:
            print(
                json.dumps({"event": kind, "worker": worker.name, **metrics.as_dict()}), flush=True
            )
        elif kind != "pass":
            print(f"{kind}: {describe(metrics)}", flush=True)

    stop = threading.Event()
    try:
        endpoint = _metrics_endpoint(args, engine, tables, worker, stop)
    except OSError as exc:
        print(
            f"reliable worker resend: cannot serve metrics on {args.metrics_host}:"
            f"{args.metrics_port}: {exc}",
            file=sys.stderr,
        )
        engine.dispose()
        return ExitCode.UNAVAILABLE
    try:
        if args.once:
            emit("done", worker.run_once())
            return ExitCode.OK
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        log.info("resend worker %s started", worker.name)
        emit("started", worker.metrics)

        def on_pass(result: Any) -> None:
            if result.selected or result.errors:
                log.info("pass: %s", describe(result))
                emit("pass", result)

        worker.run(stop, interval=args.interval, on_pass=on_pass)
        emit("stopped", worker.metrics)
        return ExitCode.OK
    except sa.exc.OperationalError as exc:
        print(f"reliable worker resend: database unavailable: {_first_line(exc)}", file=sys.stderr)
        return ExitCode.UNAVAILABLE
    finally:
        if endpoint is not None:
            endpoint.stop()
        engine.dispose()


def _metrics_endpoint(
    args: argparse.Namespace, engine: Any, tables: Any, worker: Any, stop: threading.Event
) -> Any:
    """/metrics: the outbox backlog and the worker's counters; /readyz: the database
    answers `select 1` and the worker runs."""
    if args.metrics_port is None:
        return None
    import sqlalchemy as sa
    from prometheus_client import CollectorRegistry

    from outbox.metrics import OutboxCollector
    from reliable.endpoint import check

    registry = CollectorRegistry()
    registry.register(OutboxCollector(engine, tables, worker=worker))

    def select_one() -> None:
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))

    database = check(select_one)

    def ready() -> dict[str, bool]:
        return {"running": not stop.is_set(), "database": database()}

    return observe.start_endpoint(args, "reliable worker resend", registry, ready)


def _first_line(exc: BaseException) -> str:
    """A database error on one line (SQLAlchemy appends the SQL and a help link)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
