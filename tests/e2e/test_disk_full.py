"""A broker whose disk is above the refuse watermark: "service not available", not busy.

The store measures its partition through an injected `disk_usage`; above
`disk_refuse_watermark` (90 %) every put answers DISK_FULL. The producer must then try the
other queues at once (no flow-control backoff: its `sleep` is never called), and fail with
`SendFailed` whose last error is a `BrokerUnavailable` naming the full disk. A page cache
that is busy stays flow control.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import reliable
from broker import errors as berr
from broker.broker import Broker
from broker.results import PUT_STATUS_CODES
from broker.store.message import PutMessageStatus
from reliable import BrokerBusy, Message, Producer, SendFailed, Transport
from reliable.errors import BrokerUnavailable, FailureKind
from reliable.transport.embedded import translate
from tests.e2e.helpers import Disk, fill, running_broker, wait_until


@pytest.fixture
def disk() -> Disk:
    return Disk()


@pytest.fixture
def broker(tmp_path: Path, disk: Disk) -> Iterator[Broker]:
    with running_broker(tmp_path / "store", disk_usage=disk) as b:
        yield b


@pytest.fixture
def transport(broker: Broker) -> Transport:
    return reliable.connect("embedded", broker=broker)


def test_full_disk_fails_fast_on_every_queue_without_backoff(
    broker: Broker, transport: Transport, disk: Disk
) -> None:
    slept: list[float] = []
    with Producer(transport, sleep=slept.append, retry_times_when_send_failed=2) as producer:
        producer.send(Message("Orders", b"before"))  # creates the topic, disk at 50 %
        fill(broker, disk, 0.95)
        with pytest.raises(SendFailed) as failed:
            producer.send(Message("Orders", b"refused"))
        assert not any(slept)  # no flow-control backoff: retried elsewhere at once
        assert len(failed.value.attempts) == 3  # 1 + retry_times_when_send_failed
        assert len({queue for queue, _ in failed.value.attempts}) == 3  # each on another queue
        last = failed.value.last_error
        assert isinstance(last, BrokerUnavailable) and last.disk_full
        assert last.kind is FailureKind.TRY_ELSEWHERE and last.code == "SERVICE_NOT_AVAILABLE"
        assert "DISK_FULL" in str(failed.value)
        fill(broker, disk, 0.6)
        receipt = producer.send(Message("Orders", b"after"))

    def bodies() -> list[bytes]:
        return sorted(
            m.body
            for q in range(broker.route("Orders").read_queue_nums)
            for m in _all(broker, "Orders", q)
        )

    wait_until(lambda: len(bodies()) >= 2, 10, "the two accepted sends to be dispatched")
    assert bodies() == [b"after", b"before"]  # nothing of the refused send was stored
    assert receipt.queue_offset >= 0


def _all(broker: Broker, topic: str, queue_id: int) -> list[Any]:
    return list(broker.pull_message("probe", topic, queue_id, 0, 32).messages)


def test_one_mapping_per_put_status() -> None:
    def mapped(status: PutMessageStatus) -> BaseException:
        return translate(berr.SendRejected("t", status.value, PUT_STATUS_CODES[status]))

    disk_full = mapped(PutMessageStatus.DISK_FULL)
    assert isinstance(disk_full, BrokerUnavailable) and disk_full.disk_full
    stopped = mapped(PutMessageStatus.SERVICE_NOT_AVAILABLE)
    assert isinstance(stopped, BrokerUnavailable) and not stopped.disk_full
    assert isinstance(mapped(PutMessageStatus.OS_PAGE_CACHE_BUSY), BrokerBusy)


def test_full_disk_over_grpc_fails_fast_and_names_the_disk(broker: Broker, disk: Disk) -> None:
    """Our server answers a full disk with INTERNAL_SERVER_ERROR (what the Apache proxy
    answers for the broker's SERVICE_NOT_AVAILABLE), never TOO_MANY_REQUESTS: the client
    tries again at once and fails with the store's reason in the error. (Over gRPC a full
    disk cannot be told from a failover's server error, so a default producer waits its
    failover window before failing: `failover_wait_s=0` here.)"""
    from broker.server.config import ServerConfig
    from broker.server.server import MessagingServer

    server = MessagingServer(broker, ServerConfig(port=0))
    server.start()
    transport = reliable.connect("grpc", endpoint=server.address)
    transport.start()
    slept: list[float] = []
    try:
        with Producer(transport, sleep=slept.append, failover_wait_s=0) as producer:
            producer.send(Message("Remote", b"before"))
            fill(broker, disk, 0.97)
            with pytest.raises(SendFailed) as failed:
                producer.send(Message("Remote", b"refused"))
            assert not any(slept)  # no flow-control backoff
            assert len(failed.value.attempts) == 3
            last = failed.value.last_error
            assert isinstance(last, reliable.errors.BrokerCallError)
            assert last.kind is FailureKind.TRY_ELSEWHERE and "DISK_FULL" in str(last)
            fill(broker, disk, 0.5)
            assert producer.send(Message("Remote", b"after")).message_id
    finally:
        transport.close()
        server.stop()
