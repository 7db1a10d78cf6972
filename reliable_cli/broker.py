"""`reliable broker start`: run the broker as an Apache RocketMQ 5 gRPC server.

Runs in the foreground until SIGTERM or Ctrl-C, then stops accepting calls, lets in-flight
calls finish, flushes and closes the store. Official RocketMQ 5 clients (and the framework's
`grpc` transport) connect to HOST:PORT. Once serving, one line goes to stdout:

    reliable broker: serving on HOST:PORT (store DIR, flush MODE)

The framework's clients send their unary calls over the native wire (framed TCP,
docs/wire.md) on a second port, a free one unless --wire-port names it (--wire-port off:
gRPC only); a line before the one above says

    reliable broker: native wire on HOST:PORT

Examples:
    reliable broker start --store /var/lib/reliable --port 8081 --flush sync
    reliable broker start --port 8443 --tls-cert server.pem --tls-key server.key \\
        --credentials-file access-keys.json
    reliable broker start --metrics-port 9100 --log-format json   # docs/observability.md
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reliable_cli import broker_replication as replication
from reliable_cli import observe
from reliable_cli.broker_options import add_start_arguments
from reliable_cli.errors import CommandError
from reliable_cli.exit_codes import ExitCode

if TYPE_CHECKING:
    from broker.broker import Broker
    from broker.config import BrokerConfig
    from broker.ha.config import HaConfig
    from broker.ha.failover import Failover
    from broker.ha.node import HaNode
    from broker.server import MessagingServer, ServerConfig
    from reliable.endpoint import MetricsEndpoint
    from reliable_cli import Subparsers

SWITCH_INTERVAL_S = 0.0005


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "broker",
        help="run the broker (RocketMQ 5 gRPC server)",
        description="Run the broker as a server.",
    )
    verbs = p.add_subparsers(dest="verb", metavar="<verb>")
    s = verbs.add_parser(
        "start",
        help="start the server in the foreground",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_start_arguments(s)
    observe.add_arguments(s)
    s.set_defaults(handler=start)

    def usage(_args: argparse.Namespace) -> int:
        p.print_help(sys.stderr)
        return ExitCode.USAGE

    p.set_defaults(handler=usage)


def _fail(message: str, code: ExitCode = ExitCode.USAGE) -> int:
    print(f"reliable broker: {message}", file=sys.stderr)
    return code


class _Refused(CommandError):
    """The broker cannot start as asked: the line for stderr, and the exit code."""

    def __init__(self, message: str, code: ExitCode = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class StartPlan:
    """What the options ask for, checked: the configuration of each part."""

    store_kwargs: dict[str, Any]  # StoreConfig's
    broker_kwargs: dict[str, Any]  # BrokerConfig's, validated when the broker is built
    server_config: ServerConfig
    ha_config: HaConfig


@dataclass
class _Running:
    """The started broker and what replicates it."""

    broker: Broker
    ha_config: HaConfig
    node: HaNode | None = None
    failover: Failover | None = None  # with --failover auto


def start(args: argparse.Namespace) -> int:
    """Check the options, build the broker and its replication, then serve until stopped."""
    try:
        plan = plan_start(args)
        broker, broker_config = _open_broker(args, plan)
        running = _replicate(args, plan, broker, broker_config)
    except _Refused as exc:
        return _fail(str(exc), exc.code)
    return _serve(args, plan, running)


def plan_start(args: argparse.Namespace) -> StartPlan:
    """Every part's configuration from the options (_Refused: a usage error)."""
    from broker.ha import HaRole

    _check_server_options(args)
    credentials = _credentials(args)
    store_kwargs = _store_kwargs(args)
    broker_kwargs: dict[str, Any] = {
        "auto_create_topic": not args.no_auto_create_topics,
        "auto_create_subscription_group": not args.no_auto_create_groups,
        "default_queue_nums": args.queues,
        "max_message_size": args.max_body_size,
        "transaction_timeout_ms": args.transaction_timeout_ms,
        "transaction_check_interval_ms": args.transaction_check_interval_ms,
    }
    if args.delay_levels:
        broker_kwargs["message_delay_level"] = args.delay_levels
    try:
        ha_config = replication.ha_config(args, credentials)
    except ValueError as exc:
        raise _Refused(str(exc)) from None
    if ha_config.role is HaRole.SLAVE:
        broker_kwargs["replica"] = True
    if args.ha_config_sync_ms < 100:
        raise _Refused("--ha-config-sync-ms must be at least 100")
    server_config = _server_config(args, ha_config, credentials)
    return StartPlan(store_kwargs, broker_kwargs, server_config, ha_config)


