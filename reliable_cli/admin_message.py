"""`reliable admin message query|trace|send|reconsume` and `reliable admin topic status`:
find any stored message, follow it, send one, deliver one to a group again (mqadmin's
queryMsgById / queryMsgByKey / queryMsgByUniqueKey / queryMsgByOffset, sendMessage,
consumeMessage, topicStatus).

Every command runs against a running broker (`--endpoint HOST:PORT`) or a stopped store
(`--store DIR`) with the same output, a table for people or one JSON document (`--json`).

Exit codes: 0 found / done; 1 nothing found (or the broker refused); 2 bad command line or
a malformed argument (an id that cannot be one, a bad time); 4 the broker is unreachable.

Examples:
    reliable admin message query --key order-42 --topic orders --endpoint 127.0.0.1:8081
    reliable admin message query --id 7F00000100002A9F0000000000000000 --store ./store --body
    reliable admin message query --topic orders --since 2026-11-23T10:00Z --until 1h --json
    reliable admin message trace order-42 --endpoint 127.0.0.1:8081 --db postgresql://...
    reliable admin message send orders '{"order": 42}' --key order-42 --tag created
    reliable admin message reconsume 0A0B0C0D... --group billing --endpoint 127.0.0.1:8081
    reliable admin message reconsume 0A0B0C0D... --group billing --client host@123@0@ab12@billing
    reliable admin topic status orders --endpoint 127.0.0.1:8081
"""

from __future__ import annotations

import argparse
import getpass
import re
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from reliable import admin_messages as api
from reliable_cli.admin_call import PROG, CommandFailed, print_json, table
from reliable_cli.admin_call import handler as _handler
from reliable_cli.admin_trace import run_trace
from reliable_cli.exit_codes import ExitCode

if TYPE_CHECKING:
    from reliable_cli import Subparsers

_RELATIVE = re.compile(r"^(\d+)([smhd])$")
_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


