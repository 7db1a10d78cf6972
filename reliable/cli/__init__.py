"""The `reliable` command: `reliable <noun> <verb> [options]`.

Each noun lives in its own module under `reliable.cli` with a `register(subparsers)`
function; modules are imported when the command line is parsed, never at package import.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from reliable.cli.exit_codes import ExitCode

# noun modules, in the order `--help` lists them
_NOUNS = ("demo", "broker", "admin", "worker", "consume", "reconcile")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reliable",
        description="Reliable messaging: broker, outbox, idempotent consumers, reconciliation.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging on stderr (repeat for debug)")
    sub = parser.add_subparsers(dest="noun", metavar="<command>")
    for noun in _NOUNS:
        try:
            module = importlib.import_module(f"reliable.cli.{noun}")
        except ModuleNotFoundError as exc:
            if exc.name == f"reliable.cli.{noun}":
                continue  # that command is not part of this build
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return ExitCode.USAGE
    try:
        return int(handler(args))
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
