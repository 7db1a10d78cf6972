"""SYNC_FLUSH without a parked thread per call: `send_batch_pending` + `when_durable`, and
invisible-time changes that wait for their fsync after the state lock is released."""

from __future__ import annotations

import threading

from broker_kit import BrokerFactory

from broker.store.config import FlushMode
from broker.store.message import Message


def test_pending_batch_is_stored_now_and_reported_durable_after_fsync(
    make_broker: BrokerFactory,
) -> None:
    broker = make_broker(FlushMode.SYNC_FLUSH)
    broker.create_topic("t", queues=1)
    results, end = broker.send_batch_pending(
        [Message(topic="t", body=f"m{i}".encode(), queue_id=0) for i in range(5)]
    )
    assert [r.queue_offset for r in results] == [0, 1, 2, 3, 4]  # one offset each
    assert (
        end
        == max(r.commitlog_offset for r in results)
        + broker.store.look_message_by_offset(results[-1].commitlog_offset).store_size
    )
    flushed_when_called: list[int] = []
    done = threading.Event()

    def callback(ok: bool) -> None:
        assert ok
        flushed_when_called.append(broker.store.commitlog.queue.flushed_where)
        done.set()

    assert broker.when_durable(end, callback)
    assert done.wait(10)
    assert flushed_when_called[0] >= end


def test_async_flush_has_nothing_to_wait_for(make_broker: BrokerFactory) -> None:
    broker = make_broker()
    _, end = broker.send_batch_pending([Message(topic="t", body=b"x")])
    assert end > 0
    assert not broker.when_durable(end, lambda ok: None)


def test_receive_and_ack_answer_only_once_their_records_are_on_disk(
    make_broker: BrokerFactory,
) -> None:
    broker = make_broker(FlushMode.SYNC_FLUSH)
    broker.create_topic("t", queues=2)
    broker.send_batch([Message(topic="t", body=b"x", queue_id=0) for _ in range(40)])
    assert broker.store.wait_dispatched()
    queue = broker.store.commitlog.queue
    # one caller: whatever a call logged is on disk when it returns
    got = broker.receive("g", "t", 4, 30_000)
    assert len(got) == 4
    assert queue.flushed_where >= _revive_end(broker) > 0
    assert broker.ack_batch("g", "t", [e.receipt_handle for e in got]) == [None] * 4
    assert queue.flushed_where >= _revive_end(broker)
    handle = broker.receive("g", "t", 1, 30_000)[0].receipt_handle
    broker.change_invisible_duration("g", "t", handle, 10_000)
    assert queue.flushed_where >= _revive_end(broker)
    # many callers at once: each waits for the fsync outside the state lock, all complete
    errors: list[BaseException] = []

    def consumer() -> None:
        try:
            while got := broker.receive("g", "t", 4, 30_000):
                assert all(
                    e is None for e in broker.ack_batch("g", "t", [e.receipt_handle for e in got])
                )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=consumer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert [f.queue_offset for f in broker.in_flight("g", "t")] == [4]  # the one changed


def _revive_end(broker: object) -> int:
    return broker._pop._logged_end  # type: ignore[attr-defined]
