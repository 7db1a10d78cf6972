"""Well-known message property names (RocketMQ's `MessageConst`).

What a producer sets, the store indexes and the server and a consumer read: both ends of
the wire (and the outbox's stubs) name them from here.
"""

from __future__ import annotations


class Prop:
    """Well-known property names (RocketMQ's `MessageConst`)."""

    KEYS = "KEYS"  # space-separated business keys, each indexed
    TAGS = "TAGS"
    UNIQ_KEY = "UNIQ_CLIENT_MESSAGE_ID_KEYIDX"  # client-generated unique id, indexed
    DELAY = "DELAY"  # delay level (1-based)
    TIMER_DELIVER_MS = "TIMER_DELIVER_MS"  # absolute delivery time in ms
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QID = "REAL_QID"
    RETRY_TOPIC = "RETRY_TOPIC"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    ORIGIN_COMMITLOG_OFFSET = "ORIGIN_COMMITLOG_OFFSET"
    RECONSUME_TIME = "RECONSUME_TIME"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    TRAN_MSG = "TRAN_MSG"
    PRODUCER_GROUP = "PGROUP"
    TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    SHARDING_KEY = "__SHARDINGKEY"  # message group for ordered messages
    MIN_OFFSET = "MIN_OFFSET"
    MAX_OFFSET = "MAX_OFFSET"
    WAIT_STORE_MSG_OK = "WAIT"
    DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
    DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
