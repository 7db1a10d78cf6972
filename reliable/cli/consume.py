"""`reliable consume TARGET...`: run declared handlers until SIGTERM/SIGINT.

A target is `module:attr` naming a handler (or a list of handlers), or `module` alone for
every handler declared at the module's top level. Shutdown is graceful: running handlers
finish, offsets are committed, the consumers leave their groups, exit code 0.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Iterable
from typing import Any

from reliable.cli.exit_codes import ExitCode
from reliable.cli.store_options import add_disk_arguments, disk_options

log = logging.getLogger("reliable.consume")


class TargetError(Exception):
    """A target could not be loaded or names no handler."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "consume", help="run declared handlers (module:attr) until SIGTERM",
        description="Run the handlers declared with @handler / @dlq_handler. TARGET is "
                    "module:attr (a handler or a list of handlers) or a module (all of its "
                    "handlers). SIGTERM/SIGINT stop gracefully: running handlers finish and "
                    "offsets are committed.")
    p.add_argument("targets", nargs="+", metavar="TARGET", help="module:attr or module")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--store", metavar="DIR",
                       help="embedded transport: the broker's store directory "
                            "(default ~/.reliable/store)")
    where.add_argument("--endpoint", metavar="HOST:PORT",
                       help="grpc transport: a RocketMQ 5 gRPC endpoint")
    p.add_argument("--delay-levels", metavar="TABLE",
                   help="embedded: delay level table, e.g. '1s 5s 10s' (default RocketMQ's)")
    p.add_argument("--flush", choices=("sync", "async"), default=None,
                   help="embedded: acknowledge after fsync (sync) or the page cache (async, "
                        "default)")
    p.add_argument("--commitlog-file-size", type=int, default=None, metavar="BYTES",
                   help="embedded: size of each commitlog file (must match the store's)")
    add_disk_arguments(p)
    p.set_defaults(handler=_consume)


def load_handlers(targets: Iterable[str]) -> list[Any]:
    from reliable.decorators import Handler

    found: list[Handler] = []
    for target in targets:
        module_name, _, attr = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise TargetError(f"{target}: cannot import {module_name!r}: {exc}") from exc
        if attr:
            try:
                obj = getattr(module, attr)
            except AttributeError:
                raise TargetError(f"{target}: {module_name} has no {attr!r}") from None
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


def _consume(args: argparse.Namespace) -> int:
    from reliable.errors import ReliableError
    from reliable.worker import Worker

    try:
        handlers = load_handlers(args.targets)
    except TargetError as exc:
        print(f"reliable consume: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    options: dict[str, Any] = {}
    if args.endpoint:
        if (args.delay_levels or args.flush or args.commitlog_file_size
                or args.disk_clean_ratio is not None or args.disk_full_ratio is not None):
            print("reliable consume: --delay-levels, --flush, --commitlog-file-size and the "
                  "--disk ratios apply to the embedded transport only", file=sys.stderr)
            return ExitCode.USAGE
        transport, options["endpoint"] = "grpc", args.endpoint
    else:
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
    try:
        worker = Worker(*handlers, transport=transport, **options)
        log.info("consuming with %d handler(s): %s", len(handlers),
                 ", ".join(f"{h.topic}/{h.group}" for h in handlers))
        worker.run()
    except ReliableError as exc:
        print(f"reliable consume: {exc}", file=sys.stderr)
        return ExitCode.FAILURE
    return ExitCode.OK