def _check_server_options(args: argparse.Namespace) -> None:
    """The server's options one by one, before anything is read or built."""
    from broker.idle_poll import check_max_us
    from broker.server.answers import check_batch, check_linger_ms

    if (args.tls_cert is None) != (args.tls_key is None):
        raise _Refused("--tls-cert and --tls-key go together")
    for name, value, least in (
        ("--max-inflight-sends", args.max_inflight_sends, 1),
        ("--min-send-time-ms", args.min_send_time_ms, 0),
        ("--max-concurrent-rpcs", args.max_concurrent_rpcs, 0),
        ("--max-concurrent-streams", args.max_concurrent_streams, 1),
        ("--max-pending-calls", args.max_pending_calls, 1),
    ):
        if value < least:
            raise _Refused(f"{name} must be at least {least}")
    if args.wire_port is not None and not 0 <= args.wire_port <= 65535:
        raise _Refused("--wire-port must be 0..65535")
    try:
        check_max_us(args.idle_poll_us)
    except ValueError as exc:
        raise _Refused(f"--idle-poll-us: {exc}") from None
    try:
        check_batch(args.answer_batch)
        check_linger_ms(args.answer_linger_ms)
    except ValueError as exc:
        raise _Refused(f"--answer-batch/--answer-linger-ms: {exc}") from None
    for path in (args.tls_cert, args.tls_key, args.credentials_file, args.ha_tls_ca):
        if path is not None and not path.is_file():
            raise _Refused(f"{path}: no such file")


def _credentials(args: argparse.Namespace) -> dict[str, str]:
    """--credentials-file's access keys (none: authentication off)."""
    if args.credentials_file is None:
        return {}
    try:
        raw = json.loads(args.credentials_file.read_text())
    except (OSError, ValueError) as exc:
        raise _Refused(f"{args.credentials_file}: {exc}") from None
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise _Refused(f"{args.credentials_file}: expected a JSON object of strings")
    refused = sorted(k for k in raw if "/" in k or not k)
    if refused:  # a credential's scope begins at its first "/" (broker.server.auth)
        raise _Refused(
            f"{args.credentials_file}: an access key may not be empty or contain '/': {refused}"
        )
    return raw


def _store_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """StoreConfig's keywords. One body limit: the server checks it (MESSAGE_BODY_TOO_LARGE
    above it), the broker and the store are configured so that every body within it, with
    any legal topic and properties, is stored."""
    from broker.store.config import FlushMode, default_store_dir, max_message_size_for
    from reliable_cli.store_options import disk_options

    if args.max_body_size < 1:
        raise _Refused("--max-body-size must be at least 1 byte")
    store_kwargs: dict[str, Any] = {
        "store_dir": args.store or default_store_dir(),
        "flush_mode": FlushMode.SYNC_FLUSH if args.flush == "sync" else FlushMode.ASYNC_FLUSH,
        "max_message_size": max_message_size_for(args.max_body_size),
    }
    if args.commitlog_file_size:
        store_kwargs["mapped_file_size_commitlog"] = args.commitlog_file_size
    try:
        store_kwargs.update(disk_options(args))
    except ValueError as exc:
        raise _Refused(str(exc)) from None
    return store_kwargs


def _server_config(
    args: argparse.Namespace, ha_config: HaConfig, credentials: dict[str, str]
) -> ServerConfig:
    """The gRPC server's configuration (the cluster file read and checked)."""
    from broker.errors import ConfigError
    from broker.ha import HaRole
    from broker.server import ServerConfig

    try:
        cluster = replication.cluster_config(args, ha_config.broker_id)
    except (ValueError, ConfigError) as exc:
        raise _Refused(str(exc)) from None
    return ServerConfig(
        host=args.host,
        port=args.port,
        advertised_host=args.advertise,
        broker_name=args.broker_name,
        broker_id=ha_config.broker_id,
        cluster=cluster,
        cluster_probe_ms=args.cluster_probe_ms,
        wire_port=args.wire_port,
        idle_poll_us=args.idle_poll_us,
        answer_batch=args.answer_batch,
        answer_linger_ms=args.answer_linger_ms,
        max_inflight_sends=args.max_inflight_sends,
        min_send_time_ms=args.min_send_time_ms,
        max_concurrent_rpcs=args.max_concurrent_rpcs,
        max_concurrent_streams=args.max_concurrent_streams,
        max_pending_calls=args.max_pending_calls,
        read_only=ha_config.role is HaRole.SLAVE,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        credentials=credentials,
        max_body_size=args.max_body_size,
        min_invisible_ms=args.min_invisible_ms,
        max_long_polling_ms=args.long_polling_ms,
        min_long_polling_ms=min(args.min_long_polling_ms, args.long_polling_ms),
        default_invisible_ms=args.default_invisible_ms,
        auto_create_group=not args.no_auto_create_groups,
        group_resend=not args.no_group_resend,
    )


