"""Dead-letter replays the console runs in the background, at the rate the operator chose.

The broker replays what one call names and records it in its audit ledger (so a dead
letter is never replayed twice, whoever asks: see `broker.admin.dlq`); the pace is the
caller's. A job here sends the chosen `%DLQ%<group>` offsets in batches of `rate`, one
batch a second, each call under the job's run id, and keeps what the broker answered for
the job's page. Jobs live in memory: a restart forgets them, the broker's ledger does not.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reliable_cli.console.broker_view import BrokerView

log = logging.getLogger(__name__)
KEPT_JOBS = 50


@dataclass
class ReplayJob:
    """One replay the console was asked to run."""

    id: str
    group: str
    offsets: list[int]
    rate: int | None  # messages per second; None: one call for all
    to_topic: bool
    operator: str
    started_at: float
    replayed: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    sent: int = 0  # offsets handed to the broker so far
    error: str | None = None
    finished_at: float | None = None

    @property
    def finished(self) -> bool:
        return self.finished_at is not None


class ReplayJobs:
    """The running and recent jobs (threads: one per job)."""

    def __init__(
        self,
        view: BrokerView,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.view = view
        self._sleep, self._clock = sleep, clock
        self._jobs: OrderedDict[str, ReplayJob] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, job_id: str) -> ReplayJob | None:
        with self._lock:
            return self._jobs.get(job_id)

    def start(
        self, group: str, offsets: list[int], rate: int | None, to_topic: bool, operator: str
    ) -> ReplayJob:
        job = ReplayJob(
            f"console-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(3)}",
            group,
            offsets,
            rate,
            to_topic,
            operator,
            time.time(),
        )
        with self._lock:
            self._jobs[job.id] = job
            while len(self._jobs) > KEPT_JOBS:
                self._jobs.popitem(last=False)
        threading.Thread(
            target=self._run, args=(job,), name=f"replay-{job.id}", daemon=True
        ).start()
        return job

    def _run(self, job: ReplayJob) -> None:
        size = job.rate or len(job.offsets)
        try:
            for start in range(0, len(job.offsets), size):
                began = self._clock()
                batch = job.offsets[start : start + size]
                answer = self.view.replay(
                    job.group,
                    batch,
                    dry_run=False,
                    operator=job.operator,
                    run=job.id,
                    to_topic=job.to_topic,
                )
                job.replayed.extend(answer.get("replayed", []))
                job.skipped.extend(answer.get("skipped", []))
                job.sent += len(batch)
                if job.rate and start + size < len(job.offsets):
                    self._sleep(max(0.0, 1.0 - (self._clock() - began)))
        except Exception as exc:  # shown on the job's page; the ledger has what was done
            job.error = f"{type(exc).__name__}: {exc}"
            log.warning("console: replay %s of %s stopped: %s", job.id, job.group, job.error)
        finally:
            job.finished_at = time.time()
            log.warning(
                "console: %s replayed %d dead letters of %s (run %s, %d skipped)",
                job.operator,
                len(job.replayed),
                job.group,
                job.id,
                len(job.skipped),
            )
