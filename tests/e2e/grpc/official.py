"""Thin helpers around the official RocketMQ 5 Python client (imported lazily, see conftest)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def client_home(home: Path) -> Iterator[Path]:
    """HOME is `home` while the official client is imported and used: it writes its log under
    `$HOME/logs/rocketmq_python/` from the moment it is imported. HOME is set back on exit."""
    old = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    import rocketmq  # noqa: F401  (its log directory now lands in the temporary home)

    yield home
    if old is not None:
        os.environ["HOME"] = old


def _caller_has_an_event_loop() -> None:
    """The official client makes its telemetry stream on the calling thread, where grpc.aio
    asks for that thread's event loop. After an `asyncio.run` on the thread (which leaves it
    none) that fails ("There is no current event loop in thread 'MainThread'") and the
    client starts without a route. Give the thread a loop to find, as a fresh thread has;
    the client's calls run on its own I/O loop, never on this one."""
    policy = asyncio.get_event_loop_policy()
    try:
        policy.get_event_loop()
    except RuntimeError:
        policy.set_event_loop(policy.new_event_loop())


def configuration(endpoint: str, *, ak: str = "", sk: str = "") -> Any:
    from rocketmq import ClientConfiguration, Credentials

    _caller_has_an_event_loop()
    return ClientConfiguration(endpoint, Credentials(ak, sk))


def producer(endpoint: str, topics: list[str], checker: Any = None, **kw: Any) -> Any:
    from rocketmq import Producer

    p = Producer(configuration(endpoint, **kw), topics, checker)
    p.startup()
    return p


def simple_consumer(
    endpoint: str, group: str, topic: str, tag: str = "*", await_s: int = 2, **kw: Any
) -> Any:
    from rocketmq import FilterExpression, SimpleConsumer

    c = SimpleConsumer(
        configuration(endpoint, **kw), group, {topic: FilterExpression(tag)}, await_duration=await_s
    )
    c.startup()
    return c


def message(
    topic: str,
    body: bytes,
    *,
    tag: str | None = None,
    keys: list[str] | None = None,
    props: dict[str, str] | None = None,
    group: str | None = None,
    deliver_at_s: int | None = None,
) -> Any:
    from rocketmq import Message

    m = Message()
    m.topic = topic
    m.body = body
    if tag:
        m.tag = tag
    for key in keys or []:
        m.keys = key  # the client's setter takes one key per assignment
    for name, value in (props or {}).items():
        m.add_property(name, value)
    if group:
        m.message_group = group
    if deliver_at_s is not None:
        m.delivery_timestamp = deliver_at_s
    return m


def receive_until(
    consumer: Any,
    done: Callable[[list[Any]], bool],
    *,
    timeout_s: float = 30,
    invisible_s: int = 15,
    ack: bool = True,
    batch: int = 32,
) -> list[Any]:
    """Receive (and ack) until `done(all received)` or the deadline."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while not done(got) and time.monotonic() < deadline:
        for m in consumer.receive(batch, invisible_s):
            got.append(m)
            if ack:
                consumer.ack(m)
    return got


def wait_for(
    predicate: Callable[[], bool], timeout_s: float = 30, interval_s: float = 0.05
) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
