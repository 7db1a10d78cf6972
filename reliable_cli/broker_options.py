"""The options of `reliable broker start`, in named groups, defaulting to the config values.

Every default is read from the configuration object the option sets (`ServerConfig`,
`BrokerConfig`, `StoreConfig`, `HaConfig`, `FailoverConfig`): the command line keeps no copy
of its own, so a broker started without options runs exactly as one built in code with
the shipped defaults, and `--help` says what they are.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from broker.config import BrokerConfig
from broker.ha.config import HaConfig, HaRole
from broker.ha.failover import FailoverConfig
from broker.server.config import ServerConfig
from broker.store.config import StoreConfig

SERVER = ServerConfig()
BROKER = BrokerConfig()
STORE = StoreConfig()
HA = HaConfig()


def _wire_port(text: str) -> int | None:
    """`--wire-port`: a port (0: a free one), or `off`."""
    if text.strip().lower() == "off":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port or 'off'") from None


def _default(config: type[Any], name: str) -> Any:
    """A field's default, for a config class that has no default for every field."""
    return next(f.default for f in dataclasses.fields(config) if f.name == name)


FAILOVER_TTL_S: int = _default(FailoverConfig, "ttl_s")


def add_start_arguments(s: argparse.ArgumentParser) -> None:
    """Every option of `reliable broker start`, group by group."""
    add_listen_arguments(s)
    add_event_loop_arguments(s)
    add_admission_arguments(s)
    add_security_arguments(s)
    add_delivery_arguments(s)
    add_store_arguments(s)
    add_replication_arguments(s)
    add_failover_arguments(s)


def add_listen_arguments(s: argparse.ArgumentParser) -> None:
    """Where the server listens and what it advertises."""
    s.add_argument(
        "--host",
        default=SERVER.host,
        help=f"address to listen on (default {SERVER.host}; 0.0.0.0 for all)",
    )
    s.add_argument(
        "--port",
        type=int,
        default=SERVER.port,
        help=f"port to listen on (default {SERVER.port}; 0 picks a free one)",
    )
    s.add_argument(
        "--wire-port",
        type=_wire_port,
        default=SERVER.wire_port,
        metavar="PORT|off",
        help="serve the native wire (docs/wire.md) on this port too, for the framework's "
        "clients: the same calls as gRPC, framed over TCP, 2-3x less CPU a call; 0 picks a "
        "free one, announced in the ready line and to the clients (default 0; off: gRPC "
        "only). With --tls-cert it is TLS with the same certificate",
    )
    s.add_argument(
        "--advertise",
        default=SERVER.advertised_host,
        metavar="HOST",
        help="host put in routes when a client's request names none (default: --host)",
    )


def add_event_loop_arguments(s: argparse.ArgumentParser) -> None:
    """How the server's event loop waits for calls and groups its work."""
    s.add_argument(
        "--idle-poll-us",
        type=int,
        default=SERVER.idle_poll_us,
        metavar="US",
        help="poll for calls this long at most before the server's event loop sleeps, while "
        "calls keep coming within it: on a virtual machine whose idle CPUs halt at once, "
        "this saves a halt and a wake per call of a one-at-a-time client, for at most this "
        f"much CPU per wait (docs/performance.md, idle polling; default "
        f"{SERVER.idle_poll_us}; 0: never poll)",
    )
    s.add_argument(
        "--answer-batch",
        type=int,
        default=SERVER.answer_batch,
        metavar="N",
        help="while the server's event loop is busy, store the single gRPC sends it serves "
        "together as one record batch and hold the answers it makes to send them together, "
        "up to N messages or answers at once: a client with many calls in flight then costs "
        "one store call and one wake-up for many; a call made while the loop is idle is "
        "stored and answered at once (docs/performance.md, answers held and sends stored "
        f"together; default {SERVER.answer_batch}; 0: neither)",
    )
    s.add_argument(
        "--answer-linger-ms",
        type=float,
        default=SERVER.answer_linger_ms,
        metavar="MS",
        help="the longest a held answer or a grouped send waits for the others of its "
        f"batch (default {SERVER.answer_linger_ms:g})",
    )


