"""`reliable reconcile`: the Spark audit of stubs against the consumption log.

The same options serve `spark-submit` on a cluster, which runs this package's `__main__.py`
as a file (`python -m reliable_cli.reconcile ...` is the same entry point):

    spark-submit --master yarn .../reliable_cli/reconcile/__main__.py --db URL \\
        --jdbc-jar /path/postgresql.jar

PySpark is imported only when the job runs.

Exit codes (`reliable_cli.exit_codes`): 0 the window is clean; 3 it has unaccounted
messages; 5 nothing is unaccounted but escalated messages await manual handling (the
resend worker gave up on them: an operator requeues or voids each); 1 the job failed to
run (including a malformed queue-bounds file); 2 bad options; 4 a source could not be read
(including a missing bounds file or an unreachable broker).
"""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from outbox.latency import DEFAULT_EXPECTED_LATENCY, ExpectedLatency
from outbox.reconcile.errors import InvalidOptions, ReconcileError, SourceUnavailable
from outbox.reconcile.job import ReconcileOptions, ReconcileResult, reconcile
from outbox.reconcile.repair import RepairOptions
from outbox.reconcile.sources import PartitionPolicy
from reliable_cli.exit_codes import ExitCode

if TYPE_CHECKING:
    from reliable_cli import Subparsers

log = logging.getLogger("outbox.reconcile")


def _when(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO date/time: {text!r} (e.g. 2026-01-31 or 2026-01-31T12:00)"
        ) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {value}")
    return value


def _conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value.strip()


def register(subparsers: Subparsers) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "reconcile",
        help="prove every outbox message was consumed; report and repair what was not",
        description="Reconcile message stubs with confirmations and the consumption log "
        "(PySpark; local[*] by default). Exit 0: the window is clean; 3: it has "
        "unaccounted messages; 5: escalated messages await manual handling "
        "(reliable outbox requeue / void); 1: failure; 2: bad options; 4: source "
        "unreadable.",
    )
    add_arguments(parser)
    parser.set_defaults(handler=run)


def exit_code_of(result: ReconcileResult) -> ExitCode:
    """OK for a clean certificate; UNACCOUNTED when the window has unaccounted messages
    (whatever else it has: a repair may help them); MANUAL_HANDLING when its only open
    messages are escalations an operator must requeue or void."""
    cert = result.summary.certificate
    if cert.unaccounted:
        return ExitCode.UNACCOUNTED
    if cert.manual:
        return ExitCode.MANUAL_HANDLING
    return ExitCode.OK


def add_arguments(p: argparse.ArgumentParser) -> None:
    _add_source(p)
    _add_spark(p)
    _add_window(p)
    _add_output(p)
    _add_repair(p)


def _add_source(p: argparse.ArgumentParser) -> None:
    """Where the tables are read from, and the broker's offsets and queue bounds."""
    src = p.add_argument_group("source")
    one = src.add_mutually_exclusive_group(required=True)
    one.add_argument(
        "--db",
        metavar="URL",
        help="SQLAlchemy URL of the outbox database (sqlite, postgresql, mysql)",
    )
    one.add_argument(
        "--parquet",
        metavar="DIR",
        help="root of Parquet exports (message_stub/, confirmation/, "
        "consumption_log/, optional topic_group/, consumer_offset/)",
    )
    src.add_argument("--prefix", default="reliable_", help="table name prefix (%(default)s)")
    src.add_argument("--schema", default=None, help="database schema of the tables")
    src.add_argument(
        "--offsets",
        metavar="SPEC",
        default=None,
        help="committed consumer offsets: the broker's consumerOffset.json, a "
        "Parquet directory, or table:NAME (default: the log's max offsets)",
    )
    src.add_argument(
        "--queue-bounds",
        metavar="SPEC",
        default=None,
        help="the offsets the broker still holds per queue: a JSON file "
        '({"topic": {"queue": max_offset}}), a Parquet directory, '
        "table:NAME, or grpc:HOST:PORT (asked live); an unconfirmed stub "
        "at/after its queue's max offset is then lost, not backlogged",
    )


def _add_spark(p: argparse.ArgumentParser) -> None:
    """The Spark session and how the tables are partitioned."""
    spark = p.add_argument_group("spark")
    spark.add_argument(
        "--master",
        default=None,
        help="Spark master (default local[*]; under spark-submit, its own)",
    )
    spark.add_argument(
        "--jdbc-jar",
        action="append",
        default=[],
        metavar="PATH",
        help="JDBC driver jar (repeatable; also RELIABLE_JDBC_JARS); default: "
        "the system's under /usr/share/java",
    )
    spark.add_argument(
        "--partitions",
        type=_positive_int,
        default=None,
        help="JDBC read partitions per table (default from the row count)",
    )
    spark.add_argument("--rows-per-partition", type=_positive_int, default=250_000)
    spark.add_argument("--max-partitions", type=_positive_int, default=64)
    spark.add_argument(
        "--conf",
        type=_conf,
        action="append",
        default=[],
        metavar="K=V",
        help="extra Spark setting (repeatable)",
    )


