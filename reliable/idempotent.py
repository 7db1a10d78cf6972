"""Guards a handler runs through, and the default one behind `idempotent=True`.

`@handler(idempotent=guard)` takes any object with `process(message, group, invoke)`: the
`MessageGuard` protocol below. The client core defines the protocol and nothing else; the
concrete guard (`idempotency.IdempotencyGuard`: Redis + database) lives in a package above
this one, so that `reliable` never imports `idempotency` or `outbox` (docs/architecture.md).

`idempotent=True` asks for the installed default guard. It is found through the entry point
group `reliable.guards`, name `default` (declared by this distribution's pyproject.toml as
`idempotency.environment:guard_from_environment`), called with the environment when the
consumer starts, never at import or declaration. Configuration of that default guard:

| variable                 | meaning                                               | default     |
|--------------------------|-------------------------------------------------------|-------------|
| `RELIABLE_DATABASE_URL`  | SQLAlchemy URL of the outbox / confirmation tables    | (required)  |
| `RELIABLE_REDIS_URL`     | Redis fast path (`SET NX PX`); unset = database only  | unset       |
| `RELIABLE_TABLE_PREFIX`  | table name prefix of the outbox tables                | `reliable_` |

For anything else (a shared engine, a Redis cluster client, custom lease and TTL), build an
`idempotency.IdempotencyGuard` yourself and pass it: `idempotent=guard`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Protocol

from reliable.errors import ConfigurationError
from reliable.message import ConsumeResult, ReceivedMessage

GUARD_ENTRY_POINTS = "reliable.guards"
DEFAULT_GUARD = "default"


class MessageGuard(Protocol):
    """Runs a handler at most once per (message, group): `idempotency.IdempotencyGuard`.

    `invoke(**kwargs)` runs the handler; the guard may offer keyword arguments (a database
    `session=`, say) that reach the function when it declares them."""

    def process(
        self, message: ReceivedMessage, group: str, invoke: Callable[..., object]
    ) -> ConsumeResult: ...


class DeadLetterMarker(Protocol):
    """Records that a group gave up on a message (`idempotency.IdempotencyGuard`)."""

    def mark_dead_lettered(self, message: ReceivedMessage, group: str | None = None) -> str: ...


class Guard(MessageGuard, DeadLetterMarker, Protocol):
    """A default guard: runs handlers at most once and records dead letters
    (`idempotency.IdempotencyGuard`)."""


class GuardFactory(Protocol):
    """What the `reliable.guards` entry point names: the environment in, a guard out."""

    def __call__(self, env: Mapping[str, str]) -> Guard: ...


def default_guard_factory() -> GuardFactory:
    """The factory of the installed default guard (entry point `reliable.guards:default`).

    Raises ConfigurationError, on one line naming the fix, when no distribution declares it
    or its module cannot be imported."""
    found = entry_points(group=GUARD_ENTRY_POINTS, name=DEFAULT_GUARD)
    fix = "(pip install reliable), or pass a guard object: idempotent=guard"
    if not found:
        raise ConfigurationError(
            f"idempotent=True needs a default guard: no entry point "
            f"{DEFAULT_GUARD!r} in group {GUARD_ENTRY_POINTS!r} {fix}"
        )
    point = next(iter(found))
    try:
        factory = point.load()
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(
            f"idempotent=True needs the default guard {point.value}, "
            f"which cannot be loaded ({exc}) {fix}"
        ) from exc
    if not callable(factory):
        raise ConfigurationError(
            f"idempotent=True: the default guard {point.value} is not callable"
        )
    return factory  # type: ignore[no-any-return]


def build_default_guard(env: Mapping[str, str] | None = None) -> Guard:
    """The default guard, built from `env` (the process environment when None)."""
    return default_guard_factory()(os.environ if env is None else env)


class DefaultGuard:
    """Builds the default guard on first use (or `ensure()` at consumer start), then
    delegates to it."""

    def __init__(self, factory: Callable[[], Guard] = build_default_guard) -> None:
        self._factory = factory
        self._guard: Guard | None = None
        self._lock = threading.Lock()

    def ensure(self) -> Guard:
        with self._lock:
            if self._guard is None:
                self._guard = self._factory()
            return self._guard

    @property
    def built(self) -> Guard | None:
        """The guard once built (None before): what metrics read, never building it."""
        return self._guard

    def process(
        self, message: ReceivedMessage, group: str, invoke: Callable[..., object]
    ) -> ConsumeResult:
        result: ConsumeResult = self.ensure().process(message, group, invoke)
        return result

    def prepare(self, messages: Sequence[ReceivedMessage], group: str) -> None:
        """The guard's batch receipt, when it offers one (`Handler.prepare`)."""
        prepare = getattr(self.ensure(), "prepare", None)
        if prepare is not None:
            prepare(messages, group)
