"""The guard's lease renewals: one daemon thread per guard extends the Redis and the DB
lease of every handler running under it, each lease/3."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Lease:
    message_id: str
    group: str
    key: str
    token: str
    held: bool | None
    due: float  # time.monotonic() of the next renewal


class Renewals:
    """Extends the leases of the handlers running under one guard every lease/3 (when
    configured): one daemon thread for all of them, started at the first handler, instead
    of a thread per message."""

    def __init__(self, enabled: bool, lease_s: float, renew: Callable[[Lease], bool]) -> None:
        """renew: extends both leases of one handler; False once taken over (a failed
        renewal must return True: it only shortens the lease)."""
        self.enabled = enabled
        self.interval = lease_s / 3
        self._renew = renew
        self._leases: set[Lease] = set()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    @contextmanager
    def held(
        self, message_id: str, group: str, key: str, token: str, held: bool | None
    ) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        lease = Lease(message_id, group, key, token, held, time.monotonic() + self.interval)
        with self._wake:
            self._leases.add(lease)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, daemon=True, name="idempotency-lease-renewal"
                )
                self._thread.start()
        try:
            yield
        finally:
            # Not waited for: a renewal in flight (e.g. waiting for SQLite's write lock,
            # held by the handler's open transaction) would stall the commit. A late
            # renewal is harmless: both renewals only touch a lease this token still holds.
            with self._wake:
                self._leases.discard(lease)

    def _run(self) -> None:
        while True:
            with self._wake:
                now = time.monotonic()
                due = [lease for lease in self._leases if lease.due <= now]
                if not due:
                    nearest = min((lease.due for lease in self._leases), default=now + 1.0)
                    self._wake.wait(max(nearest - now, 0.001))
                    continue
                for lease in due:
                    lease.due = now + self.interval
            for lease in due:
                with self._wake:
                    if lease not in self._leases:
                        continue  # the handler finished meanwhile
                if not self._renew(lease):
                    with self._wake:
                        self._leases.discard(lease)
