"""End-to-end helpers: a real embedded broker on a small store, and polling with deadlines.

Delay levels are milliseconds instead of minutes and the client's intervals are short, so the
retry ladder, rebalancing and check-backs play out in seconds.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from broker.broker import Broker
from broker.config import BrokerConfig
from broker.store.config import SHIPPED_WATERMARKS, WATERMARKS_OFF, StoreConfig
from reliable import ConsumeFrom

# level:      1     2     3     4     5     6   7...
FAST_LEVELS = "100ms 200ms 300ms 500ms 800ms 1s " + " ".join(["1s"] * 12)
LEVEL_MS = [100, 200, 300, 500, 800, 1000] + [1000] * 12

# consumer settings that make rebalancing, offset commits and local retries quick
FAST: dict[str, Any] = {
    "rebalance_interval_s": 0.2,
    "heartbeat_interval_s": 0.2,
    "persist_offset_interval_s": 0.2,
    "pull_suspend_ms": 200,
    "pull_error_delay_s": 0.1,
    "suspend_ms": 20,
    "send_back_retry_s": 0.2,
    "consume_from": ConsumeFrom.FIRST,
    "consume_threads": 4,
}


def store_config(path: Path, **overrides: Any) -> StoreConfig:
    values: dict[str, Any] = {
        "store_dir": path,
        "mapped_file_size_commitlog": 4 * 1024 * 1024,
        "mapped_file_size_consume_queue": 20 * 20_000,
        "max_hash_slot_num": 4096,
        "max_index_num": 16_384,
        "flush_interval_commitlog_ms": 50,
        "flush_interval_consume_queue_ms": 50,
        "flush_config_interval_ms": 200,
        "warm_mapped_file": False,
        **WATERMARKS_OFF,
    }
    values.update(overrides)
    return StoreConfig(**values)


def broker_config(**overrides: Any) -> BrokerConfig:
    values: dict[str, Any] = {
        "message_delay_level": FAST_LEVELS,
        "schedule_interval_ms": 20,
        "flush_offset_interval_ms": 200,
        "pop_revive_interval_ms": 50,
        "transaction_timeout_ms": 300,
        "transaction_check_interval_ms": 300,
        "transaction_check_max": 5,
        "consumer_expiry_ms": 3_000,
    }
    values.update(overrides)
    return BrokerConfig(**values)


@contextlib.contextmanager
def running_broker(store_dir: Path, **broker_kw: Any) -> Iterator[Broker]:
    """A started `Broker` on `store_config(store_dir)` and `broker_config()`, shut down on exit."""
    # the host's disk is shared: store_config switches the watermarks off, and a test that
    # injects a disk level gets the shipped ones back
    shipped = SHIPPED_WATERMARKS if "disk_usage" in broker_kw else {}
    b = Broker(store_config(store_dir, **shipped), broker_config(), **broker_kw)
    b.start()
    yield b
    b.shutdown()


class Disk:
    """The store's disk-usage seam: a settable used ratio."""

    def __init__(self) -> None:
        self.used = 0.5

    def __call__(self, path: Path) -> float:
        return self.used


def fill(broker: Broker, disk: Disk, used: float) -> None:
    disk.used = used
    broker.store.cleanup.check_disk()  # what the cleanup service's next pass does


def wait_until(
    predicate: Callable[[], bool], timeout: float = 20.0, what: str = "condition"
) -> None:
    """Poll `predicate` until it holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def stays(predicate: Callable[[], bool], seconds: float) -> bool:
    """`predicate` holds for the whole window (to show that something does NOT happen)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not predicate():
            return False
        time.sleep(0.02)
    return predicate()


def read_group(
    endpoint: str,
    topic: str,
    group: str,
    until: Callable[[list[Any]], bool],
    *,
    timeout_s: float = 30.0,
    **transport: Any,
) -> list[Any]:
    """Every message `group` receives (and acknowledges) from `topic` at `endpoint`, over
    the grpc transport, until `until(received)` holds or `timeout_s` passes; in the order
    received, a redelivery as often as it came."""
    from reliable import SimpleConsumer

    received: list[Any] = []
    with SimpleConsumer(
        group,
        {topic: "*"},
        transport="grpc",
        endpoint=endpoint,
        await_duration_s=1.0,
        **transport,
    ) as consumer:
        deadline = time.monotonic() + timeout_s
        while not until(received) and time.monotonic() < deadline:
            for m in consumer.receive(32):
                received.append(m)
                consumer.ack(m)
    return received


def sent_and_received(
    transport: Any, topic: str, group: str, n: int, *, invisible_s: float
) -> list[Any]:
    """`n` messages sent to `topic` and received by `group` through `transport`, not
    acknowledged (each invisible for `invisible_s`): for tests of what acks do."""
    from reliable import Message, Producer, SimpleConsumer

    with Producer(transport) as producer:
        for i in range(n):
            producer.send(Message(topic, b"m%d" % i))
    got: list[Any] = []
    with SimpleConsumer(
        group,
        {topic: "*"},
        transport=transport,
        await_duration_s=1,
        invisible_duration_s=invisible_s,
    ) as consumer:
        wait_until(lambda: bool(got.extend(consumer.receive(32))) or len(got) >= n, what="all")
    assert len(got) == n
    return got
