"""Server configuration: address, TLS, authentication and the protocol's limits, in one value.

Defaults follow the Apache RocketMQ 5 proxy (`ProxyConfig`), so a client tuned for a real
cluster behaves the same here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from broker.idle_poll import DEFAULT_MAX_US
from broker.server.answers import DEFAULT_BATCH, DEFAULT_LINGER_MS
from broker.server.cluster import ClusterConfig
from protocol.limits import DEFAULT_MAX_BODY_SIZE, MAX_INVISIBLE_MS


@dataclass(frozen=True)
class ServerConfig:
    """Everything the gRPC server needs beyond the broker itself."""

    host: str = "127.0.0.1"
    port: int = 8081
    # the endpoint advertised in routes when a client's request does not name one
    advertised_host: str | None = None
    broker_name: str = "broker-a"
    # a slave (docs/ha.md): its commitlog is its master's copy, so every call that would
    # write to it (sends, transactions, receives, acks) is refused with FORBIDDEN
    read_only: bool = False
    # broker groups (docs/ha.md): every group's queues in routes; this server is
    # (broker_name, broker_id) in the file, broker id 0 its group's master, N its slave N
    cluster: ClusterConfig | None = None
    broker_id: int = 0
    cluster_probe_ms: int = 1000  # how often every other server's health is probed
    # the native wire (docs/wire.md): the unary calls over framed TCP on this port beside
    # gRPC's, for the framework's own clients; None: off, 0 (the default): a free port,
    # announced in the ready line and to every client that asks. TLS when `tls` is.
    wire_port: int | None = 0
    # the event loop polls this long at most before it sleeps in its selector, while the
    # calls it waits for keep coming within it (`broker.idle_poll`); 0: never polls
    idle_poll_us: int = DEFAULT_MAX_US
    # while the loop is busy, gRPC answers are held and sent together and single sends are
    # stored together, up to this many at once and this long at most
    # (`broker.server.answers`, `broker.server.send_groups`); batch 0: neither
    answer_batch: int = DEFAULT_BATCH
    answer_linger_ms: float = DEFAULT_LINGER_MS

    # --- TLS: both files, or neither (plaintext)
    tls_cert: Path | None = None
    tls_key: Path | None = None

    # --- access keys: empty means authentication is off. Map access key -> secret key.
    credentials: dict[str, str] = field(default_factory=dict)
    # the client signs its *local* time with a 'Z' suffix: tolerate any zone's offset
    max_signature_skew_s: int = 27 * 3600

    # --- limits (the proxy's defaults)
    max_body_size: int = DEFAULT_MAX_BODY_SIZE
    max_properties: int = 128
    max_properties_size: int = 16 * 1024
    max_message_group_size: int = 64
    max_batch_messages: int = 1024  # messages in one SendMessage
    max_delay_ms: int = 24 * 3600 * 1000
    min_invisible_ms: int = 10_000  # for ReceiveMessage without auto-renew
    max_invisible_ms: int = MAX_INVISIBLE_MS
    default_invisible_ms: int = 60_000  # auto-renew (push consumers)
    renew_ahead_ms: int = 10_000  # renew this long before expiry
    max_renew_ms: int = 3 * 3600 * 1000  # stop renewing one message after this long
    release_invisible_ms: int = 1_000  # in-flight messages of a departed client reappear after
    # a client whose telemetry stream closed and did not come back within this grace is
    # departed: its auto-renewed messages are released (the proxy does it on channel close)
    stream_grace_ms: int = 3_000
    min_long_polling_ms: int = 5_000
    max_long_polling_ms: int = 20_000
    max_receive_batch: int = 32
    max_parked_polls: int = 256  # concurrent long polls; beyond: TOO_MANY_REQUESTS
    max_inflight_sends: int = 4096  # messages being stored at once; beyond: TOO_MANY_REQUESTS
    # a send read, while the loop is busy, with less than this left of its deadline is
    # refused (TOO_MANY_REQUESTS): its answer would likely come too late, and its client
    # would resend it at once; 0: never
    min_send_time_ms: int = 500
    # what gRPC takes in at once (`broker.server.server`): calls running in the server
    # (beyond: RESOURCE_EXHAUSTED before any handler runs; 0: no limit), HTTP/2 streams
    # open per connection (a client's further calls wait on its side), and calls received
    # but not yet read by the server (gRPC's pending queue; beyond: refused by gRPC)
    max_concurrent_rpcs: int = 16384
    max_concurrent_streams: int = 4096
    max_pending_calls: int = 16384
    # replies waiting on one Telemetry stream; a client that lets more pile up unread (it
    # sends Settings but never reads) has its stream cut off
    max_telemetry_queue: int = 64
    session_expiry_ms: int = 30_000  # release + forget a client with no call and no stream
    # recent sends remembered for idempotent sends (broker.server.dedupe): a digest and the
    # first result, ~250 bytes each whatever the message's properties; bounded by both
    dedupe_cache_bytes: int = 32 * 1024 * 1024
    dedupe_cache_size: int = 200_000
    dedupe_recovery_window_ms: int = 60_000  # after start, also look ids up in the store
    producer_max_attempts: int = 3
    auto_create_group: bool = True
    # accept a per-group resend: a send to %RETRY%<group> carrying RETRY_TOPIC, for that
    # group alone (`broker.server.group_resend`); advertised as the `group-resend` capability
    group_resend: bool = True
    worker_threads: int = 32  # blocking broker calls (sends, acks, admin)

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None and self.tls_key is not None

    @property
    def auth(self) -> bool:
        return bool(self.credentials)
