"""Handlers for the production-topology tests (`reliable consume` processes, one per group).

    reliable consume tests.e2e.grpc.topology_handlers:inventory --endpoint HOST:PORT
    reliable consume tests.e2e.grpc.topology_handlers:billing --endpoint HOST:PORT
    reliable consume tests.e2e.grpc.topology_handlers:billing_careless --endpoint HOST:PORT

`inventory` and `billing` are idempotent handlers: an `IdempotencyGuard` built, when the
consumer first needs it, from the default guard's variables (`RELIABLE_DATABASE_URL`,
`RELIABLE_REDIS_URL`, `RELIABLE_TABLE_PREFIX`) with a lease of `TOPOLOGY_LEASE_S` seconds (a
killed consumer's message is taken over once its lease ran out); each writes one effect row,
`(message_id, consumer_group)`, in the guard's transaction. `billing_careless` is the bug
the resend worker exists for: billing's group acknowledging every message without
processing it (no effect, no confirmation).

Every delivery a handler is asked to process (before the guard decides anything) is
appended to `$TOPOLOGY_OUT/<group>.deliveries` (careless: `<group>.careless`) as
`<message id> <send count>`, the send count being the outbox's `OUTBOX_SEND_COUNT` (1 for a
first send): so a test sees which copies reached which group, duplicates included.

Names come from the environment (the test's own): `TOPOLOGY_TOPIC`, `TOPOLOGY_GROUP_A`,
`TOPOLOGY_GROUP_B`, `TOPOLOGY_EFFECTS` (the effect table), `TOPOLOGY_DELAY_S` (each handler
run's time, to give a kill something to interrupt).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from reliable import ReceivedMessage, handler
from reliable.idempotent import DefaultGuard
from reliable.message import ConsumeResult

TOPIC = os.environ.get("TOPOLOGY_TOPIC", "topology-orders")
GROUP_A = os.environ.get("TOPOLOGY_GROUP_A", "topology-inventory")
GROUP_B = os.environ.get("TOPOLOGY_GROUP_B", "topology-billing")
EFFECTS = os.environ.get("TOPOLOGY_EFFECTS", "topology_effects")
DELAY_S = float(os.environ.get("TOPOLOGY_DELAY_S", "0"))

CONSUMER: dict[str, Any] = {
    "consume_from": "first",
    "consume_threads": 4,
    "invisible_ms": 4_000,
    "receive_long_poll_ms": 1_000,
    "max_reconsume_times": 16,
}


def _record(name: str, message: ReceivedMessage) -> None:
    out = Path(os.environ["TOPOLOGY_OUT"]) / name
    count = message.properties.get("OUTBOX_SEND_COUNT", "1")
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, f"{message.message_id} {count}\n".encode())
    finally:
        os.close(fd)


def _guard() -> Any:
    import redis

    from idempotency import GuardConfig, IdempotencyGuard
    from outbox import OutboxTables
    from outbox.database import create_engine

    return IdempotencyGuard(
        create_engine(os.environ["RELIABLE_DATABASE_URL"], pool_pre_ping=True),
        OutboxTables(prefix=os.environ.get("RELIABLE_TABLE_PREFIX", "reliable_")),
        redis.Redis.from_url(os.environ["RELIABLE_REDIS_URL"], socket_timeout=2),
        config=GuardConfig(
            lease=timedelta(seconds=float(os.environ.get("TOPOLOGY_LEASE_S", "60")))
        ),
    )


class RecordingGuard:
    """The guard, built on first use, recording each delivery it is given first."""

    def __init__(self) -> None:
        self.inner = DefaultGuard(_guard)

    def process(
        self, message: ReceivedMessage, group: str, invoke: Callable[..., object]
    ) -> ConsumeResult:
        _record(f"{group}.deliveries", message)
        return self.inner.process(message, group, invoke)


def _effect(message: ReceivedMessage, session: Session, group: str) -> None:
    if DELAY_S:
        time.sleep(DELAY_S)  # work in progress: a SIGKILL may land here
    session.execute(
        sa.text(f"INSERT INTO {EFFECTS} (message_id, consumer_group) VALUES (:m, :g)"),
        {"m": message.message_id, "g": group},
    )


@handler(TOPIC, group=GROUP_A, idempotent=RecordingGuard(), **CONSUMER)
def inventory(message: ReceivedMessage, session: Session) -> None:
    _effect(message, session, GROUP_A)


@handler(TOPIC, group=GROUP_B, idempotent=RecordingGuard(), **CONSUMER)
def billing(message: ReceivedMessage, session: Session) -> None:
    _effect(message, session, GROUP_B)


@handler(TOPIC, group=GROUP_B, **CONSUMER)
def billing_careless(message: ReceivedMessage) -> None:
    """Acknowledged, never processed: the message is lost to billing."""
    _record(f"{GROUP_B}.careless", message)
