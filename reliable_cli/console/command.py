"""`reliable console`: the web console of a running broker (and of its outbox database).

Examples:
    reliable console --endpoint 127.0.0.1:8081 --password-file console.pw
    reliable console --endpoint 127.0.0.1:8081 --db postgresql://app@db/shop \\
        --password-file console.pw --allow-actions
    reliable console --endpoint broker:8081 --access-key ops --secret-key-file ops.key

Read-only unless `--allow-actions`. Logging in takes the password of `--password-file`,
or else an access key and secret key the broker accepts. Binds 127.0.0.1 unless told
otherwise: put it behind a TLS reverse proxy before opening it to a network (see
docs/console.md).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from broker.config import DEFAULT_PORT, with_default_port
from reliable_cli import observe
from reliable_cli.exit_codes import ExitCode

if TYPE_CHECKING:
    from reliable.endpoint import MetricsEndpoint
    from reliable_cli import Subparsers
    from reliable_cli.console.broker_view import BrokerView

PROG = "reliable console"


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "console",
        help="the web console: overview, messages, dead letters, outbox, reconciliation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--endpoint",
        required=True,
        type=with_default_port,
        metavar="HOST:PORT",
        help=f"the broker's address (its admin service; the port defaults to {DEFAULT_PORT})",
    )
    p.add_argument(
        "--db",
        default=None,
        metavar="URL",
        help="the outbox database (SQLAlchemy URL), read-only: backlog and reconciliation pages",
    )
    p.add_argument("--prefix", default="reliable_", help="outbox table prefix (%(default)s)")
    p.add_argument("--schema", default=None, help="database schema of the outbox tables")
    p.add_argument(
        "--report-table",
        default=None,
        metavar="NAME",
        help="the reconciliation's detail-row table (reliable reconcile "
        "--report-table; default <prefix>reconcile_report)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default %(default)s: this machine only)",
    )
    p.add_argument("--port", type=int, default=8080, help="HTTP port (default %(default)s)")
    p.add_argument(
        "--allow-actions",
        action="store_true",
        help="enable dead-letter replay and reconsume (otherwise read-only)",
    )
    p.add_argument(
        "--password-file",
        type=Path,
        default=None,
        help="log in with the password on this file's first line",
    )
    p.add_argument(
        "--no-auth",
        action="store_true",
        help="no login at all (only with --host 127.0.0.1 and without --allow-actions)",
    )
    p.add_argument(
        "--access-key",
        default="",
        help="the console's access key for the broker (when its auth is on); "
        "without --password-file, users log in with a key the broker accepts",
    )
    p.add_argument(
        "--secret-key-file",
        type=Path,
        default=None,
        help="file holding the secret key of --access-key (or set RELIABLE_SECRET_KEY)",
    )
    p.add_argument("--tls", action="store_true", help="connect to the broker over TLS")
    p.add_argument("--ca-file", default=None, help="with --tls: PEM roots to trust")
    p.add_argument(
        "--sample-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how often the charts sample the broker (default %(default)s)",
    )
    p.add_argument("--threads", type=int, default=8, help="HTTP worker threads (default 8)")
    observe.add_arguments(p)
    p.set_defaults(handler=run)


def _fail(message: str, code: ExitCode = ExitCode.USAGE) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return code


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM ends the server as Ctrl-C does: cleanly


def run(args: argparse.Namespace) -> int:
    from reliable_cli.console.app import Settings, create_app, run_forever
    from reliable_cli.console.broker_view import BrokerView, ConsoleError
    from reliable_cli.console.database import OutboxView
    from reliable_cli.console.sampler import Sampler
    from reliable_cli.console.security import Authenticator, AuthSetupError, read_password

    if not 0 <= args.port <= 65535:
        return _fail("--port must be 0..65535")
    if not 0.5 <= args.sample_interval <= 300:
        return _fail("--sample-interval must be 0.5..300 seconds")
    secret = os.environ.get("RELIABLE_SECRET_KEY", "")
    if args.secret_key_file is not None:
        try:
            secret = args.secret_key_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            return _fail(f"--secret-key-file {args.secret_key_file}: {exc.strerror}")
    if args.access_key and not secret:
        return _fail("--access-key needs --secret-key-file (or RELIABLE_SECRET_KEY)")
    view = BrokerView(
        args.endpoint,
        access_key=args.access_key,
        secret_key=secret,
        tls=args.tls,
        ca_file=args.ca_file,
    )
    try:
        if args.password_file is not None:
            auth = Authenticator("password", password=read_password(args.password_file))
        elif args.no_auth:
            if args.host not in ("127.0.0.1", "::1", "localhost") or args.allow_actions:
                return _fail("--no-auth only for a read-only console on 127.0.0.1")
            auth = Authenticator("none")
        elif args.access_key:
            auth = Authenticator("broker-key", broker_check=view.credentials_accepted)
        else:
            return _fail(
                "give --password-file, or --access-key/--secret-key-file (users "
                "then log in with a key the broker accepts), or --no-auth"
            )
    except AuthSetupError as exc:
        return _fail(str(exc))
    outbox = None
    try:
        if args.db:
            outbox = OutboxView(
                args.db, prefix=args.prefix, schema=args.schema, report=args.report_table
            )
    except ConsoleError as exc:
        return _fail(str(exc))
    settings = Settings(
        endpoint=args.endpoint,
        auth=auth,
        allow_actions=args.allow_actions,
        sample_interval_s=args.sample_interval,
        db_url=args.db,
        table_prefix=args.prefix,
        schema=args.schema,
    )
    sampler = Sampler(view, interval_s=args.sample_interval)
    app = create_app(settings, view, sampler, outbox)
    signal.signal(signal.SIGTERM, _interrupt)
    sampler.start()
    endpoint = _start_endpoint(args, view)

    notice = observe.stderr_notice(PROG, args)

    def ready(port: int) -> None:
        mode = "actions enabled" if args.allow_actions else "read-only"
        notice(
            f"serving http://{args.host}:{port}/ ({mode}, login: {auth.mode}) "
            f"for broker {args.endpoint}"
        )

    try:
        run_forever(app, args.host, args.port, threads=args.threads, ready=ready)
    except OSError as exc:
        return _fail(
            f"cannot listen on {args.host}:{args.port}: {exc.strerror}", ExitCode.UNAVAILABLE
        )
    except KeyboardInterrupt:
        pass
    finally:
        sampler.stop()
        if endpoint is not None:
            endpoint.stop()
        view.close()
        if outbox is not None:
            outbox.close()
    return ExitCode.OK


def _start_endpoint(args: argparse.Namespace, view: BrokerView) -> MetricsEndpoint | None:
    """`--metrics-port`: /metrics (the process's own families), /healthz, and /readyz,
    ready while the broker answers the admin service."""
    if args.metrics_port is None:
        return None
    from prometheus_client import CollectorRegistry

    from reliable.endpoint import check

    broker = check(lambda: view.call("ListTopics"))
    return observe.start_endpoint(args, PROG, CollectorRegistry(), lambda: {"broker": broker()})