def add_admission_arguments(s: argparse.ArgumentParser) -> None:
    """What the server takes in at once, and the largest body."""
    s.add_argument(
        "--max-inflight-sends",
        type=int,
        default=SERVER.max_inflight_sends,
        metavar="N",
        help="messages being stored at once; a send beyond is refused with "
        "TOO_MANY_REQUESTS, which clients back off from (docs/server.md, a burst of "
        f"clients; default {SERVER.max_inflight_sends})",
    )
    s.add_argument(
        "--min-send-time-ms",
        type=int,
        default=SERVER.min_send_time_ms,
        metavar="MS",
        help="a send read while the server is busy with less than this left of its deadline "
        "is refused with TOO_MANY_REQUESTS instead of stored: its answer would likely come "
        "too late, and its client "
        f"would resend it at once (default {SERVER.min_send_time_ms}; 0: never refused)",
    )
    s.add_argument(
        "--max-concurrent-rpcs",
        type=int,
        default=SERVER.max_concurrent_rpcs,
        metavar="N",
        help="gRPC calls running at once (sends, parked receives, telemetry streams); one "
        "beyond is answered RESOURCE_EXHAUSTED before it is served "
        f"(default {SERVER.max_concurrent_rpcs}; 0: no limit)",
    )
    s.add_argument(
        "--max-concurrent-streams",
        type=int,
        default=SERVER.max_concurrent_streams,
        metavar="N",
        help="HTTP/2 streams one gRPC connection may have open; a client's further calls "
        "wait on its side (those sent before the connection's settings arrive are refused: "
        f"UNAVAILABLE) (default {SERVER.max_concurrent_streams})",
    )
    s.add_argument(
        "--max-pending-calls",
        type=int,
        default=SERVER.max_pending_calls,
        metavar="N",
        help="gRPC calls received but not read by the server yet, queued by gRPC; past N "
        f"gRPC refuses some at random, past 2N all (default {SERVER.max_pending_calls})",
    )
    s.add_argument(
        "--max-body-size",
        type=int,
        default=SERVER.max_body_size,
        help=f"largest message body accepted, bytes (default {SERVER.max_body_size}); a body "
        "of exactly this size is accepted, a larger one refused with "
        "MESSAGE_BODY_TOO_LARGE",
    )


def add_security_arguments(s: argparse.ArgumentParser) -> None:
    """TLS and access keys."""
    s.add_argument(
        "--tls-cert",
        type=Path,
        default=SERVER.tls_cert,
        help="PEM certificate chain; with --tls-key turns TLS on",
    )
    s.add_argument(
        "--tls-key", type=Path, default=SERVER.tls_key, help="PEM private key for --tls-cert"
    )
    s.add_argument(
        "--credentials-file",
        type=Path,
        default=None,
        help="JSON object {access key: secret key}; turns MQv2-HMAC-SHA1 authentication on",
    )


def add_delivery_arguments(s: argparse.ArgumentParser) -> None:
    """Topics and groups, the retry ladder, receives and long polls, transactions."""
    s.add_argument(
        "--no-auto-create-topics",
        action="store_true",
        help="answer TOPIC_NOT_FOUND for unknown topics instead of creating them",
    )
    s.add_argument(
        "--no-auto-create-groups",
        action="store_true",
        help="answer CONSUMER_GROUP_NOT_FOUND for unknown groups",
    )
    s.add_argument(
        "--no-group-resend",
        action="store_true",
        help="refuse per-group resends (a send to %%RETRY%%<group> carrying RETRY_TOPIC), "
        "as an Apache RocketMQ proxy does; the outbox's resend worker then resends to the "
        "whole topic",
    )
    s.add_argument(
        "--queues",
        type=int,
        default=BROKER.default_queue_nums,
        help=f"queues of an auto-created topic (default {BROKER.default_queue_nums})",
    )
    s.add_argument(
        "--delay-levels",
        default=None,
        metavar="TABLE",
        help='retry/delay ladder, e.g. "1s 5s 10s 30s 1m" '
        f"(default RocketMQ's {len(BROKER.delay_levels_ms)} levels, "
        f"{BROKER.message_delay_level.split()[0]} .. {BROKER.message_delay_level.split()[-1]})",
    )
    s.add_argument(
        "--min-invisible-ms",
        type=int,
        default=SERVER.min_invisible_ms,
        help=f"smallest invisible time a receive may ask for (default {SERVER.min_invisible_ms})",
    )
    s.add_argument(
        "--long-polling-ms",
        type=int,
        default=SERVER.max_long_polling_ms,
        help="longest long poll; also what push consumers are told "
        f"(default {SERVER.max_long_polling_ms})",
    )
    s.add_argument(
        "--min-long-polling-ms",
        type=int,
        default=SERVER.min_long_polling_ms,
        help=f"shortest long poll (default {SERVER.min_long_polling_ms})",
    )
    s.add_argument(
        "--default-invisible-ms",
        type=int,
        default=SERVER.default_invisible_ms,
        help="invisible time of push consumers' messages, renewed while they live "
        f"(default {SERVER.default_invisible_ms})",
    )
    s.add_argument(
        "--transaction-timeout-ms",
        type=int,
        default=BROKER.transaction_timeout_ms,
        help="age at which an unresolved half message is first checked "
        f"(default {BROKER.transaction_timeout_ms})",
    )
    s.add_argument(
        "--transaction-check-interval-ms",
        type=int,
        default=BROKER.transaction_check_interval_ms,
        help="time between checks of one half message "
        f"(default {BROKER.transaction_check_interval_ms})",
    )


def add_store_arguments(s: argparse.ArgumentParser) -> None:
    """Where the store lives, how it flushes, its file size and disk watermarks."""
    from reliable_cli.store_options import add_disk_arguments

    s.add_argument(
        "--store", type=Path, default=None, help="store directory (default ~/.reliable/store)"
    )
    s.add_argument(
        "--flush",
        choices=("sync", "async"),
        default=STORE.flush_mode.value,
        help="sync: acknowledge a send after fsync (group commit); async: after "
        f"the page cache (default {STORE.flush_mode.value})",
    )
    gib = STORE.mapped_file_size_commitlog / (1 << 30)
    s.add_argument(
        "--commitlog-file-size",
        type=int,
        default=None,
        metavar="BYTES",
        help=f"size of one commitlog file of a new store (default {gib:g} GiB; an "
        "existing store keeps its own)",
    )
    add_disk_arguments(s)


