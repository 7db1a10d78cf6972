"""One body limit, checked once and honoured everywhere, over a real `reliable broker start`.

A body of exactly the limit is stored and received intact; one byte more is refused with
MESSAGE_BODY_TOO_LARGE; raising `--max-body-size` raises it for the store too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import reliable
from reliable import BadRequest, Message, Producer, SimpleConsumer
from tests.e2e.grpc.server_process import ServerProcess

MiB = 1024 * 1024


def _round_trip(endpoint: str, topic: str, body: bytes) -> bytes:
    transport = reliable.connect("grpc", endpoint=endpoint)
    transport.start()
    try:
        with Producer(transport) as producer:
            producer.send(Message(topic, body))
        with SimpleConsumer(
            f"{topic}-g",
            {topic: "*"},
            transport=transport,
            await_duration_s=2,
            invisible_duration_s=30,
        ) as consumer:
            for _ in range(10):
                got = consumer.receive(max_messages=1)
                if got:
                    consumer.ack(got[0])
                    return got[0].body
        raise AssertionError("the message never arrived")
    finally:
        transport.close()


def _refused(endpoint: str, topic: str, body: bytes) -> BadRequest:
    transport = reliable.connect("grpc", endpoint=endpoint)
    transport.start()
    try:
        with Producer(transport) as producer, pytest.raises(BadRequest) as caught:
            producer.send(Message(topic, body))
        return caught.value
    finally:
        transport.close()


def test_default_limit_is_exact(make_server: Callable[..., ServerProcess]) -> None:
    server = make_server()
    body = os.urandom(4 * MiB)
    assert _round_trip(server.endpoint, "body-exact", body) == body
    refused = _refused(server.endpoint, "body-exact", body + b"x")
    assert refused.code == "MESSAGE_BODY_TOO_LARGE", refused


def test_raised_limit_reaches_the_store(make_server: Callable[..., ServerProcess]) -> None:
    server = make_server("--max-body-size", str(6 * MiB))
    body = os.urandom(5 * MiB)
    assert _round_trip(server.endpoint, "body-raised", body) == body
    refused = _refused(server.endpoint, "body-raised", os.urandom(6 * MiB + 1))
    assert refused.code == "MESSAGE_BODY_TOO_LARGE", refused


def test_embedded_transport_keeps_the_same_limit(tmp_path: Path) -> None:
    transport = reliable.connect("embedded", store_dir=tmp_path / "store")
    transport.start()
    try:
        body = os.urandom(4 * MiB)
        with Producer(transport) as producer:
            producer.send(Message("body-embedded", body))
            with pytest.raises(BadRequest) as caught:
                producer.send(Message("body-embedded", body + b"x"))
        assert caught.value.code == "MESSAGE_BODY_TOO_LARGE", caught.value
        with SimpleConsumer(
            "body-embedded-g", {"body-embedded": "*"}, transport=transport, await_duration_s=1
        ) as consumer:
            got = consumer.receive(max_messages=1)
            assert got and got[0].body == body
    finally:
        transport.close()


def test_embedded_transport_takes_a_raised_limit_to_the_store(tmp_path: Path) -> None:
    from broker.config import BrokerConfig

    transport = reliable.connect(
        "embedded",
        store_dir=tmp_path / "store",
        broker_config=BrokerConfig(max_message_size=6 * MiB),
    )
    transport.start()
    try:
        body = os.urandom(5 * MiB)
        with Producer(transport) as producer:
            producer.send(Message("body-embedded-6", body))
            with pytest.raises(BadRequest) as caught:
                producer.send(Message("body-embedded-6", os.urandom(6 * MiB + 1)))
        assert caught.value.code == "MESSAGE_BODY_TOO_LARGE", caught.value
        with SimpleConsumer(
            "body-embedded-6-g", {"body-embedded-6": "*"}, transport=transport, await_duration_s=1
        ) as consumer:
            got = consumer.receive(max_messages=1)
            assert got and got[0].body == body
    finally:
        transport.close()


@pytest.mark.parametrize("limit", [4 * MiB, 6 * MiB])
def test_test_broker_keeps_the_same_limit(limit: int) -> None:
    """`reliable.testing.TestBroker` stores a body of exactly its broker's limit, as a served
    or embedded broker does, and refuses one byte more as too large."""
    from reliable.testing import TestBroker

    with TestBroker(max_message_size=limit) as broker:
        body = os.urandom(limit)
        with broker.producer() as producer:
            producer.send(Message("body-testbroker", body))
            with pytest.raises(BadRequest) as caught:
                producer.send(Message("body-testbroker", body + b"x"))
        assert caught.value.code == "MESSAGE_BODY_TOO_LARGE", caught.value
        # the record is dispatched to its queue in the background: look until it is there
        deadline = time.monotonic() + 10
        while not (stored := broker.messages("body-testbroker")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [m.body for m in stored] == [body]
