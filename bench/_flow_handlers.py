"""The handler `bench flow` runs in `reliable consume` processes: the business write of the
consume side (a reservation row), bare or under the idempotency guard.

    reliable consume bench._flow_handlers:reserve --endpoint HOST:PORT

Configured from the environment (read at import, when `reliable consume` loads the
target; nothing connects before the first message):

| variable              | meaning                                                        |
|-----------------------|----------------------------------------------------------------|
| `FLOW_TOPIC`          | the topic consumed                                             |
| `FLOW_GROUP`          | the consumer group                                             |
| `FLOW_MODE`           | `bare` (its own transaction) or `guard` (`idempotent=True`)    |
| `FLOW_THREADS`        | the handler threads (`consume_threads`)                        |
| `FLOW_DB`             | SQLAlchemy URL of the business tables (bare mode)              |
| `FLOW_RESERVATIONS`   | the reservation table's name                                   |
| `FLOW_CASES`          | instead of the three above: `topic=group=table,...`, one       |
|                       | handler each (`reserve` is then their list), so that one       |
|                       | process serves several cases (`bench flow --quick`)            |

In guard mode the default guard is built from `RELIABLE_DATABASE_URL`,
`RELIABLE_REDIS_URL` and `RELIABLE_TABLE_PREFIX` when the consumer starts, as in
production; the reservation row is written through the session it passes, so it commits
with the confirmation row.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from reliable import ConsumeFrom, ReceivedMessage, handler

TOPIC = os.environ.get("FLOW_TOPIC", "bench-flow")
GROUP = os.environ.get("FLOW_GROUP", "bench-flow-group")
MODE = os.environ.get("FLOW_MODE", "guard")
THREADS = int(os.environ.get("FLOW_THREADS", "4"))

_metadata = sa.MetaData()


def _table(name: str) -> sa.Table:
    return sa.Table(
        name,
        _metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("order_id", sa.String(64), nullable=False),
        sa.Column("sku", sa.String(32), nullable=False),
        sa.Column("quantity", sa.Integer, nullable=False),
        # time.time() in the handler: DOUBLE, since MariaDB's FLOAT is 4 bytes
        sa.Column("done_at", sa.Double, nullable=False),
        extend_existing=True,
    )


reservations = _table(os.environ.get("FLOW_RESERVATIONS", "bench_flow_reservations"))

_engine: sa.Engine | None = None
_lock = threading.Lock()


def _bare_engine() -> sa.Engine:
    global _engine
    with _lock:
        if _engine is None:
            _engine = sa.create_engine(os.environ["FLOW_DB"], pool_size=THREADS, max_overflow=0)
        return _engine


def _reservation(message: ReceivedMessage) -> dict[str, Any]:
    order = json.loads(message.body)
    return {
        "order_id": order["order_id"],
        "sku": order["sku"],
        "quantity": order["quantity"],
        "done_at": time.time(),
    }


def _declare(topic: str, group: str, table: sa.Table) -> Any:
    options: dict[str, Any] = {
        "group": group,
        "consume_threads": THREADS,
        "consume_from": ConsumeFrom.FIRST,
    }
    if MODE == "guard":

        @handler(topic, idempotent=True, **options)
        def reserve_guarded(message: ReceivedMessage, session: Session) -> None:
            session.execute(sa.insert(table).values(**_reservation(message)))

        return reserve_guarded
    if MODE == "bare":

        @handler(topic, **options)
        def reserve_bare(message: ReceivedMessage) -> None:
            with Session(_bare_engine()) as session, session.begin():
                session.execute(sa.insert(table).values(**_reservation(message)))

        return reserve_bare
    raise SystemExit(f"FLOW_MODE must be bare or guard, not {MODE!r}")


_cases = [c.split("=") for c in os.environ.get("FLOW_CASES", "").split(",") if c]
reserve: Any = (
    [_declare(topic, group, _table(name)) for topic, group, name in _cases]
    if _cases
    else _declare(TOPIC, GROUP, reservations)
)
