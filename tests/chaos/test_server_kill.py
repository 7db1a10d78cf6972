"""SIGKILL the gRPC server under --flush sync while the official producer sends.

After a restart on the same store and port, every message whose send was acknowledged is
delivered, and no message a consumer acknowledged before the kill is delivered again.
"""

from __future__ import annotations

import contextlib
import random
import threading
from pathlib import Path

import pytest

from tests.e2e.grpc import official
from tests.e2e.grpc.server_process import ServerProcess

FAST = ("--min-invisible-ms", "1000", "--min-long-polling-ms", "1000", "--long-polling-ms", "5000")


@pytest.mark.chaos
@pytest.mark.slow
def test_sigkill_under_sync_flush_loses_no_acknowledged_message(
    tmp_path: Path, client_home: Path, seed: int
) -> None:
    rng = random.Random(seed)
    store = tmp_path / "store"
    server = ServerProcess(store, client_home, "--flush", "sync", *FAST).start()
    acked_sends: list[str] = []
    acked_by_consumer: set[str] = set()
    try:
        producer = official.producer(server.endpoint, ["t-kill"])
        consumer = official.simple_consumer(server.endpoint, "g-kill", "t-kill")
        for i in range(100):
            acked_sends.append(
                producer.send(official.message("t-kill", f"a{i}".encode())).message_id
            )
        # the consumer finishes part of them before the crash
        for m in official.receive_until(consumer, lambda g: len(g) >= 40, batch=8):
            acked_by_consumer.add(m.message_id)  # receive_until acked it: ack returned OK

        stop = threading.Event()
        errors: list[BaseException] = []

        def keep_sending() -> None:
            i = 0
            while not stop.is_set():
                try:
                    receipt = producer.send(official.message("t-kill", f"b{i}".encode()))
                    acked_sends.append(receipt.message_id)
                except Exception as exc:  # the server died under us: not acknowledged
                    errors.append(exc)
                    if not server.alive():
                        return
                i += 1

        sender = threading.Thread(target=keep_sending, daemon=True)
        sender.start()
        target = len(acked_sends) + rng.randrange(50, 300)
        assert official.wait_for(lambda: len(acked_sends) >= target, timeout_s=60)
        server.kill()
        stop.set()
        sender.join(30)
        assert not sender.is_alive()
        for client in (producer, consumer):
            with contextlib.suppress(Exception):  # the server is gone: no goodbye lands
                client.shutdown()
        acked_before_kill = list(acked_sends)

        server = ServerProcess(
            store, client_home, "--flush", "sync", *FAST, port=server.port
        ).start()
        consumer = official.simple_consumer(server.endpoint, "g-kill", "t-kill")
        try:
            expected = set(acked_before_kill) - acked_by_consumer
            got = official.receive_until(
                consumer, lambda g: expected <= {m.message_id for m in g}, timeout_s=60
            )
            received = [m.message_id for m in got]
        finally:
            consumer.shutdown()
        missing = expected - set(received)
        assert not missing, f"{len(missing)} acknowledged messages lost (seed {seed})"
        again = acked_by_consumer & set(received)
        assert not again, f"{len(again)} acknowledged deliveries came back (seed {seed})"
    finally:
        server.kill()
