"""Where a message goes when produced: delay levels, delivery times, message types."""

from __future__ import annotations

import pytest

from broker.errors import MessageIllegal
from broker.produce import (
    check_properties,
    message_type_of,
    schedule_target,
    scheduled_copy,
    without_delay,
)
from broker.schedule import TIMER_QUEUE_ID, unschedule
from broker.store.message import Message, MessageExt
from broker.topic import TopicMessageType
from protocol.names import SCHEDULE_TOPIC
from protocol.props import Prop

LEVELS = (100, 200, 300)
NOW = 1_000_000


def _m(**props: str) -> Message:
    return Message(topic="t", body=b"x", queue_id=2, properties=dict(props))


def test_delay_levels_go_to_queue_level_minus_one() -> None:
    assert schedule_target(_m(**{Prop.DELAY: "1"}), LEVELS, NOW, 10**9) == (0, NOW + 100)
    assert schedule_target(_m(**{Prop.DELAY: "3"}), LEVELS, NOW, 10**9) == (2, NOW + 300)
    assert schedule_target(_m(**{Prop.DELAY: "0"}), LEVELS, NOW, 10**9) is None
    assert schedule_target(_m(), LEVELS, NOW, 10**9) is None


def test_delivery_times() -> None:
    at = NOW + 5_000
    assert schedule_target(_m(**{Prop.TIMER_DELIVER_MS: str(at)}), LEVELS, NOW, 10**9) == (
        TIMER_QUEUE_ID,
        at,
    )
    assert schedule_target(_m(**{Prop.TIMER_DELIVER_MS: str(NOW)}), LEVELS, NOW, 10**9) is None


@pytest.mark.parametrize(
    "props",
    [
        {Prop.DELAY: "4"},
        {Prop.DELAY: "x"},
        {Prop.TIMER_DELIVER_MS: "tomorrow"},
        {Prop.TIMER_DELIVER_MS: str(NOW + 10_001)},
        {Prop.DELAY: "1", Prop.TIMER_DELIVER_MS: "1"},
    ],
)
def test_bad_delays(props: dict[str, str]) -> None:
    with pytest.raises(MessageIllegal):
        schedule_target(_m(**props), LEVELS, NOW, 10_000)


def test_scheduled_copy_round_trip() -> None:
    original = _m(**{Prop.DELAY: "2", Prop.UNIQ_KEY: "U1", Prop.TAGS: "a"})
    copy = scheduled_copy(original, 1, NOW + 200)
    assert (copy.topic, copy.queue_id) == (SCHEDULE_TOPIC, 1)
    assert copy.properties[Prop.REAL_TOPIC] == "t" and copy.properties[Prop.REAL_QID] == "2"
    stored = MessageExt(
        topic=copy.topic,
        body=copy.body,
        queue_id=copy.queue_id,
        flag=0,
        properties=copy.properties,
        sys_flag=0,
        born_timestamp=1,
        born_host=("127.0.0.1", 1),
        reconsume_times=0,
        prepared_tx_offset=0,
        queue_offset=0,
        commitlog_offset=0,
        store_timestamp=NOW,
        store_host=("127.0.0.1", 2),
        store_size=10,
        body_crc=0,
    )
    back = unschedule(stored)
    assert back is not None
    assert (back.topic, back.queue_id) == ("t", 2)
    assert back.properties[Prop.UNIQ_KEY] == "U1" and back.properties[Prop.TAGS] == "a"
    assert Prop.DELAY not in back.properties  # the level is spent; when it was due stays
    assert back.properties[Prop.TIMER_DELIVER_MS] == copy.properties[Prop.TIMER_DELIVER_MS]


def test_without_delay_and_types() -> None:
    assert without_delay(_m(**{Prop.DELAY: "0", "k": "v"})).properties == {"k": "v"}
    plain = _m()
    assert without_delay(plain) is plain
    assert message_type_of(_m(**{Prop.TRAN_MSG: "true"})) is TopicMessageType.TRANSACTION
    assert message_type_of(_m(**{Prop.DELAY: "1"})) is TopicMessageType.DELAY
    assert message_type_of(_m(**{Prop.SHARDING_KEY: "g"})) is TopicMessageType.FIFO
    assert message_type_of(plain) is TopicMessageType.NORMAL


@pytest.mark.parametrize("props", [{"": "v"}, {"k": "a\x02b"}, {"k\x01": "v"}])
def test_bad_properties(props: dict[str, str]) -> None:
    with pytest.raises(MessageIllegal):
        check_properties(props)


def test_a_batch_result_is_the_frozen_send_result_its_constructor_builds() -> None:
    import dataclasses

    from broker.produce_engine import _send_result
    from broker.results import SendResult
    from broker.store.message import PutMessageStatus

    args = (PutMessageStatus.PUT_OK, "UNIQ", "C0A8000100001F9000000000000004D2", "t", 3, 7, 1234)
    fast, built = _send_result(*args), SendResult(*args)
    assert fast == built and hash(fast) == hash(built) and repr(fast) == repr(built)
    assert (fast.transaction_id, fast.recall_handle) == (None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.queue_offset = 8  # type: ignore[misc]
