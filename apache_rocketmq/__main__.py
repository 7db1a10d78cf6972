"""`python -m apache_rocketmq start|stop|status|run|topic|group`: Apache RocketMQ 5 locally.

    start    start a name server and a proxy (its broker embedded) in the background;
             prints the gRPC endpoint on stdout
    stop     stop them and delete the store
    status   the endpoint, the processes and their memory; exit 3 when not running
    run      start, wait for Ctrl-C, stop
    topic    create a topic:  topic NAME [--type NORMAL|FIFO|DELAY|TRANSACTION|MIXED]
    group    create a consumer group:  group NAME [--orderly]

The cluster's files (store, configuration, logs) are under --dir, by default
$TMPDIR/reliable-rocketmq. Exit codes: 0 done, 1 failed, 2 bad usage, 3 not running.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from apache_rocketmq.admin import AdminError, MessageType
from apache_rocketmq.cluster import ClusterError, NotStarted, RocketMQCluster
from apache_rocketmq.runtime import RuntimeUnavailable

NOT_RUNNING = 3


def default_dir() -> Path:
    return Path(os.environ.get("TMPDIR", tempfile.gettempdir())) / "reliable-rocketmq"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m apache_rocketmq",
        description="Apache RocketMQ 5 (name server, broker, proxy) on this machine.",
    )
    parser.add_argument("--dir", type=Path, default=default_dir(), help="the cluster's files")
    verbs = parser.add_subparsers(dest="verb", required=True)
    for verb, text in (("start", "start in the background"), ("run", "start; stop on Ctrl-C")):
        sub = verbs.add_parser(verb, help=text)
        sub.add_argument("--grpc-port", type=int, default=0, help="default: a free port")
    verbs.add_parser("stop", help="stop and delete the store")
    verbs.add_parser("status", help="endpoint, processes, memory")
    topic = verbs.add_parser("topic", help="create a topic")
    topic.add_argument("name")
    topic.add_argument("--type", choices=[t.value for t in MessageType], default="NORMAL")
    topic.add_argument("--queues", type=int, default=4)
    group = verbs.add_parser("group", help="create a consumer group")
    group.add_argument("name")
    group.add_argument("--orderly", action="store_true", help="FIFO delivery for this group")
    return parser


def _describe(cluster: RocketMQCluster) -> str:
    alive, rss = cluster.running(), cluster.rss_bytes()
    procs = ", ".join(
        f"{name} pid {pid} {'up' if alive[name] else 'DOWN'} {rss[name] // 2**20} MiB"
        for name, pid in cluster.pids.items()
    )
    return (
        f"Apache RocketMQ {cluster.version} at {cluster.endpoint} ({procs}); "
        f"files in {cluster.directory}"
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    directory: Path = args.dir
    try:
        if args.verb in ("start", "run"):
            try:
                old = RocketMQCluster.from_state(directory)
            except NotStarted:
                old = None
            if old is not None and all(old.running().values()):
                print(f"already running: {_describe(old)}", file=sys.stderr)
                print(old.endpoint)
                return 0
            started = time.monotonic()
            cluster = RocketMQCluster.start(directory, grpc_port=args.grpc_port)
            print(
                f"started in {time.monotonic() - started:.1f} s: {_describe(cluster)}",
                file=sys.stderr,
            )
            print(cluster.endpoint, flush=True)
            if args.verb == "run":
                signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
                try:
                    while all(cluster.running().values()):
                        time.sleep(1)
                    print("a process of the cluster ended", file=sys.stderr)
                except KeyboardInterrupt:
                    pass
                finally:
                    cluster.stop()
            return 0
        cluster = RocketMQCluster.from_state(directory)
        if args.verb == "stop":
            cluster.stop()
            print(f"stopped; logs in {directory / 'logs'}", file=sys.stderr)
        elif args.verb == "status":
            print(_describe(cluster))
            return 0 if all(cluster.running().values()) else NOT_RUNNING
        elif args.verb == "topic":
            cluster.create_topic(args.name, MessageType(args.type), queues=args.queues)
        elif args.verb == "group":
            cluster.create_group(args.name, orderly=args.orderly)
        return 0
    except NotStarted as exc:
        print(f"rocketmq: {exc}", file=sys.stderr)
        return NOT_RUNNING
    except (ClusterError, RuntimeUnavailable, AdminError) as exc:
        print(f"rocketmq: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
