"""`broker.server.direct`: who may answer a direct delivery, and what ends one early."""

from __future__ import annotations

import asyncio

import pytest

from broker.server.direct import ClientDidNotAnswer, ClientNotInGroup, DirectDeliveries
from broker.server.sessions import ClientKind, SessionRegistry, TelemetryStream
from broker.store.message import MessageExt
from protocol.pb import definition_pb2
from protocol.props import Prop


def stored(topic: str = "orders", **props: str) -> MessageExt:
    return MessageExt(
        topic=topic,
        body=b"order 42",
        queue_id=1,
        flag=0,
        properties={Prop.UNIQ_KEY: "U42", **props},
        sys_flag=0,
        born_timestamp=1,
        born_host=("127.0.0.1", 1),
        reconsume_times=2,
        prepared_tx_offset=0,
        queue_offset=7,
        commitlog_offset=100,
        store_timestamp=2,
        store_host=("127.0.0.1", 2),
        store_size=10,
        body_crc=0,
    )


def status(code: str, message: str = "") -> definition_pb2.Status:
    out = definition_pb2.Status()
    out.code = definition_pb2.Code.Value(code)
    out.message = message
    return out


def connect(sessions: SessionRegistry, client_id: str, group: str, kind: ClientKind) -> None:
    session = sessions.touch(client_id, 0)
    session.kind, session.group = kind, group
    session.stream_opened(TelemetryStream(8, None))


def test_only_the_client_asked_can_answer_and_the_message_is_the_consumers_view() -> None:
    async def run() -> None:
        sessions = SessionRegistry()
        connect(sessions, "c1", "billing", ClientKind.PUSH_CONSUMER)
        connect(sessions, "c2", "billing", ClientKind.PUSH_CONSUMER)
        direct = DirectDeliveries(sessions)
        session = direct.client("billing", "c1")
        assert session.stream is not None
        task = asyncio.ensure_future(
            direct.deliver(
                session, stored("%DLQ%billing", **{Prop.DLQ_ORIGIN_TOPIC: "orders"}), 5_000
            )
        )
        await asyncio.sleep(0)
        command = session.stream.queue.get_nowait()
        verify = command.verify_message_command
        # the consumer sees the original topic and the attempt it would be at
        assert verify.message.topic.name == "orders"
        assert verify.message.system_properties.message_id == "U42"
        assert verify.message.system_properties.delivery_attempt == 3
        assert not direct.answer("c2", verify.nonce, status("OK"))  # not the client asked
        assert not direct.answer("c1", "another-nonce", status("OK"))
        assert not task.done()
        assert direct.answer("c1", verify.nonce, status("FAILED_TO_CONSUME_MESSAGE", "boom"))
        verdict = await task
        assert (verdict["consumed"], verdict["status"], verdict["message"]) == (
            False,
            "FAILED_TO_CONSUME_MESSAGE",
            "boom",
        )
        assert len(direct) == 0  # nothing kept once answered
        assert not direct.answer("c1", verify.nonce, status("OK"))  # answered once only

    asyncio.run(run())


def test_a_stream_that_ends_fails_its_question_at_once_and_silence_times_out() -> None:
    async def run() -> None:
        sessions = SessionRegistry()
        connect(sessions, "c1", "billing", ClientKind.PUSH_CONSUMER)
        direct = DirectDeliveries(sessions)
        session = direct.client("billing", "c1")
        stream = session.stream
        assert stream is not None
        task = asyncio.ensure_future(direct.deliver(session, stored(), 60_000))
        await asyncio.sleep(0)
        direct.stream_closed(stream)
        with pytest.raises(ClientDidNotAnswer, match="disconnected before it answered"):
            await asyncio.wait_for(task, 1)
        with pytest.raises(ClientDidNotAnswer, match="did not answer within 50 ms"):
            await direct.deliver(session, stored(), 50)
        assert len(direct) == 0

    asyncio.run(run())


def test_clients_outside_the_group_are_refused_naming_the_live_ones() -> None:
    sessions = SessionRegistry()
    connect(sessions, "c1", "billing", ClientKind.PUSH_CONSUMER)
    connect(sessions, "c2", "billing", ClientKind.SIMPLE_CONSUMER)
    connect(sessions, "p1", "", ClientKind.PRODUCER)
    connect(sessions, "o1", "other", ClientKind.PUSH_CONSUMER)
    gone = sessions.touch("c3", 0)  # seen, but its stream is closed
    gone.kind, gone.group = ClientKind.PUSH_CONSUMER, "billing"
    direct = DirectDeliveries(sessions)
    for client, text in [
        ("nobody", "'nobody' is not connected"),
        ("c3", "'c3' is not connected"),
        ("p1", "'p1' is a producer client, not a consumer of group 'billing'"),
        ("o1", "'o1' is a consumer of group 'other', not a consumer of group 'billing'"),
    ]:
        with pytest.raises(ClientNotInGroup, match=text) as refused:
            direct.client("billing", client)
        assert refused.value.details == {"live_clients": ["c1", "c2"]}
        assert "its live clients: c1, c2" in str(refused.value)
    with pytest.raises(ClientNotInGroup, match="it has no live client"):
        direct.client("nobody-group", "c1")
