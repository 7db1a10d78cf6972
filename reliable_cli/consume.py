"""`reliable consume TARGET...`: run declared handlers until SIGTERM/SIGINT.

A target is `module:attr` naming a handler (or a list of handlers), or `module` alone for
every handler declared at the module's top level, imported from the working directory
first. Once consuming, one line on stdout says what and from where. A broker that is not up
yet (`--endpoint`) is waited for with backoff (0.5 s doubling to 5 s, each try on stderr).
Shutdown is graceful: running handlers finish, offsets are committed, the consumers leave
their groups, exit code 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from broker.config import DEFAULT_PORT, with_default_port
from reliable_cli import observe
from reliable_cli.errors import TargetError
from reliable_cli.exit_codes import ExitCode
from reliable_cli.store_options import add_disk_arguments, disk_options
from reliable_cli.targets import resolve

if TYPE_CHECKING:
    from reliable.decorators import Handler
    from reliable.endpoint import MetricsEndpoint
    from reliable.worker import Worker
    from reliable_cli import Subparsers

log = logging.getLogger("reliable.consume")

# waiting for a broker that is not up yet: 0.5 s, doubling, at most 5 s between tries
WAIT_FIRST_S = 0.5
WAIT_MAX_S = 5.0


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "consume",
        help="run declared handlers (module:attr) until SIGTERM",
        description="Run the handlers declared with @handler / @dlq_handler. TARGET is "
        "module:attr (a handler or a list of handlers) or a module (all of its "
        "handlers), imported from the working directory first. With --endpoint, "
        "a broker that is not up yet is waited for with backoff. SIGTERM/SIGINT "
        "stop gracefully: running handlers finish and offsets are committed.",
    )
    p.add_argument("targets", nargs="+", metavar="TARGET", help="module:attr or module")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--store",
        metavar="DIR",
        help="embedded transport: the broker's store directory (default ~/.reliable/store)",
    )
    where.add_argument(
        "--endpoint",
        type=with_default_port,
        metavar="HOST:PORT",
        help=f"grpc transport: a RocketMQ 5 gRPC endpoint (the port defaults to {DEFAULT_PORT})",
    )
    p.add_argument(
        "--wire",
        choices=("native", "grpc"),
        default=None,
        help="with --endpoint: the unary calls over the server's native wire when it offers "
        "one (native), or always over gRPC (default: $RELIABLE_WIRE, else native; "
        "docs/wire.md)",
    )
    p.add_argument(
        "--delay-levels",
        metavar="TABLE",
        help="embedded: delay level table, e.g. '1s 5s 10s' (default RocketMQ's)",
    )
    p.add_argument(
        "--flush",
        choices=("sync", "async"),
        default=None,
        help="embedded: acknowledge after fsync (sync) or the page cache (async, default)",
    )
    p.add_argument(
        "--commitlog-file-size",
        type=int,
        default=None,
        metavar="BYTES",
        help="embedded: size of each commitlog file of a new store (an existing "
        "store keeps its own)",
    )
    add_disk_arguments(p)
    observe.add_arguments(p)
    p.set_defaults(handler=_consume)


def load_handlers(targets: Iterable[str]) -> list[Handler]:
    from reliable.decorators import Handler
    from reliable.errors import ConfigurationError

    found: list[Handler] = []
    for target in targets:
        attr = target.partition(":")[2]
        try:
            module, obj = resolve(target, attr_required=False)
        except ConfigurationError as exc:  # a handler declared with bad options
            raise TargetError(f"{target}: {exc}") from exc
        if attr:
            items = obj if isinstance(obj, list | tuple | set) else [obj]
        else:
            items = list(vars(module).values())
        handlers = [h for h in items if isinstance(h, Handler)]
        if attr and len(handlers) != len(items):
            raise TargetError(f"{target}: not a declared handler (use @handler)")
        if not handlers:
            raise TargetError(f"{target}: no handlers declared there")
        found.extend(h for h in handlers if h not in found)
    return found


def _where(args: argparse.Namespace) -> str:
    if args.endpoint:
        return f"broker {args.endpoint} (grpc)"
    from broker.store.config import default_store_dir

    return f"store {args.store or default_store_dir()} (embedded)"


def _consume(args: argparse.Namespace) -> int:
    from reliable.errors import ReliableError

    try:
        handlers = load_handlers(args.targets)
    except TargetError as exc:
        print(f"reliable consume: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    options: dict[str, Any] = {}
    if args.endpoint:
        if (
            args.delay_levels
            or args.flush
            or args.commitlog_file_size
            or args.disk_clean_ratio is not None
            or args.disk_full_ratio is not None
        ):
            print(
                "reliable consume: --delay-levels, --flush, --commitlog-file-size and the "
                "--disk ratios apply to the embedded transport only",
                file=sys.stderr,
            )
            return ExitCode.USAGE
        transport, options["endpoint"] = "grpc", args.endpoint
        if args.wire:
            options["wire"] = args.wire
    else:
        if args.wire:
            print("reliable consume: --wire applies to --endpoint only", file=sys.stderr)
            return ExitCode.USAGE
        transport = "embedded"
        if args.store:
            options["store_dir"] = args.store
        if args.delay_levels:
            options["delay_levels"] = args.delay_levels
        if args.flush:
            from broker.store.config import FlushMode

            options["flush_mode"] = FlushMode(args.flush)
        if args.commitlog_file_size:
            options["mapped_file_size_commitlog"] = args.commitlog_file_size
        try:
            options.update(disk_options(args))
        except ValueError as exc:
            print(f"reliable consume: {exc}", file=sys.stderr)
            return ExitCode.USAGE
    stop = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: shutting down", signum)
        stop.set()

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    started: list[Any] = []  # the worker, once consuming (read by /readyz)
    try:
        endpoint = _metrics_endpoint(args, handlers, started, stop)
    except OSError as exc:
        print(
            f"reliable consume: cannot serve metrics on {args.metrics_host}:"
            f"{args.metrics_port}: {exc}",
            file=sys.stderr,
        )
        return ExitCode.UNAVAILABLE
    try:
        worker = _start(
            handlers,
            transport,
            options,
            stop,
            _where(args),
            say=observe.stderr_notice("reliable consume", args),
        )
        if worker is None:
            return ExitCode.OK  # stopped while waiting for the broker
        started.append(worker)
        try:
            names = ", ".join(f"{h.topic} as {h.group}" for h in handlers)
            print(f"reliable consume: consuming {names} from {_where(args)}", flush=True)
            stop.wait()
        finally:
            started.clear()
            worker.shutdown()
    except ReliableError as exc:
        print(f"reliable consume: {exc}", file=sys.stderr)
        return ExitCode.FAILURE
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if endpoint is not None:
            endpoint.stop()
    return ExitCode.OK


def _metrics_endpoint(
    args: argparse.Namespace, handlers: list[Handler], started: list[Any], stop: threading.Event
) -> MetricsEndpoint | None:
    """/metrics: handlers and guards (and the embedded broker's own metrics); /readyz:
    consuming, and the broker serving (its gRPC health service, or the embedded broker
    running)."""
    if args.metrics_port is None:
        return None
    from prometheus_client import CollectorRegistry

    from broker.metrics import BrokerCollector
    from reliable.metrics import ClientCollector, handler_guards

    registry = CollectorRegistry()
    registry.register(ClientCollector(guards=handler_guards(handlers)))
    probe = observe.BrokerProbe(args.endpoint) if args.endpoint else None
    if probe is None:  # embedded: the broker lives in this process; export it too
        registry.register(BrokerCollector(lambda: started[0].transport.broker if started else None))

    def ready() -> dict[str, bool]:
        consuming = bool(started) and not stop.is_set()
        if probe is not None:
            return {"consuming": consuming, "broker": probe()}
        broker = started[0].transport.broker if started else None
        return {"consuming": consuming, "broker": broker is not None and broker.running}

    return observe.start_endpoint(args, "reliable consume", registry, ready)


def _start(
    handlers: list[Handler],
    transport: str,
    options: dict[str, Any],
    stop: threading.Event,
    where: str,
    *,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> Worker | None:
    """A started Worker; waits for an unreachable broker with backoff, as a running
    consumer does, saying so on stderr. None when stopped while waiting."""
    from reliable.errors import BrokerUnavailable, TransportError
    from reliable.transport import connect
    from reliable.worker import Worker

    delay = WAIT_FIRST_S
    while not stop.is_set():
        worker = Worker(*handlers, transport=transport, **options)
        try:
            if transport == "grpc":  # a quick probe: starting consumers waits for settings
                probe = connect(transport, **options)
                probe.start()
                try:
                    probe.route(handlers[0].topic)
                finally:
                    probe.close()
            return worker.start()
        except (TransportError, BrokerUnavailable) as exc:
            worker.shutdown()
            worker.transport.close()
            say(f"waiting for {where}: {exc}; retrying in {delay:.1f} s")
        if stop.wait(delay):
            break
        delay = min(delay * 2, WAIT_MAX_S)
    return None
