"""`reliable admin`: topics and groups, like mqadmin's updateTopic / updateSubGroup /
topicList / consumerProgress.

Against a running broker (`--endpoint HOST:PORT`, the admin service on the server's port) or
a stopped store (`--store DIR`; refused while the store's abort file says a broker runs on it).

Examples:
    reliable admin topic create orders --queues 8 --type FIFO --endpoint 127.0.0.1:8081
    reliable admin group create billing --fifo --max-retries 5 --store ./store
    reliable admin group show billing --topic orders --endpoint 127.0.0.1:8081 --json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.config import DEFAULT_PORT, with_default_port
from broker.topic import PERM_READ_WRITE
from protocol.limits import DEFAULT_QUEUE_NUMS, DEFAULT_RETRY_MAX_TIMES
from reliable.admin_messages import AdminCaller
from reliable_cli.admin_call import PROG, CommandFailed, check_stopped_store, handler
from reliable_cli.exit_codes import ExitCode

if TYPE_CHECKING:
    from reliable_cli import Subparsers

TOPIC_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")


def _target(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--endpoint",
        type=with_default_port,
        metavar="HOST:PORT",
        help=f"a running broker's address (the port defaults to {DEFAULT_PORT})",
    )
    where.add_argument("--store", type=Path, help="a stopped broker's store directory")
    p.add_argument(
        "--force",
        action="store_true",
        help="with --store: open it even though its abort file is present "
        "(only when no broker runs on it)",
    )
    p.add_argument("--tls", action="store_true", help="with --endpoint: connect over TLS")
    p.add_argument("--ca-file", default=None, help="with --tls: PEM roots to trust")
    p.add_argument("--access-key", default="", help="access key, when the broker has auth on")
    p.add_argument("--secret-key", default="", help="secret key for --access-key")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "admin",
        help="administer topics and groups",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    nouns = p.add_subparsers(dest="admin_noun", metavar="<topic|group|store|message|dlq|broker>")
    topic = nouns.add_parser("topic", help="create, list and show topics")
    tverbs = topic.add_subparsers(dest="verb", metavar="<create|list|show|status|delete>")
    c = tverbs.add_parser("create", help="create or update a topic (mqadmin updateTopic)")
    c.add_argument("name")
    c.add_argument(
        "--queues",
        type=int,
        default=DEFAULT_QUEUE_NUMS,
        help=f"read and write queues (default {DEFAULT_QUEUE_NUMS})",
    )
    c.add_argument(
        "--type",
        choices=TOPIC_TYPES,
        default="NORMAL",
        type=str.upper,
        help="message type the topic accepts (default NORMAL; MIXED: any)",
    )
    c.add_argument(
        "--perm",
        type=int,
        default=PERM_READ_WRITE,
        help=f"permission bits: 2 write, 4 read, 6 both (default {PERM_READ_WRITE})",
    )
    _target(c)
    c.set_defaults(
        handler=_run(
            "CreateTopic",
            lambda a: {"name": a.name, "queues": a.queues, "type": a.type, "perm": a.perm},
        )
    )
    ls = tverbs.add_parser("list", help="list topics (mqadmin topicList)")
    _target(ls)
    ls.set_defaults(handler=_run("ListTopics", lambda a: {}))
    sh = tverbs.add_parser("show", help="one topic with its queues' offsets")
    sh.add_argument("name")
    _target(sh)
    sh.set_defaults(handler=_run("GetTopic", lambda a: {"name": a.name}))

    group = nouns.add_parser("group", help="create, list and show consumer groups")
    gverbs = group.add_subparsers(dest="verb", metavar="<create|list|show|reset-offset|delete>")
    gc = gverbs.add_parser("create", help="create or update a group (mqadmin updateSubGroup)")
    gc.add_argument("name")
    gc.add_argument("--fifo", action="store_true", help="consume in order per message group")
    gc.add_argument(
        "--max-retries",
        type=int,
        default=DEFAULT_RETRY_MAX_TIMES,
        help=f"redeliveries before the dead-letter queue (default {DEFAULT_RETRY_MAX_TIMES})",
    )
    _target(gc)
    gc.set_defaults(
        handler=_run(
            "CreateGroup", lambda a: {"name": a.name, "fifo": a.fifo, "max_retries": a.max_retries}
        )
    )
    gl = gverbs.add_parser("list", help="list groups")
    _target(gl)
    gl.set_defaults(handler=_run("ListGroups", lambda a: {}))
    store = _register_store(nouns)
    broker = nouns.add_parser("broker", help="a broker's replication role and lag")
    bverbs = broker.add_subparsers(dest="verb", metavar="<status|promote>")
    bs = bverbs.add_parser(
        "status",
        help="replication: role, commitlog end, each slave's acknowledged offset "
        "and lag in bytes (docs/ha.md)",
    )
    _target(bs)
    bs.set_defaults(handler=_run("HaStatus", lambda a: {}))
    bp = bverbs.add_parser(
        "promote",
        help="turn a running, caught-up slave whose master is gone into the master of "
        "its group (docs/ha.md)",
        description="Promote a running slave to master without a restart: it takes "
        "writes, starts its write services and listens for slaves on its --ha-port. "
        "Refused when it lacks bytes its master had, or while its master is connected "
        "and alive (--force skips both checks). Exit code 1 when refused.",
    )
    bp.add_argument(
        "--endpoint",
        type=with_default_port,
        metavar="HOST:PORT",
        required=True,
        help=f"the slave's address (the port defaults to {DEFAULT_PORT})",
    )
    bp.add_argument(
        "--sync", action="store_true", help="become a sync-master (default: async-master)"
    )
    bp.add_argument(
        "--force",
        action="store_true",
        help="promote even when not caught up or while its master seems alive",
    )
    bp.add_argument("--tls", action="store_true", help="connect over TLS")
    bp.add_argument("--ca-file", default=None, help="with --tls: PEM roots to trust")
    bp.add_argument("--access-key", default="", help="access key, when the broker has auth on")
    bp.add_argument("--secret-key", default="", help="secret key for --access-key")
    bp.add_argument("--json", action="store_true", help="print JSON instead of lines")
    bp.set_defaults(handler=handler(_promote), store=None)
    from reliable_cli.admin_message import register as register_messages
    from reliable_cli.admin_ops import register as register_ops

    message = register_messages(nouns, tverbs, _target)
    dlq = register_ops(nouns, tverbs, gverbs, _target)
    for parser in (p, topic, group, store, message, dlq, broker):
        parser.set_defaults(
            handler=lambda _a, parser=parser: (parser.print_help(sys.stderr), ExitCode.USAGE)[1]
        )


def _register_store(nouns: Subparsers) -> argparse.ArgumentParser:
    """`reliable admin store verify --store DIR [--json]`."""
    store: argparse.ArgumentParser = nouns.add_parser("store", help="check a stopped store's files")
    verbs = store.add_subparsers(dest="verb", metavar="<verify>")
    v = verbs.add_parser(
        "verify",
        help="check every file of a stopped store; exit 1 when anything is damaged",
        description="Read every file of a stopped store (commitlog records and checksums, "
        "consume-queue units against the commitlog, index entries, config "
        "files, checkpoint) and print one line per problem: the file, the byte "
        "offset in it and what is wrong. Nothing is changed. Exit code 0: no "
        "problem; 1: problems found; 2: not a store directory.",
    )
    v.add_argument("--store", type=Path, required=True, help="the store directory")
    v.add_argument("--json", action="store_true", help="print one JSON object")
    v.set_defaults(handler=_verify_store)
    return store


def _verify_store(args: argparse.Namespace) -> int:
    from broker.config_files import config_file_parsers
    from broker.store.config import StoreConfig
    from broker.store.verify import iter_lines, verify_store

    store_dir: Path = args.store
    try:
        running = check_stopped_store(store_dir, force=True)  # reading files only
    except CommandFailed as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exc.exit_code
    if running:
        print(
            f"reliable admin: {store_dir}: abort file present: a broker runs on it or "
            "crashed; files still being written may be reported",
            file=sys.stderr,
        )
    report = verify_store(StoreConfig(store_dir=store_dir), config_file_parsers())
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        for line in iter_lines(report):
            print(line)
    return ExitCode.OK if report.ok else ExitCode.FAILURE


def _promote(args: argparse.Namespace, admin: AdminCaller) -> int:
    """`admin broker promote`: the refusal's reason on stderr, or before/after."""
    result = admin.call("PromoteBroker", sync=args.sync, force=args.force)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return ExitCode.OK
    before, after = result["before"], result["after"]
    print(
        f"before: {before['role']} of {before.get('master')}  max_offset={before['max_offset']}"
        f"  master_max_offset={before.get('master_max_offset')}"
        f"  lag_bytes={before.get('lag_bytes')}"
    )
    print(
        f"after:  {after['role']} {after['broker_name']}  max_offset={after['max_offset']}"
        f"  epoch={result['epoch'][0]} from {result['epoch'][1]}  ha_port={after['ha_port']}"
        + ("  (forced)" if result.get("forced") else "")
    )
    return ExitCode.OK


def _run(
    method: str, params: Callable[[argparse.Namespace], dict[str, object]]
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace, admin: AdminCaller) -> int:
        _print(admin.call(method, **params(args)), args.json)
        return ExitCode.OK

    return handler(run)


def _print(result: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return
    rows: list[dict[str, Any]]
    if isinstance(result, dict) and ("topics" in result or "groups" in result):
        rows = list(result.get("topics") or result.get("groups") or [])
    else:
        rows = [result]
    for row in rows:
        flat = {k: v for k, v in row.items() if not isinstance(v, (list, dict))}
        print("  ".join(f"{k}={v}" for k, v in flat.items()))
        for key, value in row.items():
            if isinstance(value, list):
                print(
                    f"  {key}: "
                    + (
                        ", ".join(map(str, value))
                        if value and not isinstance(value[0], dict)
                        else ""
                    )
                )
                for item in value:
                    if isinstance(item, dict):
                        print("    " + "  ".join(f"{k}={v}" for k, v in item.items()))
            elif isinstance(value, dict):
                print(f"  {key}:")
                for item in value.get("queues", []):
                    print("    " + "  ".join(f"{k}={v}" for k, v in item.items()))