def _open_broker(args: argparse.Namespace, plan: StartPlan) -> tuple[Broker, BrokerConfig]:
    """The broker on its store, started (_Refused: it could not be)."""
    from broker.broker import Broker
    from broker.config import BrokerConfig
    from broker.errors import BrokerError
    from broker.store.config import StoreConfig, smallest_commitlog_file_for
    from broker.store.errors import StoreError

    store_dir = plan.store_kwargs["store_dir"]
    try:
        broker_config = BrokerConfig(**plan.broker_kwargs)
        broker_config.validate()
        store_dir.mkdir(parents=True, exist_ok=True)
        broker = Broker(StoreConfig(**plan.store_kwargs), broker_config)
        file_size = broker.store.config.mapped_file_size_commitlog  # the store's own
        if args.commitlog_file_size and args.commitlog_file_size != file_size:
            print(
                f"reliable broker: {store_dir} keeps its own commitlog file size "
                f"({file_size} bytes); --commitlog-file-size applies to new stores",
                file=sys.stderr,
            )
        needed = smallest_commitlog_file_for(plan.store_kwargs["max_message_size"])
        if file_size < needed:
            raise _Refused(
                f"--max-body-size {args.max_body_size} needs commitlog files of at "
                f"least {needed} bytes; the store's are {file_size}"
            )
        broker.start()
    except (BrokerError, StoreError, OSError) as exc:
        raise _Refused(f"cannot start the broker: {exc}", ExitCode.FAILURE) from None
    return broker, broker_config


def _replicate(
    args: argparse.Namespace, plan: StartPlan, broker: Broker, broker_config: BrokerConfig
) -> _Running:
    """The broker's replication node and failover, started (_Refused: they could not be;
    the broker is shut down)."""
    from broker.errors import BrokerError
    from broker.ha import HaRole
    from broker.ha.node import HaNode
    from broker.store.config import StoreConfig
    from broker.store.errors import StoreError

    running = _Running(broker, plan.ha_config)
    try:
        if running.ha_config.coordinated:
            running.failover, running.ha_config = replication.coordinated(args, running.ha_config)
        ha_config = running.ha_config
        if ha_config.role is HaRole.SLAVE and ha_config.master is not None:
            store_config = StoreConfig(**plan.store_kwargs)
            running.broker = replication.rejoin(
                running.broker, ha_config, store_config, broker_config
            )
        if ha_config.role is not HaRole.NONE:
            running.node = HaNode(running.broker, ha_config)
            if running.failover is not None:
                running.failover.bind(running.node)
            running.node.start()
    except replication.CoordinatorDown as exc:
        running.broker.shutdown()
        raise _Refused(str(exc), ExitCode.UNAVAILABLE) from None
    except (BrokerError, StoreError, ValueError) as exc:
        running.broker.shutdown()
        raise _Refused(f"cannot rejoin as a slave: {exc}", ExitCode.FAILURE) from None
    except OSError as exc:
        running.broker.shutdown()
        raise _Refused(
            f"cannot serve replication on {args.host}:{args.ha_port}: {exc}", ExitCode.UNAVAILABLE
        ) from None
    return running


def _serve(args: argparse.Namespace, plan: StartPlan, running: _Running) -> int:
    """Serve until SIGTERM or Ctrl-C (or until the server fails, or a coordinated master
    loses its lease), then stop everything in order."""
    from broker.server import MessagingServer, ServerStartError

    broker, node, failover = running.broker, running.node, running.failover
    # the event loop, the gRPC threads, the call pool and the store's services hand the GIL
    # to each other on every request; the default 5 ms switch interval turns each handoff
    # into a wait (measured: 9.5 ms per send at 5 ms, 2.3 ms at 0.5 ms)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    stop = threading.Event()
    server = MessagingServer(broker, plan.server_config)
    if node is not None:
        replication.wire_replication(node, server, coordinated=failover is not None)
    try:
        server.start()
    except ServerStartError as exc:
        if node is not None:
            node.stop()
        broker.shutdown()
        return _fail(f"cannot serve on {args.host}:{args.port}: {exc}", ExitCode.UNAVAILABLE)

    def _on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        endpoint = _metrics_endpoint(args, broker, server, stop, node)
    except OSError as exc:
        server.stop(grace_s=0)
        if node is not None:
            node.stop()
        broker.shutdown()
        return _fail(
            f"cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {exc}",
            ExitCode.UNAVAILABLE,
        )
    _announce(args, plan, running, server)
    deposed = False
    try:
        while not stop.wait(0.5):
            if server.wait(0):
                return _fail("the server stopped unexpectedly", ExitCode.FAILURE)
            if failover is not None and failover.deposed.is_set():
                deposed = True
                break
    finally:
        server.stop(grace_s=2.0)
        if failover is not None:
            failover.stop()  # ends the lease: another broker takes over at once
        if node is not None:
            node.stop()
        broker.shutdown()
        if endpoint is not None:
            endpoint.stop()
    if deposed:
        return _rejoin_in_place(args)
    print("reliable broker: stopped", flush=True)
    return ExitCode.OK


