"""`reliable worker resend`: run the outbox resend worker (a daemon, or one pass).

The worker starts what it is given: a sender, offset source or bounds object with a
`start()` (a `reliable.Producer`), and the transport it reaches the broker through
(`.transport`, e.g. `TransportOffsets(transport)`), are started before the first pass and
shut down after the last; one that cannot start is refused in one line. A worker in its own
process needs a served broker (`reliable broker start`): an embedded broker's store is
open in one process only, the application's, whose own `ResendWorker` resends for it.

Exit codes: 0 ok; 1 outbox tables missing, or `--once` and a send (or an escalation's
notification) failed; 2 usage (including a sender that cannot start, or one on an embedded
store another process holds); 4 database unavailable.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reliable_cli import observe
from reliable_cli.errors import TargetError
from reliable_cli.exit_codes import ExitCode
from reliable_cli.targets import load_target

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from broker.store.errors import StoreLocked
    from outbox.latency import ExpectedLatency
    from outbox.models import OutboxTables
    from outbox.notify import Escalation, Notifier
    from outbox.ports import OffsetSource, QueueBounds, Sender
    from outbox.worker import Metrics, ResendWorker
    from reliable.endpoint import MetricsEndpoint
    from reliable_cli import Subparsers

log = logging.getLogger("reliable.worker")


def register(subparsers: Subparsers) -> None:
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
        "default: the sender's broker when it is a reliable Producer, else none (a copy "
        "is then judged by the expected latency)",
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


def _notifier(specs: list[str]) -> Notifier:
    from outbox.notify import LogNotifier, SmtpNotifier, WebhookNotifier

    notifiers: list[Notifier] = []
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

    def __init__(self, notifiers: list[Notifier]) -> None:
        self.notifiers = notifiers

    def notify(self, escalation: Escalation) -> None:
        for notifier in self.notifiers:
            notifier.notify(escalation)


def _resend(args: argparse.Namespace) -> int:
    from reliable_cli.admin_call import CommandFailed

    try:
        return _run_resend(args)
    except CommandFailed as exc:
        print(f"reliable worker resend: {exc}", file=sys.stderr)
        return exc.exit_code


def _run_resend(args: argparse.Namespace) -> int:
    """Load what the command names, open the database, start the sender and what else
    needs starting, then resend (once, or until a signal); stop and close them all."""
    from outbox.worker import ResendPolicy, ResendWorker

    parts = _load_parts(args)
    engine = _open_database(args)
    stops: list[Callable[[], None]] = []
    try:
        tables = _prepared_tables(args, engine)
        stops = _start_all(args, _distinct(parts.sender, parts.offsets, parts.bounds))
        worker = ResendWorker(
            engine,
            tables,
            parts.sender,
            offsets=parts.offsets if parts.offsets is not None else _offsets_of(parts.sender),
            bounds=parts.bounds,
            notifier=parts.notifier,
            policy=ResendPolicy(batch_size=args.batch_size, expected_latency=parts.latency),
        )
        return _serve(args, engine, tables, worker)
    finally:
        _stop_all(stops)
        engine.dispose()


@dataclass(frozen=True)
class _Parts:
    """What the command line names: the sender, the offset and bounds sources, the
    escalation notifier and the expected latencies."""

    sender: Sender
    offsets: OffsetSource | None
    bounds: QueueBounds | None
    notifier: Notifier
    latency: ExpectedLatency


def _load_parts(args: argparse.Namespace) -> _Parts:
    from broker.store.errors import StoreLocked
    from outbox.latency import ExpectedLatency
    from reliable_cli.admin_call import CommandFailed

    if args.batch_size < 1 or args.interval < 0:
        raise CommandFailed("--batch-size must be >= 1 and --interval >= 0", ExitCode.USAGE)
    try:
        return _Parts(
            sender=load_target(args.sender, method="send"),
            offsets=load_target(args.offsets, method="committed_offset") if args.offsets else None,
            bounds=load_target(args.bounds, method="max_offset") if args.bounds else None,
            notifier=_notifier(args.notify),
            latency=ExpectedLatency.parse(args.expected_latency, args.group_latency),
        )
    except StoreLocked as exc:  # a wiring module that starts an embedded producer on import
        raise CommandFailed(_embedded_store_held(exc), ExitCode.USAGE) from None
    except (TargetError, ValueError) as exc:
        raise CommandFailed(str(exc), ExitCode.USAGE) from None


def _open_database(args: argparse.Namespace) -> Engine:
    """The engine of --db, once a query went through."""
    import sqlalchemy as sa

    from outbox.database import DatabaseUrlError, create_engine
    from reliable_cli.admin_call import CommandFailed

    try:
        engine = create_engine(args.db, pool_pre_ping=True)
    except DatabaseUrlError as exc:
        raise CommandFailed(f"--db {exc}", ExitCode.USAGE) from None
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
    except (sa.exc.SQLAlchemyError, ImportError) as exc:
        raise CommandFailed(
            f"database unavailable: {_first_line(exc)}", ExitCode.UNAVAILABLE
        ) from None
    return engine


def _prepared_tables(args: argparse.Namespace, engine: Engine) -> OutboxTables:
    """The outbox tables, created or updated first with --ensure-schema; refused when
    they are missing."""
    import sqlalchemy as sa

    from outbox.models import OutboxTables
    from outbox.schema import TablesMissing, require_tables
    from reliable_cli.admin_call import CommandFailed

    tables = OutboxTables(prefix=args.table_prefix, schema=args.schema)
    if args.ensure_schema:
        from outbox.schema import SchemaMismatch, ensure_schema

        try:
            report = ensure_schema(engine, tables)
        except SchemaMismatch as exc:
            raise CommandFailed(str(exc), ExitCode.FAILURE) from None
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
        raise CommandFailed(str(exc), ExitCode.FAILURE) from None
    except sa.exc.SQLAlchemyError as exc:
        raise CommandFailed(
            f"database unavailable: {_first_line(exc)}", ExitCode.UNAVAILABLE
        ) from None
    return tables


def _start_all(args: argparse.Namespace, targets: list[object]) -> list[Callable[[], None]]:
    """Start each target that needs starting; on a failure, stop those started."""
    from broker.store.errors import StoreLocked
    from reliable_cli.admin_call import CommandFailed

    stops: list[Callable[[], None]] = []
    try:
        for target in targets:
            stops.extend(_start(target))
    except StoreLocked as exc:
        _stop_all(stops)
        raise CommandFailed(_embedded_store_held(exc), ExitCode.USAGE) from None
    except Exception as exc:
        _stop_all(stops)
        raise CommandFailed(
            f"cannot start {args.sender}: {_first_line(exc)}", ExitCode.USAGE
        ) from None
    return stops


def _serve(
    args: argparse.Namespace, engine: Engine, tables: OutboxTables, worker: ResendWorker
) -> int:
    """Resend once (--once) or until SIGTERM/SIGINT, printing events, with the metrics
    endpoint up meanwhile."""
    import sqlalchemy as sa

    from outbox.worker import describe
    from reliable_cli.admin_call import CommandFailed

    def emit(kind: str, metrics: Metrics) -> None:
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
        raise CommandFailed(
            f"cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {exc}",
            ExitCode.UNAVAILABLE,
        ) from None
    try:
        if args.once:
            result = worker.run_once()
            emit("done", result)
            if result.errors:
                raise CommandFailed(
                    f"{result.errors} of {result.selected} stubs failed this pass (each keeps "
                    "its last_error: reliable outbox list --status UNCONFIRMED)",
                    ExitCode.FAILURE,
                )
            return ExitCode.OK
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        log.info("resend worker %s started", worker.name)
        emit("started", worker.metrics)

        def on_pass(result: Metrics) -> None:
            if result.selected or result.errors:
                log.info("pass: %s", describe(result))
                emit("pass", result)

        worker.run(stop, interval=args.interval, on_pass=on_pass)
        emit("stopped", worker.metrics)
        return ExitCode.OK
    except sa.exc.OperationalError as exc:
        raise CommandFailed(
            f"database unavailable: {_first_line(exc)}", ExitCode.UNAVAILABLE
        ) from None
    finally:
        if endpoint is not None:
            endpoint.stop()


def _offsets_of(sender: Sender) -> OffsetSource | None:
    """The committed offsets of the broker the sender reaches (a `reliable.Producer`'s
    transport), so that a worker given no `--offsets` still judges a copy whose queue is
    known by how far its group got; None when the sender offers none."""
    transport = getattr(sender, "transport", None)
    if not callable(getattr(transport, "query_offset", None)):
        return None
    from outbox.adapters import TransportOffsets

    log.info("committed offsets: asked of the sender's broker (no --offsets given)")
    return TransportOffsets(transport)


def _distinct(*targets: object) -> list[object]:
    """The targets given, each once (a producer may be the sender and the bounds too)."""
    seen: dict[int, object] = {}
    for target in targets:
        if target is not None:
            seen.setdefault(id(target), target)
    return list(seen.values())


def _start(target: Any) -> list[Callable[[], None]]:
    """Start the transport `target` reaches the broker through (`.transport`) and `target`
    itself, each when it has a `start()` (both are idempotent for the framework's
    producers and transports); the stops to call at exit, last started first."""
    stops: list[Callable[[], None]] = []
    transport = getattr(target, "transport", None)
    if transport is not None and callable(getattr(transport, "start", None)):
        transport.start()
        if callable(getattr(transport, "close", None)):
            stops.append(transport.close)
    if callable(getattr(target, "start", None)):
        target.start()
        stop = getattr(target, "shutdown", None) or getattr(target, "close", None)
        if callable(stop):
            stops.append(stop)
    return stops


def _stop_all(stops: list[Callable[[], None]]) -> None:
    for stop in reversed(stops):
        try:
            stop()
        except Exception as exc:  # exiting anyway: say so, do not hide the exit code
            log.warning("resend worker: stopping %r failed: %s", stop, exc)
    stops.clear()


def _embedded_store_held(exc: StoreLocked) -> str:
    """Why a worker process cannot use an embedded broker's store, and what to run."""
    return (
        f"the embedded broker's store {exc.path} is open in another process (the "
        "application that embeds it), and a store is open in one process only: run the "
        "resend worker inside that process (outbox.ResendWorker(...).run(stop), "
        "docs/outbox.md), or serve the broker (reliable broker start --store DIR) and give "
        "this worker a sender on it (Producer('grpc', endpoint='HOST:PORT'))"
    )


def _metrics_endpoint(
    args: argparse.Namespace,
    engine: Engine,
    tables: OutboxTables,
    worker: ResendWorker,
    stop: threading.Event,
) -> MetricsEndpoint | None:
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
