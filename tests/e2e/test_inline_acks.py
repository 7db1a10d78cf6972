"""Batched acks over the in-process broker (`reliable._acks`, a transport with inline acks):
the caller whose ack fills a batch sends it itself, a partial batch waits the linger (the
batcher's thread is not woken to send each first ack alone), `flush` and `ack_many` send
at once, and every ack lands: none of the acked messages comes back."""

from __future__ import annotations

import time

from reliable import ReceivedMessage, SimpleConsumer, Transport
from reliable._acks import AckBatcher
from tests.e2e.helpers import sent_and_received


def _received(transport: Transport, topic: str, group: str, n: int) -> list[ReceivedMessage]:
    return sent_and_received(transport, topic, group, n, invisible_s=2)


def test_a_full_batch_leaves_with_its_caller_and_a_partial_one_after_the_linger(
    transport: Transport,
) -> None:
    got = _received(transport, "inline-acks", "inline-acks-g", 10)
    acks = AckBatcher(transport, "inline-acks-g", linger_ms=300, batch_size=4)
    try:
        futures = [acks.ack(m) for m in got]
        # two full batches were sent by this thread, in its ack calls
        assert acks.requests == 2 and all(f.done() for f in futures[:8])
        assert [f.result() for f in futures[:8]] == [None] * 8
        time.sleep(0.1)
        assert not futures[8].done() and not futures[9].done()  # the linger, not the idle pipe
        assert futures[9].result(timeout=5) is None  # then the thread sends the rest
        assert acks.requests == 3
    finally:
        acks.close()
    with SimpleConsumer(
        "inline-acks-g", {"inline-acks": "*"}, transport=transport, await_duration_s=1
    ) as consumer:
        time.sleep(2.5)  # past the receive's invisible time: nothing acked comes back
        assert consumer.receive(32) == []


def test_flush_and_ack_many_send_what_waits_at_once(transport: Transport) -> None:
    got = _received(transport, "inline-flush", "inline-flush-g", 3)
    acks = AckBatcher(transport, "inline-flush-g", linger_ms=60_000, batch_size=256)
    try:
        futures = [acks.ack(m) for m in got[:2]]
        time.sleep(0.05)
        assert not any(f.done() for f in futures)
        acks.flush()
        assert [f.result(timeout=0) for f in futures] == [None, None]
    finally:
        acks.close()
    with SimpleConsumer(
        "inline-flush-g", {"inline-flush": "*"}, transport=transport, await_duration_s=1
    ) as consumer:
        started = time.monotonic()
        assert consumer.ack_many(got[2:]) == [None]
        assert time.monotonic() - started < 0.5
        time.sleep(2.5)
        assert consumer.receive(32) == []
