"""The limits and defaults every layer shares, each defined once (RocketMQ's values).

The broker's configuration values (`broker.config.BrokerConfig`,
`broker.server.config.ServerConfig`, `broker.store.config.StoreConfig`), the client's
(`reliable`), the outbox's and the command line's options take their defaults from here, so
that a default changed here changes everywhere at once; `tests/unit/test_limits_defined_once.py`
fails when one of these literals is written a second time outside the tests.

This module imports nothing: any layer may import it, and a gRPC client does not load the
broker by doing so.
"""

from __future__ import annotations

# The largest message body accepted, bytes: a body of exactly this size is stored, a larger
# one refused (MESSAGE_BODY_TOO_LARGE). RocketMQ's `maxMessageSize` and its proxy's
# `maxMessageSize`; a client is told it in the Settings reply (`publishing.max_body_size`).
DEFAULT_MAX_BODY_SIZE = 4 * 1024 * 1024  # 4 MiB

# Retries after the first delivery before a message goes to `%DLQ%<group>`: a subscription
# group's `retryMaxTimes` (RocketMQ's broker) and a consumer's `maxReconsumeTimes` (its clients).
DEFAULT_RETRY_MAX_TIMES = 16

# Queues of a topic created without a count (auto-created, or by an admin call): read and
# write queues alike (RocketMQ's `defaultTopicQueueNums`).
DEFAULT_QUEUE_NUMS = 4

# The longest invisible time a receive may ask for (the proxy's `maxInvisibleTimeMills`):
# longer would keep a message from redelivery for more than half a day.
MAX_INVISIBLE_MS = 12 * 3_600_000  # 12 h
