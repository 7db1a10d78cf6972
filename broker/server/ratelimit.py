"""Log lines a client can provoke, at most one per kind per interval.

A hostile or broken client can send the same bad request thousands of times a second; the
log must tell the operator it happens without becoming the attack. `LogLimiter.log(kind,
...)` writes the first line of a kind, then drops the same kind for `interval_s`, counting
what it dropped, and says how many with the next line it writes:

    undecodable SendMessage request from ipv4:10.0.0.7:51234: ...
        (and 412 more like it since the last such line)

Kinds are a small closed set chosen by the caller (an RPC name, an exception class), never
client-supplied text, so the limiter's own memory stays bounded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

DEFAULT_INTERVAL_S = 60.0


class LogLimiter:
    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.clock = clock
        self._next_at: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()  # status_of may run on a pool thread

    def log(
        self, level: int, kind: str, message: str, *args: Any, exc_info: BaseException | None = None
    ) -> bool:
        """Log one line of `kind` unless one was logged within the interval; True if logged."""
        now = self.clock()
        with self._lock:
            if now < self._next_at.get(kind, float("-inf")):
                self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
                return False
            self._next_at[kind] = now + self.interval_s
            suppressed = self._suppressed.pop(kind, 0)
        if suppressed:
            message += " (and %d more like it since the last such line)"
            args = (*args, suppressed)
        self.logger.log(level, message, *args, exc_info=exc_info)
        return True
