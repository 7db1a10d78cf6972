"""The MessageStore facade: puts, consume reads with tag filters, queries, admin."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.store.codec import DispatchRequest, tags_string_to_code
from broker.store.config import SHIPPED_WATERMARKS, FlushMode
from broker.store.errors import StoreLocked
from broker.store.message import (
    GetMessageStatus,
    Message,
    PutMessageStatus,
    SysFlag,
    encode_offset_msg_id,
)
from broker.store.store import MessageStore
from protocol.props import Prop

from ._helpers import ManualClock, message, small_config


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    s = MessageStore(small_config(tmp_path))
    s.start()
    yield s
    s.shutdown()


def test_put_and_get_by_queue_offset(store: MessageStore) -> None:
    results = [store.put_message(message(i, queue_id=i % 2)) for i in range(10)]
    assert all(r.ok for r in results)
    assert store.wait_dispatched(10)
    got = store.get_messages("g", "TopicA", 0, 0, 3)
    assert got.status is GetMessageStatus.FOUND
    assert [m.queue_offset for m in got.messages] == [0, 1, 2]
    assert got.next_begin_offset == 3
    assert (got.min_offset, got.max_offset) == (0, 5)
    m = store.get_message_by_queue_offset("TopicA", 1, 4)
    assert m is not None and m.body == message(9).body


def test_get_statuses(store: MessageStore) -> None:
    assert store.get_messages("g", "Nope", 0, 0, 1).status is (
        GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
    )
    for i in range(3):
        store.put_message(message(i))
    assert store.wait_dispatched(10)
    assert store.get_messages("g", "TopicA", 0, 3, 1).status is (
        GetMessageStatus.OFFSET_OVERFLOW_ONE
    )
    over = store.get_messages("g", "TopicA", 0, 9, 1)
    assert over.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY and over.next_begin_offset == 3


def test_tag_filter_is_exact_despite_hash_collisions(store: MessageStore) -> None:
    assert tags_string_to_code("Aa") == tags_string_to_code("BB")
    for i, tag in enumerate(["Aa", "BB", "Aa", "C"]):
        store.put_message(Message("T", f"m{i}".encode(), properties={Prop.TAGS: tag}))
    assert store.wait_dispatched(10)
    got = store.get_messages("g", "T", 0, 0, 10, ["Aa"])
    assert [m.body for m in got.messages] == [b"m0", b"m2"]
    assert got.next_begin_offset == 4
    assert [m.body for m in store.get_messages("g", "T", 0, 0, 10, ["*"]).messages] == [
        b"m0",
        b"m1",
        b"m2",
        b"m3",
    ]
    none = store.get_messages("g", "T", 0, 0, 10, ["zzz"])
    assert none.status is GetMessageStatus.NO_MATCHED_MESSAGE and none.next_begin_offset == 4


def test_several_keys_each_find_the_message(store: MessageStore) -> None:
    r = store.put_message(Message("T", b"x", properties={Prop.KEYS: "order-1 user-9 sku-3"}))
    store.put_message(Message("T", b"y", properties={Prop.KEYS: "order-2"}))
    store.put_message(Message("Other", b"z", properties={Prop.KEYS: "order-1"}))
    assert store.wait_dispatched(10) and r.append is not None
    for key in ("order-1", "user-9", "sku-3"):
        hits = store.query_message_by_key("T", key)
        assert [h.commitlog_offset for h in hits] == [r.append.wrote_offset]
    assert store.query_message_by_key("T", "order") == []


def test_query_by_key_is_capped(store: MessageStore) -> None:
    for i in range(30):
        store.put_message(Message("T", b"%d" % i, properties={Prop.KEYS: "hot"}))
    assert store.wait_dispatched(10)
    hits = store.query_message_by_key("T", "hot", max_num=7)
    assert len(hits) == 7
    assert [h.body for h in hits] == [b"%d" % i for i in range(29, 22, -1)]  # newest first


def test_unique_key_and_offset_id_lookups(store: MessageStore) -> None:
    a = store.put_message(Message("T", b"a", properties={Prop.UNIQ_KEY: "ABCDEF0123"}))
    b = store.put_message(Message("T", b"b"))
    assert store.wait_dispatched(10) and a.append and b.append
    found = store.query_message_by_unique_key("T", "ABCDEF0123")
    assert found is not None and found.body == b"a"
    # no UNIQ_KEY: its id is the offset message id, found by decoding it
    by_id = store.query_message_by_unique_key("T", b.append.msg_id)
    assert by_id is not None and by_id.body == b"b"
    assert store.query_message_by_unique_key("Other", b.append.msg_id) is None
    assert store.look_message_by_msg_id(b.append.msg_id) is not None
    # an offset that is not a record start, or past the end, names nothing
    host = store.config.store_host
    inside = encode_offset_msg_id(host, b.append.wrote_offset + 1)
    assert store.look_message_by_msg_id(inside) is None
    assert store.look_message_by_msg_id(encode_offset_msg_id(host, 10**9)) is None
    assert store.look_message_by_msg_id("not-an-id") is None


def test_offset_by_time_and_store_timestamps(tmp_path: Path) -> None:
    clock = ManualClock(1_000_000)
    store = MessageStore(small_config(tmp_path), clock=clock)
    store.start()
    for i in range(200):  # many consume queue files (64 units each)
        clock.advance(10)
        store.put_message(message(i, size=20))
    assert store.wait_dispatched(10)
    assert store.get_offset_in_queue_by_time("TopicA", 0, 0) == 0
    assert store.get_offset_in_queue_by_time("TopicA", 0, 1_000_010) == 0
    assert store.get_offset_in_queue_by_time("TopicA", 0, 1_000_011) == 1
    assert store.get_offset_in_queue_by_time("TopicA", 0, 1_001_500) == 149
    assert store.get_offset_in_queue_by_time("TopicA", 0, 9_999_999) == 200
    store.shutdown()


def test_transaction_half_messages_are_not_consumable(store: MessageStore) -> None:
    half = store.put_message(Message("T", b"half", sys_flag=int(SysFlag.TRANSACTION_PREPARED)))
    store.put_message(Message("T", b"normal"))
    assert store.wait_dispatched(10) and half.append is not None
    assert [m.body for m in store.get_messages("g", "T", 0, 0, 10).messages] == [b"normal"]
    assert store.look_message_by_offset(half.append.wrote_offset) is not None


def test_put_batch_and_async(tmp_path: Path) -> None:
    store = MessageStore(small_config(tmp_path, flush_mode=FlushMode.SYNC_FLUSH))
    store.start()
    results = store.put_messages([message(i) for i in range(20)])
    assert [r.status for r in results] == [PutMessageStatus.PUT_OK] * 20
    fut = store.put_message_async(message(20))
    assert fut.result(timeout=10).status is PutMessageStatus.PUT_OK
    assert store.wait_dispatched(10)
    assert store.get_max_offset_in_queue("TopicA", 0) == 21
    assert store.fsync_count >= 1
    store.shutdown()


def test_not_running_and_locked(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    store = MessageStore(cfg)
    assert store.put_message(message(1)).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    store.start()
    with pytest.raises(StoreLocked):
        MessageStore(cfg).start()
    store.shutdown()
    assert store.put_message(message(1)).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    assert store.put_messages([message(1)])[0].status is PutMessageStatus.SERVICE_NOT_AVAILABLE


def test_dispatcher_hook_topics_and_delete(store: MessageStore) -> None:
    seen: list[int] = []

    class Hook:
        def dispatch(self, request: DispatchRequest) -> None:
            seen.append(request.queue_offset)

    store.add_dispatcher(Hook())
    store.put_message(message(1, topic="A", queue_id=3))
    store.put_message(message(2, topic="B"))
    assert store.wait_dispatched(10)
    assert seen == [0, 0]
    assert store.topics() == ["A", "B"] and store.queue_ids("A") == [3]
    store.delete_topics(["A"])
    assert store.topics() == ["B"]
    assert store.get_max_offset_in_queue("A", 3) == 0
    r = store.put_message(message(3, topic="A", queue_id=3))
    assert r.append is not None and r.append.queue_offset == 0


def test_config_files_are_atomic_json(store: MessageStore) -> None:
    f = store.config_file("consumerOffset.json")
    f.save({"offsetTable": {"T@g": {"0": 5}}})
    assert store.config_file("consumerOffset.json").load() == {"offsetTable": {"T@g": {"0": 5}}}
    assert (store.config.config_dir / "consumerOffset.json").exists()
    with pytest.raises(ValueError):
        store.config_file("../escape.json")


def test_disk_full_refuses_writes(tmp_path: Path) -> None:
    store = MessageStore(
        small_config(tmp_path, **SHIPPED_WATERMARKS), disk_usage=lambda _path: 0.95
    )
    store.start()
    assert store.is_disk_full()
    assert store.put_message(message(1)).status is PutMessageStatus.DISK_FULL
    store.shutdown()


def test_puts_racing_shutdown_are_refused_not_crashed(tmp_path: Path) -> None:
    import threading

    store = MessageStore(small_config(tmp_path))
    store.start()
    statuses: list[PutMessageStatus] = []
    go = threading.Event()

    def producer() -> None:
        go.set()
        for i in range(3000):
            statuses.append(store.put_message(message(i)).status)

    t = threading.Thread(target=producer)
    t.start()
    go.wait()
    store.shutdown()
    t.join()
    assert set(statuses) <= {PutMessageStatus.PUT_OK, PutMessageStatus.SERVICE_NOT_AVAILABLE}
    stored = statuses.count(PutMessageStatus.PUT_OK)
    again = MessageStore(small_config(tmp_path))
    again.start()
    assert again.recovery is not None and not again.recovery.abnormal
    assert again.get_max_offset_in_queue("TopicA", 0) == stored  # every PUT_OK survived
    again.shutdown()


def test_a_put_wakes_the_dispatcher_without_polling(tmp_path: Path) -> None:
    import time

    # the dispatcher parks a minute when idle: only the put's wake-up can dispatch in time
    s = MessageStore(small_config(tmp_path))
    s.reput.idle_park_s = 60
    s.start()
    try:
        time.sleep(0.05)  # let it park
        for i in range(3):
            r = s.put_message(message(i))
            assert r.append is not None
            end = r.append.wrote_offset + r.append.wrote_bytes
            deadline = time.monotonic() + 5
            while s.reput.reput_from_offset < end and time.monotonic() < deadline:
                time.sleep(0.001)
            assert s.reput.reput_from_offset >= end
            got = s.get_messages("g", message(i).topic, message(i).queue_id, i, 1)
            assert [m.body for m in got.messages] == [message(i).body]
            time.sleep(0.02)  # idle again: parked
    finally:
        s.shutdown()
