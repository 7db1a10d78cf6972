"""The default guard behind `@handler(idempotent=True)`, built from the environment.

The client core finds this factory through the entry point group `reliable.guards`, name
`default`, and calls it when the consumer starts (never at import or declaration), so that
`reliable` itself never imports this package or `outbox`.

| variable                 | meaning                                               | default     |
|--------------------------|-------------------------------------------------------|-------------|
| `RELIABLE_DATABASE_URL`  | SQLAlchemy URL of the outbox / confirmation tables    | (required)  |
| `RELIABLE_REDIS_URL`     | Redis fast path (`SET NX PX`); unset = database only  | unset       |
| `RELIABLE_TABLE_PREFIX`  | table name prefix of the outbox tables                | `reliable_` |

The tables must exist (`OutboxTables(prefix).create_all(engine)`). For anything else (a
shared engine, a Redis cluster client, custom lease and TTL), build an `IdempotencyGuard`
yourself and pass it: `idempotent=guard`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from idempotency.guard import IdempotencyGuard
from outbox.database import DatabaseUrlError, create_engine
from outbox.errors import OutboxError
from outbox.models import OutboxTables
from reliable.errors import ConfigurationError

DATABASE_URL = "RELIABLE_DATABASE_URL"
REDIS_URL = "RELIABLE_REDIS_URL"
TABLE_PREFIX = "RELIABLE_TABLE_PREFIX"
DEFAULT_TABLE_PREFIX = "reliable_"
POOL_SIZE = 17  # connections kept open: 16 handler threads and the lease renewal
POOL_OVERFLOW = 8  # more handler threads than that: opened and closed as needed


def guard_from_environment(env: Mapping[str, str] | None = None) -> IdempotencyGuard:
    """An `IdempotencyGuard` from the environment (`os.environ` when `env` is None).

    Raises `reliable.errors.ConfigurationError`, on one line naming the fix, when
    `RELIABLE_DATABASE_URL` is unset or the outbox tables are missing. A database that
    cannot be reached is not an error here: the guard answers RECONSUME_LATER until it is
    back."""
    env = os.environ if env is None else env
    url = env.get(DATABASE_URL)
    if not url:
        raise ConfigurationError(
            f"idempotent=True needs {DATABASE_URL} (and optionally "
            f"{REDIS_URL}); or pass a guard object: idempotent=guard"
        )
    try:
        # No pre-ping (a round trip per checkout, two per message): a connection found dead
        # is retried once on a fresh one by the guard (`IdempotencyGuard.process`), and
        # SQLAlchemy then replaces the rest of the pool. Connections open lazily: the pool
        # holds up to one per handler thread (16 being the most we advise) plus the lease
        # renewal's, without closing and reopening them between messages.
        engine = create_engine(url, pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW)
    except DatabaseUrlError as exc:
        raise ConfigurationError(f"{DATABASE_URL}: {exc}") from None
    redis_client = None
    if env.get(REDIS_URL):
        import redis

        redis_client = redis.Redis.from_url(
            env[REDIS_URL], socket_timeout=2, socket_connect_timeout=2
        )
    tables = OutboxTables(prefix=env.get(TABLE_PREFIX, DEFAULT_TABLE_PREFIX))
    try:
        return IdempotencyGuard(engine, tables, redis_client)
    except OutboxError as exc:  # tables missing: one line naming the fix, at consumer start
        engine.dispose()
        raise ConfigurationError(f"idempotent=True: {exc}") from exc


__all__ = ["DATABASE_URL", "REDIS_URL", "TABLE_PREFIX", "guard_from_environment"]
