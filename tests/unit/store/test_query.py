"""Queries over a real commitlog + index: exact key filter after the hash lookup (colliding
messages never returned), caps, bounded work, clock-skew padding, unique key with the
offset-id fallback, store timestamps for offset-by-time."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.store.commitlog import CommitLog
from broker.store.config import StoreConfig
from broker.store.consume_queue_store import ConsumeQueueStore
from broker.store.dispatcher import ReputService
from broker.store.errors import InvalidQuery
from broker.store.index_key import index_key_hash
from broker.store.index_service import IndexService
from broker.store.message import Message, MessageExt
from broker.store.query import (
    KeyMatch,
    look_by_offset_msg_id,
    pad_time_range,
    query_by_key,
    query_by_unique_key,
    store_timestamp_lookup,
)
from protocol.props import Prop

T0 = 1_763_790_000_000


class Env:
    def __init__(self, tmp_path: Path, slots: int = 4) -> None:
        self.config = StoreConfig(
            store_dir=tmp_path,
            mapped_file_size_commitlog=64 * 1024,
            mapped_file_size_consume_queue=20 * 16,
            max_hash_slot_num=slots,
            max_index_num=400,
            warm_mapped_file=False,
        )
        self.now = T0
        ticks = itertools.count()
        self.commitlog = CommitLog(self.config, clock=lambda: self.now + next(ticks))
        self.commitlog.load()
        self.cqs = ConsumeQueueStore(self.config)
        self.index = IndexService(self.config, clock=lambda: T0)
        self.index.load(last_exit_ok=True)
        self.reput = ReputService(self.commitlog, [self.cqs, self.index])
        self.looked: list[int] = []

    def put(
        self, body: bytes, keys: str = "", uniq: str | None = None, topic: str = "orders"
    ) -> int:
        props = {Prop.KEYS: keys} if keys else {}
        if uniq:
            props[Prop.UNIQ_KEY] = uniq
        r = self.commitlog.append(Message(topic, body, properties=props))
        assert r.append is not None
        self.reput.do_reput()
        return r.append.wrote_offset

    def look(self, offset: int) -> MessageExt | None:
        self.looked.append(offset)
        return self.commitlog.look_message(offset)

    def by_key(self, key: str, **kw: object) -> list[bytes]:
        return [m.body for m in query_by_key(self.index, self.look, "orders", key, **kw)]  # type: ignore[arg-type]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    yield e
    e.index.shutdown()
    e.commitlog.close()


def test_message_with_several_keys_found_by_each(env: Env) -> None:
    env.put(b"first", "order-1 customer-7 invoice-9", uniq="U1")
    env.put(b"second", "customer-7")
    for key in ("order-1", "invoice-9"):
        assert env.by_key(key) == [b"first"]
    assert env.by_key("customer-7") == [b"second", b"first"]
    assert env.by_key("U1") == []  # KEYS only by default
    assert env.by_key("U1", match=KeyMatch.ANY) == [b"first"]
    msg = query_by_key(env.index, env.look, "orders", "invoice-9")[0]
    assert msg.keys == ["order-1", "customer-7", "invoice-9"] and msg.unique_key == "U1"


# two keys whose index hashes collide under topic "orders" (found by a birthday search)
A, B = "k3985819", "k4420602"


def test_colliding_keys_are_never_returned(env: Env) -> None:
    assert index_key_hash(f"orders#{A}") == index_key_hash(f"orders#{B}")
    env.put(b"aa", A)
    env.put(b"bb", B)
    env.put(b"both", f"x {B} y")
    for i in range(40):  # a tiny slot count: every chain mixes many keys
        env.put(b"noise%d" % i, f"n{i}")
    assert env.by_key(A) == [b"aa"]
    assert env.by_key(B) == [b"both", b"bb"]
    assert env.by_key("B") == []
    assert env.by_key(A, max_num=64) == [b"aa"]


def test_other_topics_with_the_same_key_are_filtered(env: Env) -> None:
    env.put(b"mine", "k")
    env.put(b"theirs", "k", topic="payments")
    assert env.by_key("k") == [b"mine"]


def test_results_are_capped_by_request_and_by_store(env: Env) -> None:
    for i in range(100):
        env.put(b"%d" % i, "hot")
    assert env.by_key("hot", max_num=3) == [b"99", b"98", b"97"]
    assert len(env.by_key("hot", max_num=1000)) == 64  # StoreConfig.max_query_results
    assert env.by_key("hot", max_num=0) == []


def test_decoding_is_bounded_when_collisions_crowd_a_key(env: Env) -> None:
    env.put(b"needle", A)
    for i in range(60):
        env.put(b"hay%d" % i, B)  # same hash as A: all candidates
    env.looked.clear()
    assert env.by_key(A, max_candidates=10) == []
    assert len(env.looked) == 10
    assert env.by_key(A, max_candidates=100) == [b"needle"]


def test_time_range_is_padded_for_clock_skew(env: Env) -> None:
    env.now = T0
    env.put(b"early", "k")
    env.now = T0 + 3_600_000
    env.put(b"late", "k")
    # the producer's clock runs 2 minutes ahead of the broker's
    assert env.by_key("k", begin_ms=T0 + 120_000, end_ms=T0 + 130_000) == [b"early"]
    assert env.by_key("k", begin_ms=T0 + 120_000, end_ms=T0 + 130_000, skew_ms=0) == []
    assert env.by_key("k", begin_ms=T0 + 3_500_000) == [b"late"]
    with pytest.raises(InvalidQuery):
        pad_time_range(T0, T0 - 3_600_000)


def test_bad_keys_raise_typed_errors(env: Env) -> None:
    for bad in ("", "two words"):
        with pytest.raises(InvalidQuery):
            env.by_key(bad)


def test_unique_key_and_offset_id_fallback(env: Env) -> None:
    off1 = env.put(b"with uniq", "k", uniq="7F0000010001ABCDEF0123456789ABCD")
    off2 = env.put(b"without uniq", "k2")
    found = query_by_unique_key(env.index, env.look, "orders", "7F0000010001ABCDEF0123456789ABCD")
    assert found is not None and found.commitlog_offset == off1
    second = env.commitlog.look_message(off2)
    assert second is not None
    offset_id = second.offset_msg_id
    found = query_by_unique_key(env.index, env.look, "orders", offset_id)
    assert found is not None and found.body == b"without uniq"
    assert query_by_unique_key(env.index, env.look, "payments", offset_id) is None
    assert query_by_unique_key(env.index, env.look, "orders", "not-an-id") is None
    assert look_by_offset_msg_id(env.look, offset_id.lower()) is not None
    # an id naming another broker, or an offset inside a record, finds nothing
    other_host = "0A000001" + offset_id[8:]
    assert look_by_offset_msg_id(env.look, other_host) is None
    inside = offset_id[:16] + f"{off2 + 4:016X}"
    assert look_by_offset_msg_id(env.look, inside) is None
    with pytest.raises(InvalidQuery):
        look_by_offset_msg_id(env.look, "XYZ")


def test_store_timestamp_lookup_reads_the_record_header(env: Env) -> None:
    env.now = T0 + 5000
    off = env.put(b"x", "k")
    msg = env.commitlog.look_message(off)
    assert msg is not None
    lookup = store_timestamp_lookup(env.commitlog.get_message)
    assert lookup(off, msg.store_size) == msg.store_timestamp >= T0 + 5000
    assert lookup(env.commitlog.get_max_offset() + 100, 10) == -1
