"""Delivery-layer configuration: one frozen value, RocketMQ's broker defaults.

Tests shrink the delay-level table (`"100ms 200ms 300ms"`) and the service intervals; the
clock itself is injected into `Broker`, not configured here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from broker.errors import ConfigError
from protocol.limits import (
    DEFAULT_MAX_BODY_SIZE,
    DEFAULT_QUEUE_NUMS,
    DEFAULT_RETRY_MAX_TIMES,
    MAX_INVISIBLE_MS,
)

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

# the gRPC server's port unless told otherwise (`reliable broker start --port`); an endpoint
# written without a port means it (gRPC alone would dial 443)
DEFAULT_PORT = 8081


def with_default_port(endpoint: str) -> str:
    """`host` -> `host:8081`, for each of several `;`-separated endpoints; a port given, a
    bare IPv6 address (`::1`, ambiguous without brackets) and a gRPC target with a scheme
    (`dns:///host`) are kept as they are; `[::1]` gets the port too."""
    parts = []
    for part in endpoint.split(";"):
        bare = part.strip()
        if (
            bare
            and "/" not in bare
            and (":" not in bare or (bare.startswith("[") and bare.endswith("]")))
        ):
            part = f"{bare}:{DEFAULT_PORT}"
        parts.append(part)
    return ";".join(parts)


_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL = re.compile(r"^(\d+)(ms|s|m|h|d)$")


def parse_delay_levels(table: str) -> tuple[int, ...]:
    """`"1s 5s 10s ..."` -> delays in ms, level 1 first. ConfigError for anything else.

    Units: ms, s, m, h, d. Delays must be positive and not decrease (the retry ladder
    climbs); at most 64 levels.
    """
    parts = table.split()
    if not parts:
        raise ConfigError("delay level table is empty")
    if len(parts) > 64:
        raise ConfigError(f"delay level table has {len(parts)} levels; at most 64")
    out: list[int] = []
    for i, part in enumerate(parts, start=1):
        m = _LEVEL.match(part)
        if m is None:
            raise ConfigError(
                f"delay level {i} {part!r}: expected a number and a unit "
                f"(ms, s, m, h, d), e.g. '5s'"
            )
        ms = int(m.group(1)) * _UNIT_MS[m.group(2)]
        if ms <= 0:
            raise ConfigError(f"delay level {i} {part!r} must be positive")
        if out and ms < out[-1]:
            raise ConfigError(f"delay level {i} {part!r} is shorter than level {i - 1}")
        out.append(ms)
    return tuple(out)


# RocketMQ's ladder in ms (level 1 first): what a client assumes of a broker that does not say
DEFAULT_DELAY_LEVELS_MS: tuple[int, ...] = parse_delay_levels(DEFAULT_DELAY_LEVELS)


@dataclass(frozen=True)
class BrokerConfig:
    """Everything the delivery layer needs to know."""

    # --- replication: a slave's broker writes nothing of its own to the commitlog (no
    # delayed-message delivery, no transaction checks, no pop revive): its commitlog is
    # its master's, byte for byte (docs/ha.md)
    replica: bool = False

    # --- topics and groups
    auto_create_topic: bool = True
    auto_create_subscription_group: bool = True
    default_queue_nums: int = DEFAULT_QUEUE_NUMS
    # reject a message whose type (normal/FIFO/delay/transaction) the topic does not accept
    check_message_type: bool = False

    # --- produce
    max_message_size: int = DEFAULT_MAX_BODY_SIZE  # body bytes
    max_delay_ms: int = 3 * 86_400_000  # furthest TIMER_DELIVER_MS accepted, from now

    # --- retry / delay
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    schedule_interval_ms: int = 100  # how often the schedule service looks for due messages
    # send-back when the group has no config and auto-creation is on: these settings
    default_retry_max_times: int = DEFAULT_RETRY_MAX_TIMES

    # --- offsets and other metadata
    flush_offset_interval_ms: int = 5_000  # consumerOffset.json, delayOffset.json, pop state

    # --- pull / long polling
    max_pull_batch: int = 64
    long_poll_max_ms: int = 30_000

    # --- invisible-time consumption
    max_receive_batch: int = 32
    max_invisible_ms: int = MAX_INVISIBLE_MS
    pop_revive_interval_ms: int = 1_000  # sweep that dead-letters exhausted expired messages

    # --- transactions
    transaction_timeout_ms: int = 6_000  # a half message is checked once this old
    transaction_check_interval_ms: int = 60_000  # between checks of one half message
    transaction_check_max: int = 15  # then it is rolled back

    # --- consumer registry
    consumer_expiry_ms: int = 120_000  # a consumer without heartbeat for this long is gone

    @property
    def delay_levels_ms(self) -> tuple[int, ...]:
        return parse_delay_levels(self.message_delay_level)

    def validate(self) -> None:
        """Raise ConfigError for any value the broker cannot run with."""
        parse_delay_levels(self.message_delay_level)
        for name in (
            "default_queue_nums",
            "max_message_size",
            "schedule_interval_ms",
            "flush_offset_interval_ms",
            "max_pull_batch",
            "max_receive_batch",
            "max_invisible_ms",
            "pop_revive_interval_ms",
            "transaction_timeout_ms",
            "transaction_check_interval_ms",
            "consumer_expiry_ms",
            "max_delay_ms",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.default_queue_nums > 1024:
            raise ConfigError("default_queue_nums must be at most 1024")
        if self.default_retry_max_times < 0 or self.transaction_check_max < 0:
            raise ConfigError("retry and check maximums must not be negative")
        if self.long_poll_max_ms < 0:
            raise ConfigError("long_poll_max_ms must not be negative")