def _add_window(p: argparse.ArgumentParser) -> None:
    """The certificate's window, and when a stub counts as lost."""
    win = p.add_argument_group("window and verdicts")
    win.add_argument(
        "--since",
        type=_when,
        default=None,
        help="certificate window start, on the stub's created_at (UTC)",
    )
    win.add_argument("--until", type=_when, default=None, help="window end (exclusive)")
    win.add_argument(
        "--grace",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="an unsent stub younger than this is backlogged, not lost (%(default)s)",
    )
    win.add_argument(
        "--expected-latency",
        type=float,
        default=DEFAULT_EXPECTED_LATENCY.total_seconds(),
        metavar="SECONDS",
        help="how long a group may take to confirm a message whose queue is "
        "unknown (a send over gRPC); unconfirmed and unlogged after that "
        "it is lost. Give the resend worker the same value (%(default)s)",
    )
    win.add_argument(
        "--group-latency",
        action="append",
        default=[],
        metavar="GROUP=SECONDS",
        help="the expected latency of one group (repeatable)",
    )


def _add_output(p: argparse.ArgumentParser) -> None:
    """The summary and the detail rows."""
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the JSON summary")
    out.add_argument(
        "--output",
        metavar="FILE",
        default=None,
        help="also write the summary (text, or JSON with --json) to FILE",
    )
    out.add_argument(
        "--report-table",
        metavar="NAME",
        default=None,
        help="append detail rows to this table of the --db database",
    )
    out.add_argument(
        "--report-parquet",
        metavar="DIR",
        default=None,
        help="append detail rows to this Parquet directory",
    )
    out.add_argument(
        "--report-all", action="store_true", help="detail rows for confirmed and void stubs too"
    )


def _add_repair(p: argparse.ArgumentParser) -> None:
    """Repairing what the run found."""
    rep = p.add_argument_group("repair")
    rep.add_argument(
        "--repair",
        action="store_true",
        help="mark lost stubs due for resend now; close stale log rows",
    )
    rep.add_argument("--dry-run", action="store_true", help="report repairs, change nothing")
    rep.add_argument("--batch-size", type=_positive_int, default=500)
    rep.add_argument(
        "--rate-limit",
        type=_positive_float,
        default=None,
        metavar="PER_S",
        help="at most this many changes per second",
    )
    rep.add_argument(
        "--repair-limit",
        type=_positive_int,
        default=None,
        metavar="N",
        help="consider at most N repair candidates in this run",
    )


def options_from(args: argparse.Namespace) -> ReconcileOptions:
    try:
        latency = ExpectedLatency.parse(args.expected_latency, args.group_latency)
    except ValueError as exc:
        raise InvalidOptions(str(exc)) from None
    return ReconcileOptions(
        db_url=args.db,
        parquet=args.parquet,
        table_prefix=args.prefix,
        schema=args.schema,
        master=args.master,
        jdbc_jars=tuple(args.jdbc_jar),
        partitions=PartitionPolicy(
            rows_per_partition=args.rows_per_partition,
            max_partitions=args.max_partitions,
            num_partitions=args.partitions,
        ),
        offsets=args.offsets,
        queue_bounds=args.queue_bounds,
        since=args.since,
        until=args.until,
        grace=timedelta(seconds=args.grace),
        expected_latency=latency,
        report_table=args.report_table,
        report_parquet=args.report_parquet,
        report_all=args.report_all,
        repair=args.repair or args.dry_run,
        repair_options=RepairOptions(
            dry_run=args.dry_run,
            batch_size=args.batch_size,
            rate_limit=args.rate_limit,
            limit=args.repair_limit,
        ),
        spark_conf=dict(args.conf),
    )


def run(args: argparse.Namespace) -> int:
    """Run the job for parsed arguments; print the summary; return the exit code."""
    progress = not getattr(args, "json", False) and log.getEffectiveLevel() > logging.INFO
    if not progress:
        return _run(args)
    # the job's own progress on stderr (Spark itself prints nothing by default)
    handler = _Progress()
    saved = (log.level, log.propagate)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        return _run(args)
    finally:
        log.removeHandler(handler)
        log.setLevel(saved[0])
        log.propagate = saved[1]


class _Progress(logging.Handler):
    """`reconcile: <message>` on whatever `sys.stderr` is when a record is emitted."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(f"reconcile: {record.getMessage()}", file=sys.stderr, flush=True)
        except Exception:
            self.handleError(record)


def _run(args: argparse.Namespace) -> int:
    from outbox.reconcile.report import as_json, as_text

    try:
        options = options_from(args)
        log.info("reconciling %s", "the database" if options.db_url else options.parquet)
        result = reconcile(options)
    except InvalidOptions as exc:
        print(f"reliable reconcile: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except SourceUnavailable as exc:
        print(f"reliable reconcile: {exc}", file=sys.stderr)
        return ExitCode.UNAVAILABLE
    except (ReconcileError, ImportError) as exc:
        print(f"reliable reconcile: {exc}", file=sys.stderr)
        return ExitCode.FAILURE
    text = as_json(result, exit_code=int(exit_code_of(result))) if args.json else as_text(result)
    print(text)
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
        except OSError as exc:
            print(f"reliable reconcile: cannot write {args.output}: {exc}", file=sys.stderr)
            return ExitCode.FAILURE
    return exit_code_of(result)


def main(argv: list[str] | None = None) -> int:
    """Entry point for `python -m reliable_cli.reconcile` and `spark-submit .../__main__.py`."""
    parser = argparse.ArgumentParser(
        prog="reconcile", description="Reconcile outbox stubs with the consumption log."
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    # spark-submit merges the driver's stderr into its stdout: keep stdout to the summary
    # (progress at INFO only for people, never with --json)
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        force=True,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.json:
        log.setLevel(logging.INFO)
    return run(args)
