"""In-flight state survives a SIGKILL of the server under --flush sync.

A message received (not yet acked) keeps its lease across the crash: it is not handed to
anyone else while its invisible time runs, and the receipt handle issued before the crash
still acknowledges it afterwards. Acks made before the crash stay made.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.grpc import official
from tests.e2e.grpc.server_process import ServerProcess

FAST = (
    "--min-invisible-ms",
    "1000",
    "--min-long-polling-ms",
    "1000",
    "--long-polling-ms",
    "5000",
    "--flush",
    "sync",
)


def ack_when_reconnected(consumer: object, message: object, timeout_s: float = 60) -> None:
    """Ack, retrying only while the client's channel has not reconnected yet (gRPC backs off
    between reconnection attempts); a refused handle fails at once."""
    from rocketmq.v5.exception import BadRequestException

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            consumer.ack(message)  # type: ignore[attr-defined]
            return
        except BadRequestException:
            raise
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.chaos
def test_leases_and_acks_survive_sigkill(tmp_path: Path, client_home: Path) -> None:
    store = tmp_path / "store"
    server = ServerProcess(store, client_home, *FAST).start()
    try:
        producer = official.producer(server.endpoint, ["t-inflight"])
        consumer = official.simple_consumer(server.endpoint, "g-inflight", "t-inflight")
        sent = [
            producer.send(official.message("t-inflight", f"{i}".encode())).message_id
            for i in range(6)
        ]
        held = official.receive_until(consumer, lambda g: len(g) >= 6, invisible_s=60, ack=False)
        assert sorted(m.message_id for m in held) == sorted(sent)
        for m in held[:3]:
            consumer.ack(m)  # done before the crash
        server.kill()
        server = ServerProcess(store, client_home, *FAST, port=server.port).start()

        other = official.simple_consumer(server.endpoint, "g-inflight", "t-inflight")
        try:
            assert other.receive(32, 2) == []  # leased or acked: nothing to hand out
        finally:
            other.shutdown()
        for m in held[3:]:  # the pre-crash handles still work
            ack_when_reconnected(consumer, m)
        assert consumer.receive(32, 2) == []
        producer.shutdown()
        consumer.shutdown()
    finally:
        server.kill()
