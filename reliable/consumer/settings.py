"""A push consumer's settings: one validated value shared by its engines."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from protocol.limits import DEFAULT_RETRY_MAX_TIMES
from reliable.consumer.listener import MessageModel
from reliable.consumer.rebalance import AllocateStrategy, allocate_averagely
from reliable.errors import ConfigurationError
from reliable.transport.base import ConsumeFrom, QueueRef


@dataclass(frozen=True)
class ConsumerSettings:
    message_model: MessageModel = MessageModel.CLUSTERING
    orderly: bool = False
    consume_threads: int = 20
    consume_batch_size: int = 1
    pull_batch_size: int = 32
    pull_threshold_for_queue: int = 1000  # back-pressure: max cached messages per queue
    pull_suspend_ms: int = 1000  # long poll
    pull_error_delay_s: float = 1.0
    allocate: AllocateStrategy[QueueRef] = field(default=allocate_averagely)
    rebalance_interval_s: float = 20.0
    heartbeat_interval_s: float = 10.0
    persist_offset_interval_s: float = 5.0
    max_reconsume_times: int = DEFAULT_RETRY_MAX_TIMES
    send_back_retry_s: float = 5.0  # local retry when the send-back itself fails
    suspend_ms: int = 3000  # orderly: pause before a local retry
    consume_from: ConsumeFrom = ConsumeFrom.LAST
    consume_timestamp_ms: int | None = None
    # where a server cannot set a new group's start (an Apache RocketMQ proxy): False, a
    # `consume_from` other than LAST refuses to start; True, it is a preference, logged
    # and left to the server's default (`dlq_handler`'s FIRST)
    consume_from_preferred: bool = False
    local_offset_path: Path | None = None  # broadcasting offsets
    # invisible-time engine (transports without pull)
    invisible_ms: int = 30_000
    receive_long_poll_ms: int = 5_000
    shutdown_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        positive = (
            "consume_threads",
            "consume_batch_size",
            "pull_batch_size",
            "pull_threshold_for_queue",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_reconsume_times < 0:
            raise ConfigurationError("max_reconsume_times must be >= 0")
        nonneg = (
            "pull_suspend_ms",
            "suspend_ms",
            "rebalance_interval_s",
            "heartbeat_interval_s",
            "persist_offset_interval_s",
            "send_back_retry_s",
            "pull_error_delay_s",
        )
        for name in nonneg:
            if getattr(self, name) < 0:
                raise ConfigurationError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not isinstance(self.message_model, MessageModel):
            raise ConfigurationError(
                f"message_model must be a MessageModel, got {self.message_model!r}"
            )
        if not isinstance(self.consume_from, ConsumeFrom):
            raise ConfigurationError(
                f"consume_from must be a ConsumeFrom, got {self.consume_from!r}"
            )