# ---------------------------------------------------------------------- command line
def register(
    nouns: Subparsers, topic_verbs: Subparsers, target: Callable[[argparse.ArgumentParser], None]
) -> argparse.ArgumentParser:
    """Add the `message` noun and `topic status`; returns the `message` parser. `target`
    adds the options every admin command takes (`--endpoint`/`--store`, `--json`, ...)."""
    message: argparse.ArgumentParser = nouns.add_parser(
        "message",
        help="find, trace, send and reconsume messages",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = message.add_subparsers(dest="verb", metavar="<query|trace|send|reconsume>")
    _add_query(verbs, target)
    _add_trace(verbs, target)
    _add_send(verbs, target)
    _add_reconsume(verbs, target)
    _add_topic_status(topic_verbs, target)
    return message


def _add_query(verbs: Subparsers, target: Callable[[argparse.ArgumentParser], None]) -> None:
    """`message query`: find messages by id, key, unique key, queue offset or time."""
    q = verbs.add_parser(
        "query",
        help="find messages by id, key, unique key, queue offset or time",
        description="Find stored messages, newest first, at most --limit of them (a line "
        "says when more match). One form: --id (offset message id or client "
        "message id, in every topic unless --topic); --key or --unique-key with "
        "--topic; --topic --queue --offset; --topic with --since and/or --until. "
        "Keys are matched exactly (hash collisions are never returned). Exit 1 "
        "when nothing matches.",
    )
    form = q.add_mutually_exclusive_group()
    form.add_argument(
        "--id",
        dest="msg_id",
        metavar="ID",
        help="an offset message id or a client message id (both are tried)",
    )
    form.add_argument("--key", help="one of the messages' keys (needs --topic)")
    form.add_argument(
        "--unique-key", metavar="KEY", help="the client message id (UNIQ_KEY) (needs --topic)"
    )
    form.add_argument(
        "--offset", type=int, metavar="N", help="a queue offset (needs --topic and --queue)"
    )
    q.add_argument("--topic", help="the topic to look in")
    q.add_argument("--queue", type=int, metavar="Q", help="a queue id of --topic")
    q.add_argument(
        "--since",
        metavar="TIME",
        help="stored at or after TIME: ISO-8601 "
        "(UTC unless it has an offset), epoch milliseconds, or 30m/2h/1d ago",
    )
    q.add_argument("--until", metavar="TIME", help="stored at or before TIME (same forms)")
    q.add_argument(
        "--limit",
        type=int,
        default=32,
        help=f"at most this many messages (default 32, at most {api.MAX_LIMIT})",
    )
    q.add_argument(
        "--body",
        action="store_true",
        help="print bodies (as text when they decode as UTF-8, else hex)",
    )
    target(q)
    q.set_defaults(handler=_handler(_query))


def _add_trace(verbs: Subparsers, target: Callable[[argparse.ArgumentParser], None]) -> None:
    """`message trace`: one business message's records and deliveries, in time order."""
    t = verbs.add_parser(
        "trace",
        help="everything known about one business message, in time order",
        description="Follow one business message, named by a key, a client message id or "
        "an offset message id: every broker record (original, retry and "
        "schedule copies, dead letters, operator copies), per consumer group "
        "its deliveries, retries, acknowledgement or dead-lettering, and with "
        "--db the outbox stub and the consumption-log and confirmation rows. "
        "Exit 1 when nothing is known about it.",
    )
    t.add_argument("key_or_id", metavar="KEY_OR_ID")
    t.add_argument("--topic", help="the message's topic (default: look in every topic)")
    t.add_argument(
        "--db",
        metavar="URL",
        default=None,
        help="SQLAlchemy URL of the database holding the outbox tables",
    )
    t.add_argument("--table-prefix", default="reliable_", help="outbox table name prefix")
    t.add_argument("--schema", default=None, help="database schema of the outbox tables")
    t.add_argument("--limit", type=int, default=200, help="at most this many broker records")
    t.add_argument(
        "--scan",
        type=int,
        default=None,
        metavar="N",
        help="read at most N entries of the broker's invisible-time log "
        "(default 100,000; the output says when it stopped early)",
    )
    target(t)
    t.set_defaults(handler=_handler(_trace))


def _add_send(verbs: Subparsers, target: Callable[[argparse.ArgumentParser], None]) -> None:
    """`message send`: store one message as a producer would."""
    s = verbs.add_parser(
        "send",
        help="store one message (mqadmin sendMessage)",
        description="Send one message, as a producer would (a fresh client "
        "message id), and print its ids and offsets.",
    )
    s.add_argument("topic")
    s.add_argument("body", help="the body, as text (UTF-8)")
    s.add_argument(
        "--key", action="append", default=[], dest="keys", help="a key (repeat for several)"
    )
    s.add_argument("--tag", default=None)
    s.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        dest="properties",
        help="a user property (repeat for several)",
    )
    target(s)
    s.set_defaults(handler=_handler(_send))


def _add_reconsume(verbs: Subparsers, target: Callable[[argparse.ArgumentParser], None]) -> None:
    """`message reconsume`: deliver one stored message to a group again."""
    r = verbs.add_parser(
        "reconsume",
        help="deliver one stored message to a group again",
        description="Write a copy of the message to %%RETRY%%<group>, so that only GROUP "
        "receives it again (the copy keeps the client message id, and says "
        "OPERATOR_ACTION=reconsume and who did it). With --client (RocketMQ's "
        "CONSUME_MESSAGE_DIRECTLY) nothing is written: the running broker hands the "
        "message to that one live client of GROUP (client ids: reliable admin group "
        "show GROUP), whose listener runs on it once, and prints its verdict; nothing "
        "is acknowledged or retried. Exit 0 consumed, 1 the listener failed (or the "
        "client is not a live client of GROUP, or did not answer within --timeout).",
    )
    r.add_argument("msg_id", metavar="ID", help="offset message id or client message id")
    r.add_argument("--group", required=True, help="the consumer group to deliver it to")
    r.add_argument(
        "--topic", default=None, help="the original topic, if the id names messages in several"
    )
    r.add_argument(
        "--client",
        default=None,
        metavar="CLIENT_ID",
        help="deliver to this one client of GROUP and wait for its verdict (needs --endpoint)",
    )
    r.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="with --client: how long to wait for the client's verdict (default 5, at most 60)",
    )
    r.add_argument(
        "--operator",
        default=None,
        help="who does this, recorded on the copy (default: the login name)",
    )
    target(r)
    r.set_defaults(handler=_handler(_reconsume))


