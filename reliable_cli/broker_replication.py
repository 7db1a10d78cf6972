"""`reliable broker start`'s replication: the options' HA and cluster settings, automatic
failover, a slave's rejoin, and the server's view of its replication node (docs/ha.md).

`reliable_cli.broker` calls these stages; each imports what it needs of `broker.ha` when
called, so that a broker without replication loads none of it.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from reliable_cli.errors import CommandError

if TYPE_CHECKING:
    from broker.broker import Broker
    from broker.config import BrokerConfig
    from broker.ha import HaConfig, HaRole
    from broker.ha.etcd import EtcdClient
    from broker.ha.failover import Failover
    from broker.ha.rejoin import Rejoin
    from broker.server import MessagingServer
    from broker.server.cluster import ClusterConfig
    from broker.store.config import StoreConfig


def rejoin(
    broker: Broker, ha_config: HaConfig, store_config: StoreConfig, broker_config: BrokerConfig
) -> Broker:
    """A slave's store that holds records its master never had (an old master rejoining
    its group, docs/ha.md): the tail is saved, and the broker started again with its
    commitlog cut back to where the master's copy ends. The broker to go on with."""
    from broker.broker import Broker
    from broker.ha.rejoin import plan_rejoin
    from broker.ha.state import EpochHistory

    plan = plan_rejoin(broker.store, ha_config, EpochHistory(store_config.store_dir))
    if plan is None:
        return broker
    broker.shutdown()
    again = Broker(store_config, broker_config)
    again.store.truncate_to = plan.offset
    again.start()
    print(
        f"reliable broker: rejoining as a slave: cut {plan.bytes} bytes ({plan.messages} "
        f"messages) beyond offset {plan.offset}, the master's copy of this log (acknowledged "
        f"by a slave: up to {plan.acked}); they are kept in {plan.saved}",
        flush=True,
    )
    return again


class CoordinatorDown(CommandError):
    """etcd did not answer as the broker started."""


def coordinated(args: argparse.Namespace, ha_config: HaConfig) -> tuple[Failover, HaConfig]:
    """With --failover auto: the broker's failover (broker.ha.failover) and its replication
    settings, following the master etcd names (None: none yet; it campaigns)."""
    import dataclasses

    from broker.ha.etcd import CoordinatorUnavailable
    from broker.ha.failover import Failover, FailoverConfig

    config = FailoverConfig(
        group=args.broker_name,
        member=ha_config.broker_id,
        ha_address=f"{args.host}:{args.ha_port}",
        sync=args.role == "sync-master",
        ttl_s=args.failover_ttl_s,
    )
    failover = Failover(_coordinator(args), config)
    try:
        master = failover.find_master()
    except CoordinatorUnavailable as exc:
        raise CoordinatorDown(f"cannot reach the coordinator: {exc}") from None
    return failover, dataclasses.replace(ha_config, master=master)


def _coordinator(args: argparse.Namespace) -> EtcdClient:
    """The etcd client the options name (ValueError: a bad URL or TLS file)."""
    from broker.ha.etcd import EtcdClient

    return EtcdClient.from_url(
        args.coordinator,
        ca_file=args.coordinator_ca,
        cert_file=args.coordinator_cert,
        key_file=args.coordinator_key,
    )


def wire_replication(node: Any, server: MessagingServer, *, coordinated: bool = False) -> None:
    """The server's view of the node: HaStatus, PromoteBroker, the SYNC_MASTER gate, and
    what a promotion changes (writes let in, the gate set). `coordinated`: with automatic
    failover, an async-master too acknowledges only while its lease holds."""
    from broker.ha import HaMaster, HaRole
    from broker.ha.failover import LeaseGate

    ctx = server.ctx
    ctx.ha_status = node.status
    ctx.ha_promote = node.promote
    if node.role is HaRole.SLAVE:  # a promotion makes the server writable: no longer asked
        # a slave rejoining its master never serves its group's reads meanwhile: the
        # master answered (it refused this log), and the store is being cut back
        ctx.master_link = lambda: bool(
            getattr(node.replication, "connected", True)
            or getattr(node.replication, "rejoining", False)
        )
    elif ctx.cluster is not None:
        group = ctx.cluster.config.group(node.config.broker_name)
        if group is not None and len(group.endpoints) > 1:
            # a master whose slaves may have served its receives while it was down
            ctx.reads_ready = node.reads_ready
    if node.role is HaRole.SYNC_MASTER:
        ctx.replication = node.replication  # sends wait for a slave's acknowledgement

    def promoted(master: HaMaster) -> None:
        if master.config.role is HaRole.SYNC_MASTER:
            ctx.replication = master
        elif coordinated and node.fence is not None:
            ctx.replication = LeaseGate(node.fence)
        server.servicer.make_writable()
        epoch = master.epochs.last[0] if master.epochs is not None else 1
        print(
            f"reliable broker: promoted to {master.config.role.value} "
            f"{master.config.broker_name}, replication on {master.config.host}:{master.port}, "
            f"epoch {epoch}",
            flush=True,
        )

    node.on_promoted.append(promoted)

    def rejoined(plan: Rejoin) -> None:
        print(
            f"reliable broker: rejoined as a slave, running: cut {plan.bytes} bytes "
            f"({plan.messages} messages) beyond offset {plan.offset}, the master's copy of "
            f"this log (acknowledged by a slave: up to {plan.acked}); they are kept in "
            f"{plan.saved}",
            flush=True,
        )

    node.on_rejoined.append(rejoined)


