"""Names, a started transport and a drain loop for the interop modules."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import reliable
from reliable import ReceivedMessage, SimpleConsumer
from reliable.errors import TransportError
from reliable.transport.base import Transport

# The session's broker checks half messages every second and asks about those older than
# 2 s (RocketMQ's defaults: every 30 s, older than 6 s), so a check-back test takes seconds.
# It writes a transaction's end (its op message) within 0.5 s, not 3 s: a half message is
# checked only while no end of it is written, so the end must come before the check.
# Recall is off by default in Apache RocketMQ (`recallMessageEnable`).
TRANSACTION_TIMEOUT_MS = 2000
BROKER_OPTIONS: dict[str, object] = {
    "transactionCheckInterval": 1000,
    "transactionTimeOut": TRANSACTION_TIMEOUT_MS,
    "transactionOpBatchInterval": 500,
    "recallMessageEnable": True,
}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@contextmanager
def grpc_transport(endpoint: str) -> Iterator[Transport]:
    transport = reliable.connect("grpc", endpoint=endpoint)
    transport.start()
    try:
        yield transport
    finally:
        transport.close()


def receive(consumer: SimpleConsumer, max_messages: int = 16) -> list[ReceivedMessage]:
    """One receive; a long poll the proxy answered after its deadline (a loaded machine)
    is an empty receive, asked again by the caller's loop."""
    try:
        return consumer.receive(max_messages=max_messages)
    except TransportError:
        return []


def drain(
    consumer: SimpleConsumer,
    want: int,
    *,
    timeout_s: float = 30.0,
    on_message: Callable[[ReceivedMessage], None] | None = None,
) -> list[ReceivedMessage]:
    """Receive and ack until `want` messages came (or the timeout): what came, in order."""
    got: list[ReceivedMessage] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        for m in receive(consumer):
            if on_message is not None:
                on_message(m)
            consumer.ack(m)
            got.append(m)
    return got


def wait_for(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
