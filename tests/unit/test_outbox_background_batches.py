"""How the outbox's background thread forms its batches (`outbox.background`): a short
batch lingers for more commits, a full one leaves at once, and `flush()` / `close()` never
wait out the linger. The send itself is the outbox's (tested against PostgreSQL in
tests/integration/outbox/test_publish_background.py); here it only records its batches."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from outbox.background import BackgroundSends
from reliable import Message

LONG = 60.0  # a linger no test waits out: a batch that leaves early left for a reason


class Batches:
    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.sent: list[str] = []
        self.changed = threading.Condition()

    def __call__(self, engine: Any, messages: list[Message]) -> None:
        with self.changed:
            self.sizes.append(len(messages))
            self.sent.extend(m.message_id for m in messages)
            self.changed.notify_all()

    def wait_sent(self, n: int, timeout: float = 30.0) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: len(self.sent) >= n, timeout)


def _messages(n: int) -> list[Message]:
    return [Message(topic="T", body=b"x") for _ in range(n)]


def test_commits_close_together_wait_for_each_other_and_leave_as_one_batch() -> None:
    batches = Batches()
    sends = BackgroundSends(batches, capacity=100, batch_size=128, name="t", linger_s=0.5)
    messages = _messages(5)
    for m in messages:  # one commit each, well inside the linger
        assert sends.submit(None, [m]) == 1  # type: ignore[arg-type]
    assert batches.wait_sent(5)  # without a flush: the linger ran out
    assert batches.sizes == [5]
    assert batches.sent == [m.message_id for m in messages]  # commit order kept
    assert sends.close(10)


def test_a_full_batch_leaves_without_waiting_for_the_linger() -> None:
    batches = Batches()
    sends = BackgroundSends(batches, capacity=100, batch_size=3, name="t", linger_s=LONG)
    for m in _messages(7):
        sends.submit(None, [m])  # type: ignore[arg-type]
    assert batches.wait_sent(6)  # two full batches, long before the linger
    assert batches.sizes == [3, 3]
    assert sends.flush(30)  # the short rest leaves at the flush
    assert batches.sizes == [3, 3, 1]
    assert sends.close(10)


@pytest.mark.parametrize("ending", ["flush", "close"])
def test_flush_and_close_send_a_lingering_batch_at_once(ending: str) -> None:
    batches = Batches()
    sends = BackgroundSends(batches, capacity=100, batch_size=128, name="t", linger_s=LONG)
    sends.submit(None, _messages(2))  # type: ignore[arg-type]
    assert (sends.flush if ending == "flush" else sends.close)(30)  # False after 30 s
    assert batches.sizes == [2]
    assert sends.close(10)


def test_no_linger_sends_each_batch_as_soon_as_the_thread_is_free() -> None:
    batches = Batches()
    sends = BackgroundSends(batches, capacity=100, batch_size=128, name="t", linger_s=0.0)
    sends.submit(None, _messages(1))  # type: ignore[arg-type]
    assert batches.wait_sent(1)  # no flush needed
    assert sends.close(10)


def test_a_negative_linger_is_refused() -> None:
    with pytest.raises(ValueError, match="linger"):
        BackgroundSends(Batches(), capacity=1, batch_size=1, name="t", linger_s=-1)
