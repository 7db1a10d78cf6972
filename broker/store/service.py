"""The background-service base class shared by every store service.

A `ServiceThread` is a daemon thread running `run()`; the loop checks `stopped` and parks
in `wait_for_running(interval_s)` between rounds. `wakeup()` ends a park early (a put that
needs a flush now, a new record to dispatch). Each round's work lives in a method the
subclass exposes separately (`do_flush()`, `do_reput()`, ...) so tests drive it directly
with an injected clock instead of waiting for the thread.

`PeriodicService` is the simplest one: a function run every interval (the consume-queue
and index flush with the checkpoint).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class ServiceThread:
    """A stoppable daemon loop with an early-wakeup signal."""

    name: str = "service"

    def __init__(self, name: str | None = None) -> None:
        if name is not None:
            self.name = name
        self._wakeup = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle
    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopped.clear()
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            self.run()
        except Exception:  # a dead service must be visible in the logs
            log.exception("service %s died", self.name)
            raise

    def shutdown(self, timeout: float = 10.0) -> None:
        """Ask the loop to stop, wake it, and join it (at most `timeout` seconds)."""
        self._stopped.set()
        self._wakeup.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._thread = None

    # --- loop helpers
    def wakeup(self) -> None:
        # set only when clear: called after every put, and a set Event is a plain read;
        # a waiter clears the flag before its round, so a put it misses here sets it again
        if not self._wakeup.is_set():
            self._wakeup.set()

    def wait_for_running(self, interval_s: float) -> None:
        """Park until `interval_s` passes, `wakeup()` is called or the service stops."""
        if self._wakeup.is_set():
            self._wakeup.clear()
            self.on_wait_end()
            return
        self._wakeup.wait(interval_s)
        self._wakeup.clear()
        self.on_wait_end()

    def on_wait_end(self) -> None:
        """Hook run after every park (the group-commit service swaps its request lists)."""

    def run(self) -> None:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError


class PeriodicService(ServiceThread):
    """Runs `action()` every `interval_ms` (consume-queue/index flush and checkpoint)."""

    def __init__(self, name: str, interval_ms: int, action: Callable[[], None]) -> None:
        super().__init__(name)
        self._interval_s = interval_ms / 1000
        self._action = action

    def run(self) -> None:
        while not self.stopped:
            self.wait_for_running(self._interval_s)
            try:
                self._action()
            except Exception:
                log.exception("%s failed", self.name)
