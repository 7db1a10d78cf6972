"""`idempotent=True`: the default idempotency guard, built from configuration.

Configuration (environment, read when the consumer starts, never at import or declaration):

| variable                 | meaning                                               | default     |
|--------------------------|-------------------------------------------------------|-------------|
| `RELIABLE_DATABASE_URL`  | SQLAlchemy URL of the outbox / confirmation tables    | (required)  |
| `RELIABLE_REDIS_URL`     | Redis fast path (`SET NX PX`); unset = database only  | unset       |
| `RELIABLE_TABLE_PREFIX`  | table name prefix of the outbox tables                | `reliable_` |

The tables must exist (`OutboxTables(prefix).create_all(engine)`). For anything else (a
shared engine, a Redis cluster client, custom lease and TTL), build an
`idempotency.IdempotencyGuard` yourself and pass it: `idempotent=guard`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from reliable.errors import ConfigurationError
from reliable.message import ConsumeResult, ReceivedMessage

DATABASE_URL = "RELIABLE_DATABASE_URL"
REDIS_URL = "RELIABLE_REDIS_URL"
TABLE_PREFIX = "RELIABLE_TABLE_PREFIX"


def build_default_guard(env: Mapping[str, str] | None = None) -> Any:
    """An `idempotency.IdempotencyGuard` from the environment (see the module docstring)."""
    env = os.environ if env is None else env
    url = env.get(DATABASE_URL)
    if not url:
        raise ConfigurationError(f"idempotent=True needs {DATABASE_URL} (and optionally "
                                 f"{REDIS_URL}); or pass a guard object: idempotent=guard")
    try:
        import sqlalchemy

        from idempotency import IdempotencyGuard
        from outbox.errors import OutboxError
        from outbox.models import OutboxTables
    except ImportError as exc:  # pragma: no cover - installation problem
        raise ImportError("idempotent=True needs the idempotency and outbox packages "
                          "(pip install reliable)") from exc
    engine = sqlalchemy.create_engine(url, pool_pre_ping=True)
    redis_client = None
    if env.get(REDIS_URL):
        import redis

        redis_client = redis.Redis.from_url(env[REDIS_URL], socket_timeout=2,
                                            socket_connect_timeout=2)
    tables = OutboxTables(prefix=env.get(TABLE_PREFIX, "reliable_"))
    try:
        return IdempotencyGuard(engine, tables, redis_client)
    except OutboxError as exc:  # tables missing: one line naming the fix, at consumer start
        raise ConfigurationError(f"idempotent=True: {exc}") from exc


class DefaultGuard:
    """Builds the default guard on first use (or `ensure()` at consumer start), then
    delegates to it."""

    def __init__(self, factory: Callable[[], Any] = build_default_guard) -> None:
        self._factory = factory
        self._guard: Any = None
        self._lock = threading.Lock()

    def ensure(self) -> Any:
        with self._lock:
            if self._guard is None:
                self._guard = self._factory()
            return self._guard

    def process(self, message: ReceivedMessage, group: str,
                invoke: Callable[..., object]) -> ConsumeResult:
        result: ConsumeResult = self.ensure().process(message, group, invoke)
        return result
