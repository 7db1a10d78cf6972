"""The broker's lifecycle parts its collaborators share: whether it is started, and the
background service that runs its maintenance pass.

`Broker.start` and `Broker.shutdown` set the `RunState`; every collaborator that serves a
call only a started broker serves checks it (`require`), and a long poll stops waiting once
it is off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker.errors import BrokerNotRunning
from broker.store.service import ServiceThread

log = logging.getLogger(__name__)


class RunState:
    """Whether the broker is started (`on`), set by its start and shutdown alone."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = False

    def require(self) -> None:
        """BrokerNotRunning unless the broker is started."""
        if not self.on:
            raise BrokerNotRunning("the broker is not running")


class MaintenanceService(ServiceThread):
    """Runs the broker's maintenance pass (persist offsets and progress, sweep expired
    leases and consumers) every `interval_s`; a failed pass is logged, the next one runs."""

    name = "broker-maintenance"

    def __init__(self, maintain: Callable[[], None], interval_s: float) -> None:
        super().__init__()
        self._maintain = maintain
        self._interval_s = interval_s

    def run(self) -> None:
        while not self.stopped:
            try:
                self._maintain()
            except Exception:
                log.exception("broker maintenance pass failed")
            self.wait_for_running(self._interval_s)