def cluster_config(args: argparse.Namespace, broker_id: int) -> ClusterConfig | None:
    """The cluster file's broker groups, checked to name this broker (ValueError: why not)."""
    if args.cluster is None:
        return None
    from broker.server.cluster import ClusterConfig

    if args.cluster_probe_ms < 50:
        raise ValueError("--cluster-probe-ms must be at least 50")
    cluster = ClusterConfig.load(args.cluster)
    group = cluster.group(args.broker_name)
    if group is None:
        raise ValueError(
            f"the cluster file {args.cluster} has no broker group {args.broker_name!r} "
            f"(it names {', '.join(g.name for g in cluster.groups)})"
        )
    if broker_id >= len(group.endpoints):
        raise ValueError(
            f"broker group {args.broker_name!r} of {args.cluster} lists "
            f"{len(group.endpoints) - 1} slaves: no broker id {broker_id}"
        )
    return cluster


def ha_config(args: argparse.Namespace, credentials: dict[str, str]) -> HaConfig:
    """The replication settings the options give (ValueError: a usage error)."""
    from broker.ha import HaConfig, HaRole
    from broker.ha.auth import pick_access_key
    from broker.ha.config import parse_address

    role = HaRole(args.role)
    if args.failover == "auto":
        return _auto_config(args, role, credentials)
    if (
        args.coordinator is not None
        or args.coordinator_ca
        or args.coordinator_cert
        or args.coordinator_key
    ):
        raise ValueError("--coordinator and its TLS options are for --failover auto")
    if role is HaRole.NONE:
        if args.master is not None:
            raise ValueError("--master is for --role slave")
        if args.ha_tls_ca is not None or args.ha_access_key is not None:
            raise ValueError("--ha-tls-ca and --ha-access-key are for a replication role")
        return HaConfig()
    if args.ha_access_key is not None and not credentials:
        raise ValueError("--ha-access-key needs --credentials-file")
    if role is HaRole.SLAVE and args.master is None:
        raise ValueError("--role slave needs --master HOST:HAPORT")
    if role is not HaRole.SLAVE and args.master is not None:
        raise ValueError("--master is for --role slave")
    broker_id = args.broker_id if args.broker_id is not None else (1 if role is HaRole.SLAVE else 0)
    config = HaConfig(
        role=role,
        broker_name=args.broker_name,
        broker_id=broker_id,
        host=args.host,
        port=args.ha_port,
        sync_timeout_ms=args.ha_sync_timeout_ms,
        config_sync_ms=args.ha_config_sync_ms,
        master=parse_address(args.master) if args.master else None,
        credentials=dict(credentials),
        access_key=pick_access_key(credentials, args.ha_access_key),
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_ca=args.ha_tls_ca,
    )
    config.validate()
    if args.ha_tls_ca is not None:
        import ssl

        from broker.ha.link import client_context

        try:
            client_context(args.ha_tls_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"--ha-tls-ca {args.ha_tls_ca}: {exc}") from None
    return config


def _auto_config(args: argparse.Namespace, role: HaRole, credentials: dict[str, str]) -> HaConfig:
    """--failover auto: every broker starts as a follower (a slave with no master yet)."""
    from broker.ha import HaConfig, HaRole
    from broker.ha.auth import pick_access_key
    from broker.ha.etcd import parse_endpoint

    if args.coordinator is None:
        raise ValueError("--failover auto needs --coordinator etcd://HOST:PORT")
    parse_endpoint(args.coordinator)
    _coordinator(args)  # the TLS files are read now: a bad one is a usage error
    if not role.is_master:
        raise ValueError(
            "--failover auto: --role is what this broker becomes when etcd names it the "
            "master: sync-master or async-master"
        )
    if args.master is not None:
        raise ValueError("--failover auto: the master is whoever etcd names (no --master)")
    if args.broker_id is None or args.broker_id < 1:
        raise ValueError("--failover auto: give each broker of the group its --broker-id, 1..")
    if args.ha_port == 0:
        raise ValueError("--failover auto: a fixed --ha-port (its slaves dial it)")
    if args.ha_access_key is not None and not credentials:
        raise ValueError("--ha-access-key needs --credentials-file")
    if args.failover_ttl_s < 2:
        raise ValueError("--failover-ttl-s must be at least 2")
    config = HaConfig(
        role=HaRole.SLAVE,
        broker_name=args.broker_name,
        broker_id=args.broker_id,
        host=args.host,
        port=args.ha_port,
        sync_timeout_ms=args.ha_sync_timeout_ms,
        config_sync_ms=args.ha_config_sync_ms,
        credentials=dict(credentials),
        access_key=pick_access_key(credentials, args.ha_access_key),
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_ca=args.ha_tls_ca,
        coordinated=True,
    )
    config.validate()
    return config
