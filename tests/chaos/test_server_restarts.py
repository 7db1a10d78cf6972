"""SIGKILL `reliable broker start --flush sync` five times in a row while the framework's
producer and simple consumer (grpc transport: over gRPC, and over the native wire) keep
working through it.

After every restart the producer that lived through the kills gets a send through within
two seconds of the server serving again, whatever the restarts before did to its
connections (gRPC's own reconnect backoff grows to 120 s; the transport caps it at 1 s);
after the last one the consumer that also lived through them receives every message whose
send was acknowledged.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol.ports import free_port
from reliable import Message, Producer, SimpleConsumer
from tests.e2e.grpc.server_process import ServerProcess
from tests.e2e.helpers import wait_until

KILLS = 5
OFFICIAL_KILLS = 3  # each one down for 5 s
BACK_WITHIN_S = 2.0  # from the server's ready line to the surviving client's first success
SERVER = (
    "--flush",
    "sync",
    "--min-invisible-ms",
    "1000",
    "--long-polling-ms",
    "1000",
    "--min-long-polling-ms",
    "500",
)


class Sender:
    """A thread sending one message after another; the time of each acknowledged send."""

    def __init__(self, producer: Producer, topic: str) -> None:
        self.producer, self.topic = producer, topic
        self.acked: dict[bytes, float] = {}
        self.failed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        i = 0
        while not self.stop.is_set():
            body = f"m{i}".encode()
            i += 1
            try:
                self.producer.send(Message(self.topic, body))
            except Exception:  # the server is down: not acknowledged, the next one tries
                self.failed += 1
                time.sleep(0.01)
                continue
            self.acked[body] = time.monotonic()

    def first_ack_after(self, since: float) -> float | None:
        later = [t for t in list(self.acked.values()) if t >= since]
        return min(later) if later else None


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("wire", ["grpc", "native"])
def test_clients_ride_through_five_kills_in_a_row(
    tmp_path: Path, client_home: Path, wire: str, seed: int
) -> None:
    rng = random.Random(seed)
    store = tmp_path / "store"
    wire_port = free_port()
    extra = (*SERVER, "--wire-port", str(wire_port))
    server = ServerProcess(store, client_home, *extra).start()
    topic, group = f"t-restarts-{wire}", f"g-restarts-{wire}"
    producer = Producer(
        "grpc",
        endpoint=server.endpoint,
        wire=wire,
        retry_times_when_send_failed=0,  # the transport's reconnect, not the retry policy
        send_timeout_s=2.0,
    )
    consumer = SimpleConsumer(
        group,
        {topic: "*"},
        transport="grpc",
        endpoint=server.endpoint,
        wire=wire,
        await_duration_s=0.5,
        invisible_duration_s=30,
    )
    sender = Sender(producer, topic)
    delays: list[float] = []
    try:
        producer.start()
        consumer.start()
        sender.thread.start()
        wait_until(lambda: len(sender.acked) >= 20, timeout=30, what="the first sends")
        consumer.receive(8)  # its channel is open before the kills too
        for _ in range(KILLS):
            # a kill at a random moment of the sends' flow
            time.sleep(rng.uniform(0.05, 0.4))
            server.kill()
            down = time.monotonic()
            server = ServerProcess(store, client_home, *extra, port=server.port).start()
            ready = time.monotonic()
            wait_until(
                lambda since=down: sender.first_ack_after(since) is not None,  # type: ignore[misc]
                timeout=30,
                what="a send after the restart",
            )
            back = sender.first_ack_after(down)
            assert back is not None
            delays.append(max(0.0, back - ready))
        assert max(delays) <= BACK_WITHIN_S, (delays, seed)

        # the consumer that lived through the kills gets through at once too
        ready = time.monotonic()
        consumer.receive(1)
        assert time.monotonic() - ready <= BACK_WITHIN_S + 0.5  # its long poll included
        sender.stop.set()
        sender.thread.join(10)
        acked = set(sender.acked)
        got: set[bytes] = set()

        def everything() -> bool:
            for m in consumer.receive(32):
                got.add(m.body)
                consumer.ack(m)
            return acked <= got

        wait_until(everything, timeout=60, what="every acknowledged message")
        assert acked <= got, (len(acked - got), seed)
    finally:
        sender.stop.set()
        for client in (consumer, producer):
            with contextlib.suppress(Exception):  # the server may be gone: no goodbye lands
                client.shutdown()
        server.kill()


# What docs/server.md ("Restarts") tells users of the official Python client to run before
# making a client: the client builds its channels itself, with gRPC's default reconnect
# backoff (1 s growing 1.6x a failure to 120 s).
OFFICIAL_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    ("grpc.min_reconnect_backoff_ms", 5_000),
]


@contextlib.contextmanager
def official_reconnect_capped() -> Iterator[None]:
    import grpc.aio

    made = grpc.aio.insecure_channel

    def insecure_channel(target: str, options: Any = None, *args: Any, **kw: Any) -> Any:
        return made(target, [*(options or ()), *OFFICIAL_RECONNECT], *args, **kw)

    grpc.aio.insecure_channel = insecure_channel
    try:
        yield
    finally:
        grpc.aio.insecure_channel = made


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_official_simple_consumer_with_the_documented_setting_rides_through_kills(
    tmp_path: Path, client_home: Path, seed: int
) -> None:
    """The official SimpleConsumer that lived through kills in a row, each leaving the
    server down 5 s, receives within two seconds of the server serving again (and its
    long poll). Without the setting gRPC's backoff outgrows the outage: measured, 2.6-4.7 s
    after each return."""
    from tests.e2e.grpc import official

    rng = random.Random(seed)
    server = ServerProcess(tmp_path / "store", client_home, *SERVER).start()
    topic, group = "t-restarts-official", "g-restarts-official"
    with official_reconnect_capped():
        producer = official.producer(server.endpoint, [topic])
        consumer = official.simple_consumer(server.endpoint, group, topic, await_s=1)
    try:
        sent = {
            producer.send(official.message(topic, f"m{i}".encode())).message_id for i in range(5)
        }
        delays: list[float] = []
        for _ in range(OFFICIAL_KILLS):
            server.kill()
            stop = threading.Event()

            def poll(stop: threading.Event = stop) -> None:  # the consumer keeps trying
                while not stop.is_set():
                    with contextlib.suppress(Exception):
                        consumer.receive(1, 15)
                    time.sleep(0.05)

            poller = threading.Thread(target=poll, daemon=True)
            poller.start()
            # down as long as a loaded machine's restart took: the attempts meanwhile fail,
            # and gRPC's default backoff (attempts 1, 2.6, 5.2, 9.3 s after the loss, 20%
            # jitter) would next try seconds after the server's return
            time.sleep(rng.uniform(4.5, 5.5))
            stop.set()
            poller.join(30)
            server = ServerProcess(tmp_path / "store", client_home, *SERVER, port=server.port)
            server.start()
            ready = time.monotonic()
            while True:
                try:
                    got = consumer.receive(32, 15)
                    break
                except Exception:
                    assert time.monotonic() - ready < 30, "the consumer never got back"
                    time.sleep(0.02)
            delays.append(time.monotonic() - ready)
            for m in got:
                consumer.ack(m)
                sent.discard(m.message_id)
        # a receive waits up to its long poll (1 s here) when nothing is left
        assert max(delays) <= BACK_WITHIN_S + 1.0, (delays, seed)
        rest = official.receive_until(
            consumer, lambda g: sent <= {m.message_id for m in g}, timeout_s=30
        )
        assert sent <= {m.message_id for m in rest}
    finally:
        for client in (consumer, producer):
            with contextlib.suppress(Exception):
                client.shutdown()
        server.kill()
