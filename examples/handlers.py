"""Handler decorators: plain functions become consumers.

Return = success; raise = retry later (on the delay ladder); `RetryLater(delay_level=n)` picks
the level; `Discard` finishes a message that retrying cannot help; after the last retry the
message lands in the group's dead-letter queue, which has its own handler.

    python examples/handlers.py [STORE_DIR]
"""

from __future__ import annotations

import logging
import sys
import tempfile
import threading

from reliable import Discard, Message, ReceivedMessage, RetryLater, Worker, dlq_handler, handler

# a small store and a fast retry ladder, so the demo runs in seconds
STORE = {
    "mapped_file_size_commitlog": 16 << 20,
    "max_hash_slot_num": 25_000,
    "max_index_num": 100_000,
    "delay_levels": "100ms 200ms 300ms 500ms 800ms 1s",
}

done = threading.Event()
log: list[str] = []


@handler(
    "orders",
    group="billing",
    max_reconsume_times=2,
    rate_limit=200,
    ignore_on=KeyError,
    consume_from="first",
)
def bill(message: ReceivedMessage) -> None:
    order = message.body.decode()
    if order == "cancelled":
        raise Discard("order was cancelled")  # done, never retried
    if order == "flaky" and message.reconsume_times < 2:
        raise ConnectionError("payment gateway timeout")  # retried on the ladder
    if order == "not-yet" and message.reconsume_times == 0:
        raise RetryLater("stock not reserved", delay_level=1)  # retried at level 1
    if order == "broken":
        raise ValueError("unparseable order")  # retried, then dead-lettered
    log.append(f"billed {order} (attempt {message.delivery_attempt})")


@dlq_handler("billing")
def dead_orders(message: ReceivedMessage) -> None:
    origin = message.properties["DLQ_ORIGIN_TOPIC"]
    log.append(f"dead letter: {message.body.decode()} from {origin}")
    done.set()


def main(store_dir: str) -> int:
    with Worker(bill, dead_orders, store_dir=store_dir, **STORE) as worker:
        with worker.producer() as producer:
            for order in ("ok", "cancelled", "flaky", "not-yet", "broken"):
                producer.send(Message("orders", order.encode()))
        if not done.wait(30):
            print("the dead letter did not arrive", file=sys.stderr)
            return 1
    for line in sorted(log):
        print(line)
    return 0


if __name__ == "__main__":
    # handler failures are logged as warnings with tracebacks; keep the demo's output short
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else tmp))
