"""A deleted topic's records stay in the commitlog until it expires, but a topic re-created
under the same name is a new incarnation: queries by key, unique key and message id never
return the old one's records, before or after a restart, on the store and through the
admin operations."""

from __future__ import annotations

from broker_kit import BrokerFactory, msg, settle

from broker.admin import methods
from broker.broker import Broker


def _probe(broker: Broker, body: bytes) -> tuple[str, str]:
    """(client id, offset id) of a message keyed probe-0 sent to `scratch`."""
    sent = broker.send_message(msg("scratch", body, queue_id=0, keys="probe-0"))
    settle(broker)
    return sent.msg_id, sent.offset_msg_id


def _answers(broker: Broker, old: tuple[str, str], new: tuple[str, str]) -> None:
    store = broker.store
    assert [m.body for m in store.query_message_by_key("scratch", "probe-0")] == [b"new"]
    assert store.query_message_by_unique_key("scratch", old[0]) is None
    assert store.query_message_by_unique_key("scratch", old[1]) is None  # offset id form
    assert store.look_message_by_msg_id(old[1]) is None
    found = store.query_message_by_unique_key("scratch", new[0])
    assert found is not None and found.body == b"new"
    query = methods(broker)["QueryMessage"]
    for params in (
        {"key": "probe-0", "topic": "scratch"},
        {"unique_key": new[0], "topic": "scratch"},
        {"id": new[0]},
        {"id": new[1]},
        {"id": new[0], "topic": "scratch"},
        {"topic": "scratch", "queue": 0, "offset": 0},
    ):
        [m] = query(params)["messages"]
        assert m["msg_id"] == new[0], params
    for params in (
        {"unique_key": old[0], "topic": "scratch"},
        {"id": old[0]},
        {"id": old[1]},
        {"id": old[1], "topic": "scratch"},
    ):
        assert query(params)["messages"] == [], params


def test_a_re_created_topic_never_shows_the_deleted_ones_messages(
    make_broker: BrokerFactory,
) -> None:
    broker = make_broker()
    broker.create_topic("scratch", queues=1)
    old = _probe(broker, b"old")
    assert broker.delete_topic("scratch")
    broker.create_topic("scratch", queues=1)
    new = _probe(broker, b"new")
    _answers(broker, old, new)
    broker.shutdown()
    _answers(make_broker(), old, new)  # the incarnation's start is on disk


def test_the_deleted_incarnation_is_hidden_even_before_anything_is_sent_again(
    make_broker: BrokerFactory,
) -> None:
    broker = make_broker()
    broker.create_topic("scratch", queues=1)
    old = _probe(broker, b"old")
    broker.delete_topic("scratch")
    broker.create_topic("scratch", queues=1)
    store = broker.store
    assert store.query_message_by_key("scratch", "probe-0") == []
    assert store.look_message_by_msg_id(old[1]) is None
    assert methods(broker)["QueryMessage"]({"key": "probe-0", "topic": "scratch"}) == {
        "messages": [],
        "more": False,
    }


def test_other_topics_and_never_deleted_ones_are_untouched(make_broker: BrokerFactory) -> None:
    broker = make_broker()
    broker.create_topic("scratch", queues=1)
    broker.create_topic("kept", queues=1)
    kept = broker.send_message(msg("kept", b"k", keys="probe-0"))
    old = _probe(broker, b"old")
    broker.delete_topic("scratch")
    settle(broker)
    [m] = broker.store.query_message_by_key("kept", "probe-0")
    assert m.msg_id == kept.msg_id
    found = broker.store.look_message_by_msg_id(kept.offset_msg_id)
    assert found is not None and found.topic == "kept"
    assert broker.store.look_message_by_msg_id(old[1]) is None
