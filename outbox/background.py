"""The sends that follow commits, off the committing thread (`send_in_background=True`).

A commit hands its messages to one thread per `Outbox` and returns. That thread takes what
is waiting, up to `background_batch` messages: it sends them together (pipelined with the
sender's `send_async` when it has one, a `reliable.Producer` does) and records every receipt
on its stub in one transaction. The committing thread then costs the stub's INSERT alone,
and a burst of commits costs one record per batch instead of one transaction per message.

Nothing here is a guarantee, only speed: the stub committed with the business rows is.
A message still waiting when the process dies, or refused because `background_capacity`
messages already wait (the broker is down or slower than the commits), is sent by the
resend worker once its stub is due (`retry_after_failure` after the commit), exactly as a
send that failed. `Outbox.flush()` waits until every message handed over so far is sent
and recorded; `Outbox.close()` flushes and stops the thread (also run at interpreter exit).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from sqlalchemy import Engine

from reliable.message import Message

log = logging.getLogger(__name__)

Batch = Callable[[Engine, list[Message]], None]


class BackgroundSends:
    """A queue of committed messages and the one thread that sends and records them."""

    def __init__(
        self,
        send_batch: Batch,
        *,
        capacity: int,
        batch_size: int,
        name: str,
        linger_s: float = 0.0,
    ) -> None:
        if capacity < 1 or batch_size < 1:
            raise ValueError("background_capacity and background_batch must be at least 1")
        if linger_s < 0:
            raise ValueError("background_linger must not be negative")
        self._send_batch = send_batch
        self._capacity = capacity
        self._batch_size = batch_size
        self._linger_s = linger_s
        self._first_waiting_at = 0.0  # when the oldest message waiting was handed over
        self._flushing = 0  # callers in flush(): the thread takes a short batch at once
        self._name = name
        self._waiting: deque[tuple[Engine, Message]] = deque()
        self._unfinished = 0  # waiting + being sent
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._refused = 0  # messages left to the resend worker: queue full or closed

    @property
    def refused(self) -> int:
        """Messages not taken (the queue was full, or closed): the resend worker sends them."""
        return self._refused

    def submit(self, engine: Engine, messages: Sequence[Message]) -> int:
        """Hand committed messages over; returns how many were taken. Never blocks: what
        is not taken is left to the resend worker (its stub is already committed)."""
        with self._changed:
            room = 0 if self._closed else self._capacity - self._unfinished
            taken = list(messages[: max(room, 0)])
            was_empty = not self._waiting
            if taken and was_empty:
                self._first_waiting_at = time.monotonic()
            self._waiting.extend((engine, m) for m in taken)
            self._unfinished += len(taken)
            if taken and self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"outbox-send-{self._name}", daemon=True
                )
                self._thread.start()
                atexit.register(self.close, 5.0)
            # the thread waits for a first message, or lingers until a batch is full:
            # woken for those alone, not once a commit
            if taken and (was_empty or len(self._waiting) >= self._batch_size):
                self._changed.notify_all()
        left = len(messages) - len(taken)
        if left:
            self._refused += left
            log.warning(
                "outbox: %d message(s) not sent after commit (%s); the resend worker will "
                "send them when due",
                left,
                "closed" if self._closed else f"{self._capacity} already waiting",
            )
        return len(taken)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every message handed over is sent and recorded; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            self._flushing += 1
            self._changed.notify_all()
            try:
                while self._unfinished:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._changed.wait(left)
            finally:
                self._flushing -= 1
        return True

    def close(self, timeout: float | None = None) -> bool:
        """Take no more messages, send what waits, stop the thread; False on timeout."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        done = self.flush(timeout)
        thread = self._thread
        if thread is not None and done:
            thread.join(timeout)
        atexit.unregister(self.close)
        return done

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._waiting and not self._closed:
                    self._changed.wait()
                if not self._waiting:
                    return  # closed and drained
                # linger: a short batch waits for more commits, at most `linger_s` after
                # its oldest message was handed over (one record for many receipts)
                while (
                    len(self._waiting) < self._batch_size
                    and not self._closed
                    and not self._flushing
                ):
                    left = self._first_waiting_at + self._linger_s - time.monotonic()
                    if left <= 0:
                        break
                    self._changed.wait(left)
                n = min(self._batch_size, len(self._waiting))
                batch = [self._waiting.popleft() for _ in range(n)]
                self._first_waiting_at = time.monotonic()  # the rest waits from now on
            try:
                by_engine: dict[Engine, list[Message]] = {}
                for engine, message in batch:
                    by_engine.setdefault(engine, []).append(message)
                for engine, messages in by_engine.items():
                    self._send_batch(engine, messages)
            except Exception:  # never raised by design; the thread must outlive a bug
                log.exception("outbox: background send failed; the resend worker will send")
            finally:
                with self._changed:
                    self._unfinished -= len(batch)
                    self._changed.notify_all()


__all__ = ["BackgroundSends"]
