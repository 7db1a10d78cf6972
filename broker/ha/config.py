"""Roles and settings of replication."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path


class HaRole(enum.Enum):
    """RocketMQ's brokerRole. NONE: the single broker, no replication at all."""

    NONE = "none"
    ASYNC_MASTER = "async-master"
    SYNC_MASTER = "sync-master"
    SLAVE = "slave"

    @property
    def is_master(self) -> bool:
        return self in (HaRole.ASYNC_MASTER, HaRole.SYNC_MASTER)


@dataclass(frozen=True)
class HaConfig:
    role: HaRole = HaRole.NONE
    broker_name: str = "broker-a"
    broker_id: int = 0  # 0: the master of its group; slaves 1, 2, ...
    host: str = "127.0.0.1"  # the master's HA listener
    port: int = 10912  # 0: any free port (tests)
    master: tuple[str, int] | None = None  # a slave's master (HOST, HAPORT)
    max_chunk_bytes: int = 1024 * 1024  # bytes of records in one frame (a larger record alone)
    heartbeat_ms: int = 1000  # a frame (or a report) at least this often on an idle link
    idle_timeout_ms: int = 10_000  # a link silent this long is dropped (and redialled)
    reconnect_ms: int = 1000  # a slave's wait before dialling again
    config_sync_ms: int = 5000  # how often a master sends its topics, groups, offsets
    sync_timeout_ms: int = 3000  # SYNC_MASTER: longest wait for a slave's acknowledgement
    # the link's security (docs/ha.md, "Who may replicate"): with access keys a master
    # requires every peer to prove one, and a slave proves `access_key` and checks the
    # master's proof; never printed
    credentials: dict[str, str] = field(default_factory=dict, repr=False)
    access_key: str | None = None  # a slave's key (None: it does not authenticate)
    tls_cert: Path | None = None  # a master serves its HA port over TLS with these
    tls_key: Path | None = None
    tls_ca: Path | None = None  # a slave dials over TLS and verifies its master against it
    handshake_timeout_ms: int = 5000  # a peer's hello, TLS and proofs take at most this
    max_peers: int = 32  # connections a master's HA port holds at once, handshakes included
    # automatic failover (docs/ha.md, "Automatic failover"): a coordinator names the
    # group's master, so a slave may start before it knows one (`master` None)
    coordinated: bool = False

    def validate(self) -> None:
        if self.role is HaRole.SLAVE:
            if self.master is None and not self.coordinated:
                raise ValueError("a slave needs its master's HOST:HAPORT")
            if self.broker_id < 1:
                raise ValueError("a slave's broker id is 1 or more (0 is the master)")
        elif self.role.is_master and self.broker_id != 0:
            raise ValueError("a master's broker id is 0")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"HA port {self.port} out of range")
        if self.sync_timeout_ms < 1:
            raise ValueError("the sync timeout must be at least 1 ms")
        if self.max_chunk_bytes < 1:
            raise ValueError("max_chunk_bytes must be at least 1")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("a TLS certificate and its key go together")
        if self.access_key is not None and self.access_key not in self.credentials:
            raise ValueError(f"access key {self.access_key!r} is not among the credentials")

    @property
    def authenticates(self) -> bool:
        """A master with access keys requires every peer to prove one."""
        return bool(self.credentials)


def parse_address(text: str) -> tuple[str, int]:
    """'HOST:PORT' -> (HOST, PORT); ValueError when it is not one."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host, int(port)
