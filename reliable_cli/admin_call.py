"""Calling the admin service from a `reliable admin` command, and printing its answers.

`open_admin(args)` is the admin service of `--endpoint` (an `AdminClient`) or of a stopped
store opened in this process (`--store`, the same operations run here); a refused call
becomes `CommandFailed` with the exit code it means: a malformed argument (BAD_REQUEST and
the other ILLEGAL_* codes) is a usage error (2), anything else refused a failure (1), an
unreachable broker UNAVAILABLE (4).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reliable import admin_messages as api
from reliable_cli.errors import CommandError
from reliable_cli.exit_codes import ExitCode

if TYPE_CHECKING:
    from broker.broker import Broker

PROG = "reliable admin"
# protocol codes that mean "the arguments cannot name anything": a usage error
_USAGE_CODES = frozenset(
    {
        "BAD_REQUEST",
        "ILLEGAL_TOPIC",
        "ILLEGAL_CONSUMER_GROUP",
        "ILLEGAL_MESSAGE_ID",
        "ILLEGAL_MESSAGE_KEY",
        "NOT_IMPLEMENTED",
    }
)


class CommandFailed(CommandError):
    """A command ends with one line on stderr and an exit code."""

    def __init__(self, message: str, exit_code: ExitCode) -> None:
        self.exit_code = exit_code
        super().__init__(message)


def handler(
    run: Callable[[argparse.Namespace, api.AdminCaller], int],
) -> Callable[[argparse.Namespace], int]:
    """An argparse handler running `run(args, admin)` against the admin service the command
    line names; a CommandFailed is its one line on stderr and its exit code."""

    def handle(args: argparse.Namespace) -> int:
        try:
            with open_admin(args) as admin:
                return run(args, admin)
        except CommandFailed as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return exc.exit_code

    return handle


@contextlib.contextmanager
def open_admin(args: argparse.Namespace) -> Iterator[api.AdminCaller]:
    """The admin service of `--endpoint`, or of `--store` opened in this process; a failed
    call raises CommandFailed with the exit code it means."""
    from reliable.admin import AdminCallError

    try:
        if args.endpoint:
            yield from _remote(args)
        else:
            yield from _local(args)
    except AdminCallError as exc:
        code = exc.code
        raise CommandFailed(
            str(exc), ExitCode.USAGE if code in _USAGE_CODES else ExitCode.FAILURE
        ) from None


def _remote(args: argparse.Namespace) -> Iterator[api.AdminCaller]:
    import grpc

    from reliable.admin import AdminClient

    client = AdminClient(
        args.endpoint,
        tls=args.tls,
        ca_file=args.ca_file,
        access_key=args.access_key,
        secret_key=args.secret_key,
    )
    try:
        yield client
    except grpc.RpcError as exc:
        raise CommandFailed(
            f"{args.endpoint}: {exc.code().name}: {exc.details()}", ExitCode.UNAVAILABLE
        ) from None
    finally:
        client.close()


class _StoreAdmin:
    """The admin service's operations on a broker opened in this process."""

    def __init__(self, broker: Broker) -> None:
        from broker.server.admin import AdminOps

        self._ops = AdminOps(broker)

    def call(self, method: str, **params: object) -> Any:
        from broker.errors import BrokerError
        from broker.server.errors import ServerError
        from broker.server.status import code_of
        from broker.store.errors import StoreError
        from reliable.admin import AdminCallError

        try:
            return self._ops.call(method, params)
        except (ServerError, BrokerError, StoreError) as exc:
            raise AdminCallError(code_of(exc).name, str(exc)) from None


def check_stopped_store(store_dir: Path, *, force: bool) -> bool:
    """`store_dir` checked as a store to open without its broker: CommandFailed when it is
    not a store directory (USAGE), or when its abort file says a broker runs on it
    (FAILURE), unless `force` (the broker crashed). Whether the abort file is present."""
    if not (store_dir / "commitlog").is_dir():
        raise CommandFailed(f"{store_dir}: not a store directory (no commitlog/)", ExitCode.USAGE)
    running = (store_dir / "abort").exists()
    if running and not force:
        raise CommandFailed(
            f"{store_dir}: a broker seems to run on this store (abort file "
            "present); use --endpoint, or --force if it crashed",
            ExitCode.FAILURE,
        )
    return running


def _local(args: argparse.Namespace) -> Iterator[api.AdminCaller]:
    """The admin service on `--store`, opened in this process and closed after the call."""
    from broker.broker import Broker
    from broker.errors import BrokerError
    from broker.store.config import StoreConfig
    from broker.store.errors import StoreError

    store_dir: Path = args.store
    check_stopped_store(store_dir, force=args.force)
    try:
        broker = Broker(StoreConfig(store_dir=store_dir))
        broker.start()
    except (BrokerError, StoreError, OSError) as exc:
        raise CommandFailed(f"cannot open {store_dir}: {exc}", ExitCode.FAILURE) from None
    try:
        yield _StoreAdmin(broker)
    finally:
        broker.shutdown()


def print_json(doc: object) -> None:
    print(json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False))


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> list[str]:
    """Lines of columns padded to their widest cell; an empty cell shows as `-`."""
    cells = [[str(c) for c in header]] + [
        ["-" if c is None or c == "" else str(c) for c in row] for row in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
