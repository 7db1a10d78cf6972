"""The `reliable` command: `reliable <noun> <verb> [options]`, the composition root.

This package sits above every other one: it builds brokers, transports, outbox workers,
idempotency guards and reconciliation jobs from command-line options, and nothing imports
it (see docs/architecture.md). Each noun lives in its own module with a
`register(subparsers)` function; modules are imported when the command line is parsed, never
at package import. `python -m reliable_cli` is the same command as `reliable`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, TypeAlias

import protocol  # noqa: F401  (gRPC's fork handlers off before grpc loads: see there)
from reliable_cli.exit_codes import ExitCode

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What `add_subparsers` returns: each command module's `register(subparsers)` adds its
parsers to it, and their verbs to the ones it makes."""

# noun -> its module, in the order `--help` lists them
_NOUNS = {
    "demo": "reliable_cli.demo.command",
    "broker": "reliable_cli.broker",
    "gateway": "reliable_cli.gateway",
    "admin": "reliable_cli.admin",
    "worker": "reliable_cli.worker",
    "outbox": "reliable_cli.outbox",
    "consume": "reliable_cli.consume",
    "reconcile": "reliable_cli.reconcile",
    "console": "reliable_cli.console.command",
}


def version() -> str:
    """The installed distribution's version (pyproject.toml)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("reliable")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from reliable import __version__

        return __version__


class _Version(argparse.Action):
    """`--version`: looked up only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(f"reliable {version()}")
        parser.exit()


def _noun_of(argv: Sequence[str]) -> str | None:
    """The command `argv` names, when its first word is one (options before it aside)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in _NOUNS else None
    return None


def build_parser(noun: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `noun`, that command's alone: a command imports what it
    needs (the broker's server, the demo's database drivers, ...) when registered, and
    `reliable broker start` after a crash should not wait for the imports of the others."""
    parser = argparse.ArgumentParser(
        prog="reliable",
        description="Reliable messaging: broker, outbox, idempotent consumers, reconciliation.",
    )
    parser.add_argument("--version", action=_Version)
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="more logging on stderr (repeat for debug)",
    )
    sub = parser.add_subparsers(dest="noun", metavar="<command>")
    for name in [_NOUNS[noun]] if noun is not None else _NOUNS.values():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # that command is not part of this build
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(_noun_of(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    if argv is None:  # the process's own command line: a deposed broker restarts with it
        args.argv = sys.argv[1:]
    level = logging.WARNING - 10 * min(args.verbose, 2)
    # --log-format belongs to the long-running commands (reliable_cli.observe)
    from reliable_cli.observe import configure_logging

    configure_logging(level, getattr(args, "log_format", "text"))
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return ExitCode.USAGE
    try:
        code = int(handler(args))
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the exit
        return code
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        # the reader went away (`reliable ... --json | head`): end quietly, and keep the
        # interpreter's own last flush from failing again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return ExitCode.OUTPUT_CLOSED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