def _add_topic_status(
    topic_verbs: Subparsers, target: Callable[[argparse.ArgumentParser], None]
) -> None:
    """`topic status`: per queue, its offsets and last store time."""
    st = topic_verbs.add_parser(
        "status", help="per queue: min/max offset, last store time (mqadmin topicStatus)"
    )
    st.add_argument("name")
    target(st)
    st.set_defaults(handler=_handler(_topic_status))


def parse_time(value: str, *, now_ms: int | None = None) -> int:
    """Epoch ms from ISO-8601 (naive = UTC), epoch ms digits, or `30m`/`2h`/`1d` ago."""
    text = value.strip()
    if text.isdigit():
        return int(text)
    m = _RELATIVE.match(text)
    if m:
        now = now_ms if now_ms is not None else time.time_ns() // 1_000_000
        return now - int(m.group(1)) * _UNIT_MS[m.group(2)]
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise CommandFailed(
            f"{value!r} is not a time: use ISO-8601 (2026-11-23T10:00:00Z), "
            "epoch milliseconds, or 30m/2h/1d ago",
            ExitCode.USAGE,
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


# ---------------------------------------------------------------------- query
def _query(args: argparse.Namespace, admin: api.AdminCaller) -> int:
    if not 1 <= args.limit <= api.MAX_LIMIT:
        raise CommandFailed(f"--limit must be 1..{api.MAX_LIMIT}", ExitCode.USAGE)
    since = parse_time(args.since) if args.since else None
    until = parse_time(args.until) if args.until else None
    if (
        args.msg_id is None
        and args.key is None
        and args.unique_key is None
        and args.offset is None
        and (args.topic is None or (since is None and until is None))
    ):
        raise CommandFailed(
            "give --id, --key, --unique-key, --offset, or --topic with --since/--until",
            ExitCode.USAGE,
        )
    found = api.query_messages(
        admin,
        msg_id=args.msg_id,
        key=args.key,
        unique_key=args.unique_key,
        topic=args.topic,
        queue=args.queue,
        offset=args.offset,
        since_ms=since,
        until_ms=until,
        limit=args.limit,
        body=args.body,
    )
    messages = found["messages"]
    if args.json:
        print_json(found)
    else:
        for line in render_messages(messages, body=args.body):
            print(line)
        if found["more"]:
            print(
                f"(more messages match: only the newest {len(messages)} are shown; raise "
                "--limit or narrow the query)"
            )
    if not messages:
        if not args.json:
            print(f"{PROG}: no message found", file=sys.stderr)
        return ExitCode.FAILURE
    return ExitCode.OK


def render_messages(messages: list[dict[str, Any]], *, body: bool) -> list[str]:
    if not messages:
        return []
    lines = table(
        [
            (
                m["store_time"],
                m["topic"],
                m["queue_id"],
                m["queue_offset"],
                m["commitlog_offset"],
                m["offset_msg_id"],
                m["msg_id"],
                m["tags"],
                " ".join(m["keys"]),
                m["reconsume_times"],
                m["size"],
            )
            for m in messages
        ],
        (
            "STORE TIME",
            "TOPIC",
            "QUEUE",
            "OFFSET",
            "COMMITLOG",
            "OFFSET MSG ID",
            "MSG ID",
            "TAGS",
            "KEYS",
            "RECONSUMED",
            "SIZE",
        ),
    )
    for m in messages:
        lines.append("")
        lines.append(
            f"{m['offset_msg_id']}  ({m['topic']} queue {m['queue_id']} offset {m['queue_offset']})"
        )
        lines.append(f"  born        {m['born_time']} at {m['born_host']}")
        lines.append(f"  stored      {m['store_time']} at {m['store_host']}")
        lines.append(
            f"  body        {m['body_size']} bytes"
            + (f" ({m['body_encoding']}): {m['body']}" if body and "body" in m else "")
        )
        for i, (name, value) in enumerate(sorted(m["properties"].items())):
            lines.append(f"  {'properties' if i == 0 else '':<11} {name}={value}")
    return lines


# ---------------------------------------------------------------------- trace
def _trace(args: argparse.Namespace, admin: api.AdminCaller) -> int:
    return run_trace(args, admin)


# ---------------------------------------------------------------------- send / reconsume
def _send(args: argparse.Namespace, admin: api.AdminCaller) -> int:
    props: dict[str, str] = {}
    for item in args.properties:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CommandFailed(f"--property {item!r}: expected NAME=VALUE", ExitCode.USAGE)
        props[name] = value
    sent = api.send_message(
        admin, args.topic, args.body, keys=args.keys, tag=args.tag, properties=props
    )
    if args.json:
        print_json(sent)
    else:
        for line in table(
            [
                (
                    sent["msg_id"],
                    sent["offset_msg_id"],
                    sent["topic"],
                    sent["queue_id"],
                    sent["queue_offset"],
                    sent["commitlog_offset"],
                    sent["status"],
                )
            ],
            ("MSG ID", "OFFSET MSG ID", "TOPIC", "QUEUE", "OFFSET", "COMMITLOG", "STATUS"),
        ):
            print(line)
    return ExitCode.OK


def _reconsume(args: argparse.Namespace, admin: api.AdminCaller) -> int:
    operator = args.operator or _login()
    if args.client is not None:
        return _consume_directly(args, admin, operator)
    done = api.reconsume_message(
        admin, args.msg_id, args.group, topic=args.topic, operator=operator
    )
    if args.json:
        print_json(done)
    else:
        src, copy = done["source"], done["copy"]
        print(
            f"re-sent {done['msg_id']} ({src['topic']} queue {src['queue_id']} offset "
            f"{src['queue_offset']}) to group {done['group']}:"
        )
        for line in table(
            [
                (
                    copy["topic"],
                    copy["queue_id"],
                    copy["queue_offset"],
                    copy["commitlog_offset"],
                    copy["offset_msg_id"],
                )
            ],
            ("COPY IN", "QUEUE", "OFFSET", "COMMITLOG", "OFFSET MSG ID"),
        ):
            print(line)
    return ExitCode.OK


def _consume_directly(args: argparse.Namespace, admin: api.AdminCaller, operator: str) -> int:
    if not 0 < args.timeout <= 60:
        raise CommandFailed("--timeout must be more than 0 and at most 60 seconds", ExitCode.USAGE)
    done = api.consume_directly(
        admin,
        args.msg_id,
        args.group,
        args.client,
        topic=args.topic,
        timeout_ms=max(1, int(args.timeout * 1000)),
        operator=operator,
    )
    if args.json:
        print_json(done)
    else:
        src = done["source"]
        verdict = "consumed it" if done["consumed"] else "failed to consume it"
        print(
            f"delivered {done['msg_id']} ({src['topic']} queue {src['queue_id']} offset "
            f"{src['queue_offset']}) to client {done['client_id']} of group {done['group']}: "
            f"{verdict}"
        )
        for line in table(
            [
                (
                    done["client_id"],
                    "CONSUMED" if done["consumed"] else "FAILED",
                    done["status"],
                    done["message"],
                    done["elapsed_ms"],
                )
            ],
            ("CLIENT", "RESULT", "STATUS", "MESSAGE", "MS"),
        ):
            print(line)
    return ExitCode.OK if done["consumed"] else ExitCode.FAILURE


def _login() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


# ---------------------------------------------------------------------- topic status
def _topic_status(args: argparse.Namespace, admin: api.AdminCaller) -> int:
    status = api.topic_status(admin, args.name)
    if args.json:
        print_json(status)
        return ExitCode.OK
    print(
        f"topic {status['topic']}: {status['messages']} messages held, last stored "
        f"{status['last_store_time'] or 'never'}"
    )
    for line in table(
        [
            (
                q["queue_id"],
                q["min_offset"],
                q["max_offset"],
                q["messages"],
                q["first_store_time"],
                q["last_store_time"],
            )
            for q in status["queues"]
        ],
        ("QUEUE", "MIN OFFSET", "MAX OFFSET", "MESSAGES", "FIRST STORED", "LAST STORED"),
    ):
        print(line)
    return ExitCode.OK