def _rejoin_in_place(args: argparse.Namespace) -> int:
    """A deposed master (etcd named another while this one could not renew its lease)
    has stopped serving and closed its store; it starts again in the same process, with
    the same options, and so joins its group as a slave of the master etcd names (cutting
    its unacknowledged tail, as any restart does). Without the command line it was started
    with (`main` called from code), it exits with UNAVAILABLE for its supervisor."""
    why = "no longer the master of its group (its coordinator lease was lost)"
    argv = getattr(args, "argv", None)
    if argv is None:
        return _fail(f"{why}: restart it to rejoin as a slave", ExitCode.UNAVAILABLE)
    print(f"reliable broker: {why}: starting again to rejoin it as a slave", flush=True)
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "reliable_cli", *argv])
    return ExitCode.UNAVAILABLE  # pragma: no cover (execv does not return)


def _announce(
    args: argparse.Namespace, plan: StartPlan, running: _Running, server: MessagingServer
) -> None:
    """The lines that say what is running, the ready line last (whoever waits for it knows
    the role too); the failover starts campaigning in between."""
    from broker.ha import HaMaster
    from broker.store.config import describe

    broker, node, failover, ha_config = (
        running.broker,
        running.node,
        running.failover,
        running.ha_config,
    )
    if broker.store.created:
        print(
            f"reliable broker: created a new store at {describe(broker.store.config)}", flush=True
        )
    if node is not None and isinstance(node.replication, HaMaster):
        print(
            f"reliable broker: {ha_config.role.value} {args.broker_name}, replication on "
            f"{args.host}:{node.replication.port}",
            flush=True,
        )
    elif node is not None:
        of = f"{ha_config.master[0]}:{ha_config.master[1]}" if ha_config.master else "no one yet"
        print(
            f"reliable broker: slave {args.broker_name}/{ha_config.broker_id} of {of} (read-only)",
            flush=True,
        )
    if failover is not None:
        failover.endpoint = f"{args.advertise or args.host}:{server.port}"
        failover.start()
        print(
            f"reliable broker: failover auto, coordinator {args.coordinator}, member "
            f"{ha_config.broker_id} of {args.broker_name}",
            flush=True,
        )
    # what recovery and start-up left is the process's for good: kept out of the cyclic
    # garbage collector's full passes, each of which walked it all (tens of ms a pass,
    # a stall of every call in flight)
    gc.collect()
    gc.freeze()
    if server.wire_port:
        print(f"reliable broker: native wire on {args.host}:{server.wire_port}", flush=True)
    print(
        f"reliable broker: serving on {args.host}:{server.port} "
        f"(store {plan.store_kwargs['store_dir']}, flush {args.flush})",
        flush=True,
    )


def _metrics_endpoint(
    args: argparse.Namespace,
    broker: Broker,
    server: MessagingServer,
    stop: threading.Event,
    node: HaNode | None = None,
) -> MetricsEndpoint | None:
    """/metrics with the broker's collector; /readyz: serving, store writable, not stopping."""
    if args.metrics_port is None:
        return None
    from prometheus_client import CollectorRegistry

    from broker.metrics import BrokerCollector
    from broker.server.health import store_writable

    registry = CollectorRegistry()
    registry.register(
        BrokerCollector(
            broker,
            send_seconds=server.ctx.send_seconds,
            busy_turns=server.ctx.busy_turns,
            overload=server.ctx.overload_counts,
        )
    )
    if node is not None:
        from broker.ha.metrics import ReplicationCollector

        registry.register(ReplicationCollector(node))

    def ready() -> dict[str, bool]:
        return {
            "serving": not stop.is_set() and not server.wait(0),
            "store_writable": store_writable(broker),
        }

    return observe.start_endpoint(args, "reliable broker", registry, ready)
