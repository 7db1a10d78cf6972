"""Handlers for the `reliable consume` test: each processed message id goes to a file."""

from __future__ import annotations

import os

from reliable import ReceivedMessage, handler


@handler(
    "cli-orders",
    group="cli-g",
    consume_from="first",
    rebalance_interval_s=0.2,
    persist_offset_interval_s=3600,
)  # only the graceful shutdown commits offsets
def record(message: ReceivedMessage) -> None:
    fd = os.open(os.environ["RELIABLE_TEST_OUT"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, (message.message_id + "\n").encode())
    finally:
        os.close(fd)


not_a_handler = 42
