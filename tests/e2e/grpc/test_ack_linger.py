"""Acks that wait for company on an idle pipe (`AckBatcher(linger_when_idle=True)`, the
push consumer's): against a server process, over gRPC and over the native wire, acks made
one after another within the linger leave as one request, each future gets its own
entry's outcome from the server, and `close()` sends what still waits. Without it, an ack
on an idle pipe leaves at once."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from reliable import ReceivedMessage, Transport
from reliable._acks import AckBatcher
from tests.e2e.grpc.conftest import open_transport
from tests.e2e.helpers import sent_and_received


@pytest.fixture(params=["grpc", "wire"])
def remote(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Transport]:
    yield from open_transport(request, request.param, tmp_path)


def _received(transport: Transport, n: int) -> tuple[str, list[ReceivedMessage]]:
    topic, group = f"linger-{uuid.uuid4().hex[:8]}", f"linger-g-{uuid.uuid4().hex[:8]}"
    return group, sent_and_received(transport, topic, group, n, invisible_s=60)


def test_acks_on_an_idle_pipe_wait_the_linger_together(remote: Transport) -> None:
    group, got = _received(remote, 6)
    lingering = AckBatcher(remote, group, linger_ms=1_000, linger_when_idle=True)
    try:
        futures = []
        for m in got[:3]:
            futures.append(lingering.ack(m))
            time.sleep(0.02)
        assert not any(f.done() for f in futures)  # nothing in flight, and still waiting
        assert [f.result(timeout=10) for f in futures] == [None, None, None]
        assert lingering.requests == 1
    finally:
        lingering.close()

    at_once = AckBatcher(remote, group, linger_ms=10_000)
    try:
        assert at_once.ack(got[3]).result(timeout=5) is None  # well before its linger
        assert at_once.requests == 1
    finally:
        at_once.close()

    closing = AckBatcher(remote, group, linger_ms=60_000, linger_when_idle=True)
    waiting = [closing.ack(m) for m in got[4:]]
    closing.close()  # sends what waits, and waits for the answer
    assert [f.result(timeout=0) for f in waiting] == [None, None]
    assert closing.requests == 1