def add_replication_arguments(s: argparse.ArgumentParser) -> None:
    """Master/slave replication and broker groups (docs/ha.md)."""
    ha = s.add_argument_group("replication (docs/ha.md; default: a single broker, none)")
    ha.add_argument(
        "--role",
        choices=tuple(role.value for role in HaRole),
        default=HA.role.value,
        help="replication role: a master streams its commitlog to its slaves "
        "on --ha-port; a slave copies its master's and takes no writes",
    )
    ha.add_argument(
        "--broker-name",
        default=SERVER.broker_name,
        help=f"the broker group's name (default {SERVER.broker_name})",
    )
    ha.add_argument(
        "--broker-id", type=int, default=None, help="0 for a master (the default), 1.. for a slave"
    )
    ha.add_argument(
        "--ha-port",
        type=int,
        default=HA.port,
        help=f"a master's replication port, on --host (default {HA.port})",
    )
    ha.add_argument(
        "--master",
        default=None,
        metavar="HOST:HAPORT",
        help="a slave's master (its --host and --ha-port)",
    )
    ha.add_argument(
        "--ha-tls-ca",
        type=Path,
        default=None,
        metavar="PEM",
        help="a slave: dial its master's HA port over TLS and verify the master's "
        "certificate against these CA certificates (a master serves its HA port over TLS "
        "when it has --tls-cert/--tls-key)",
    )
    ha.add_argument(
        "--ha-access-key",
        default=None,
        metavar="AK",
        help="a slave: the access key of --credentials-file it proves to its master "
        "(default: the file's first). With --credentials-file a master requires every "
        "peer of its HA port to prove one, and proves it in turn",
    )
    ha.add_argument(
        "--ha-sync-timeout-ms",
        type=int,
        default=HA.sync_timeout_ms,
        metavar="MS",
        help="sync-master: longest wait for a slave to acknowledge a send; "
        "then the producer gets SLAVE_PERSISTENCE_TIMEOUT and retries "
        f"(default {HA.sync_timeout_ms})",
    )
    ha.add_argument(
        "--ha-config-sync-ms",
        type=int,
        default=HA.config_sync_ms,
        metavar="MS",
        help="a master sends its topics, groups, consumer and delay offsets to its "
        f"slaves this often (default {HA.config_sync_ms}; also at each connect)",
    )
    ha.add_argument(
        "--cluster",
        type=Path,
        default=None,
        metavar="FILE",
        help="broker groups (JSON, or TOML by its .toml suffix): every group's name, "
        "master and slave gRPC endpoints; routes then name every group's queues "
        "(docs/ha.md, Broker groups). This broker is --broker-name/--broker-id in it",
    )
    ha.add_argument(
        "--cluster-probe-ms",
        type=int,
        default=SERVER.cluster_probe_ms,
        metavar="MS",
        help="with --cluster: how often every other server's gRPC health is probed "
        f"(default {SERVER.cluster_probe_ms})",
    )


def add_failover_arguments(s: argparse.ArgumentParser) -> None:
    """Automatic failover through etcd (docs/ha.md)."""
    fo = s.add_argument_group(
        "automatic failover (docs/ha.md, Automatic failover; default: promotion by an operator)"
    )
    fo.add_argument(
        "--coordinator",
        default=None,
        metavar="etcd://HOST:PORT",
        help="the etcd server (its client URL) that names each broker group's master; "
        "etcds://HOST:PORT speaks TLS",
    )
    fo.add_argument(
        "--coordinator-ca",
        default=None,
        metavar="FILE",
        help="with etcds://: the CA certificate etcd's certificate is verified against "
        "(default: the system's CAs)",
    )
    fo.add_argument(
        "--coordinator-cert",
        default=None,
        metavar="FILE",
        help="with etcds://: this broker's client certificate (PEM), for an etcd started "
        "with --client-cert-auth",
    )
    fo.add_argument(
        "--coordinator-key",
        default=None,
        metavar="FILE",
        help="the private key of --coordinator-cert (PEM)",
    )
    fo.add_argument(
        "--failover",
        choices=("manual", "auto"),
        default="manual",
        help="auto: with --coordinator, the group's master is whoever etcd names; every "
        "broker starts as a follower, the most caught-up one is promoted when the master "
        "is lost, and --role (sync-master or async-master) is what it becomes. Every "
        "broker of the group has its own --broker-id (1 or more) and a fixed --ha-port "
        "(default manual: `reliable admin broker promote`)",
    )
    fo.add_argument(
        "--failover-ttl-s",
        type=int,
        default=FAILOVER_TTL_S,
        metavar="S",
        help="the lease TTL: a lost master is replaced about this long after its last "
        "renewal, and a master that cannot renew stops acknowledging sends after 3/4 of "
        f"it (default {FAILOVER_TTL_S}, etcd's minimum)",
    )
