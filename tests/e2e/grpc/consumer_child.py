"""A framework consumer in its own process, for tests that SIGKILL it.

    python -m tests.e2e.grpc.consumer_child ENDPOINT GROUP TOPIC

Consumes over the grpc transport with two handler threads whose handler never returns;
prints `handling <message id>` as each message reaches the handler.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence

from reliable import ConsumeContext, ConsumeFrom, ConsumeResult, PushConsumer, ReceivedMessage


def main(endpoint: str, group: str, topic: str) -> None:
    forever = threading.Event()

    def listener(messages: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeResult:
        for m in messages:
            # one write with its newline: print() writes the end apart, so two handler
            # threads could interleave into one line ("handling Ahandling B")
            sys.stdout.write(f"handling {m.message_id}\n")
            sys.stdout.flush()
        forever.wait()
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(
        group,
        listener,
        {topic: "*"},
        transport="grpc",
        endpoint=endpoint,
        consume_from=ConsumeFrom.FIRST,
        consume_threads=2,
        receive_long_poll_ms=1000,
        invisible_ms=30_000,
    )
    consumer.start()
    print("started", flush=True)
    forever.wait()


if __name__ == "__main__":
    main(*sys.argv[1:4])
