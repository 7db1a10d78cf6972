"""Fuzzing the store's readers: records, consume-queue units, index files, JSON config files.

Every input is random or a mutation of a valid one. The properties: no reader crashes or
raises anything but its documented typed error, a mutated valid record is never taken for
the original (the checksum covers every byte), and work stays bounded. Seeded by the
profiles of conftest.py (derandomized in `make test`, many more examples in `make soak`).
"""

from __future__ import annotations

import contextlib
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from broker.config_files import config_file_parsers
from broker.store import codec
from broker.store.codec import (
    FIXED_SIZE,
    check_message_and_return_size,
    decode_message,
    encode_host,
    encode_record,
    seal,
)
from broker.store.config import WATERMARKS_OFF, StoreConfig
from broker.store.consume_queue import CQ_STORE_UNIT_SIZE, ConsumeQueue
from broker.store.consume_queue_store import ConsumeQueueStore
from broker.store.errors import ConfigFileError, ForeignFile, StoreCorrupted
from broker.store.index_service import IndexService
from broker.store.json_config import JsonConfigFile
from broker.store.message import Message
from broker.store.queue_check import unit_problem
from broker.store.store import MessageStore
from broker.store.verify import describe_record, verify_store

HOST = encode_host(("10.0.0.1", 10911))
topics = st.text(
    st.characters(codec="utf-8", exclude_characters="\x00/"), min_size=1, max_size=20
).filter(lambda t: t not in (".", "..") and len(t.encode()) < 100)
prop_text = st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"), max_size=30)


def _record(
    topic: str, body: bytes, props: dict[str, str], queue_offset: int, phy: int, ts: int
) -> bytearray:
    buf = bytearray(
        encode_record(
            topic, 1, body, 0, props, 0, 1_700_000_000_000, ("10.0.0.2", 5), HOST, 0, 0, 1 << 20
        )
    )
    seal(buf, 0, queue_offset, phy, ts)
    return buf


records = st.builds(
    _record,
    topics,
    st.binary(max_size=300),
    st.dictionaries(prop_text.filter(bool), prop_text, max_size=4),
    st.integers(0, 1 << 40),
    st.integers(0, 1 << 40),
    st.integers(0, 1 << 45),
)


@given(st.binary(max_size=600), st.integers(0, 64))
def test_random_bytes_are_never_a_record(raw: bytes, pos: int) -> None:
    size, req = check_message_and_return_size(raw, min(pos, len(raw)))
    assert size <= 0 or (req is not None and size >= FIXED_SIZE)
    if size < 0:
        assert isinstance(describe_record(raw, min(pos, len(raw)), 0), str)


@given(records, st.data())
def test_any_changed_byte_of_a_record_is_detected(rec: bytearray, data: st.DataObject) -> None:
    phy = struct.unpack_from(">q", rec, 28)[0]
    n, req = check_message_and_return_size(rec, 0, True, phy)
    assert n == len(rec) and req is not None
    assert decode_message(rec).body_crc == codec.py_record_crc(rec, 0, len(rec))
    at = data.draw(st.integers(0, len(rec) - 1), label="at")
    mask = data.draw(st.integers(1, 255), label="mask")
    damaged = bytearray(rec)
    damaged[at] ^= mask
    assert check_message_and_return_size(damaged, 0, True, phy)[0] == -1
    assert isinstance(describe_record(bytes(damaged), 0, phy), str)
    # decoding without validation may fail, but only with ValueError-like errors
    with contextlib.suppress(ValueError, IndexError, UnicodeDecodeError, struct.error):
        decode_message(damaged)


@given(records, st.binary(max_size=40), st.integers(0, 200))
def test_truncated_and_padded_records(rec: bytearray, tail: bytes, cut: int) -> None:
    phy = struct.unpack_from(">q", rec, 28)[0]
    short = bytes(rec[: max(0, len(rec) - cut - 1)])
    assert check_message_and_return_size(short, 0, True, phy)[0] <= 0
    assert check_message_and_return_size(bytes(rec) + tail, 0, True, phy)[0] == len(rec)


@given(
    st.binary(max_size=400),
    st.integers(0, 1 << 20),
    st.integers(-5, 1 << 12),
    st.binary(min_size=1, max_size=10),
    st.integers(0, 8),
    st.integers(0, 1 << 20),
)
def test_unit_check_on_random_bytes(
    buf: bytes, pos: int, size: int, topic: bytes, queue_id: int, queue_offset: int
) -> None:
    problem = unit_problem(buf, pos % (len(buf) + 1), pos, size, topic, queue_id, queue_offset)
    assert problem is None or isinstance(problem, str)


@given(records)
def test_unit_check_accepts_the_right_record_only(rec: bytearray) -> None:
    rec_topic = decode_message(rec)
    phy, qoff = rec_topic.commitlog_offset, rec_topic.queue_offset
    topic = rec_topic.topic.encode()
    assert unit_problem(rec, 0, phy, len(rec), topic, 1, qoff) is None
    assert unit_problem(rec, 0, phy, len(rec) + 1, topic, 1, qoff) is not None
    assert unit_problem(rec, 0, phy, len(rec), topic, 2, qoff) is not None
    assert unit_problem(rec, 0, phy, len(rec), topic, 1, qoff + 1) is not None
    assert unit_problem(rec, 0, phy + 1, len(rec), topic, 1, qoff) is not None
    assert unit_problem(rec, 0, phy, len(rec), topic + b"x", 1, qoff) is not None


def _fresh_queue(tmp: Path, name: str) -> ConsumeQueue:
    return ConsumeQueue("T", 0, tmp / name, 10 * CQ_STORE_UNIT_SIZE)


@given(st.binary(max_size=10 * CQ_STORE_UNIT_SIZE))
def test_consume_queue_recovery_of_random_files(
    tmp_path_factory: pytest.TempPathFactory, raw: bytes
) -> None:
    tmp = tmp_path_factory.mktemp("cq")
    directory = tmp / "q" / "T" / "0"
    directory.mkdir(parents=True)
    (directory / f"{0:020d}").write_bytes(raw.ljust(10 * CQ_STORE_UNIT_SIZE, b"\0"))
    cq = _fresh_queue(tmp, "q")
    cq.load()
    try:
        cq.recover()
    except StoreCorrupted:
        return  # the documented refusal; the store rebuilds such a queue
    finally:
        units = list(cq.iter_units(0, 10))
        cq.shutdown()
    assert len(units) <= 10


@given(st.binary(max_size=200), st.sampled_from(["size", "name", "dir"]))
def test_foreign_consume_queue_files_are_typed_errors(
    tmp_path_factory: pytest.TempPathFactory, raw: bytes, what: str
) -> None:
    tmp = tmp_path_factory.mktemp("cqs")
    config = StoreConfig(
        store_dir=tmp, mapped_file_size_consume_queue=10 * CQ_STORE_UNIT_SIZE, **WATERMARKS_OFF
    )
    directory = config.consume_queue_dir / "T" / "0"
    directory.mkdir(parents=True)
    name = {"size": f"{0:020d}", "name": "garbage", "dir": f"{0:020d}"}[what]
    if what == "dir":
        (directory / name).mkdir()
    else:
        (directory / name).write_bytes(raw)
    queues = ConsumeQueueStore(config)
    try:
        queues.load()
        queues.recover()
    except (ForeignFile, StoreCorrupted):
        pass
    finally:
        queues.shutdown()


@given(st.binary(min_size=1, max_size=400), st.integers(0, 400))
def test_index_files_with_random_bytes(
    tmp_path_factory: pytest.TempPathFactory, raw: bytes, at: int
) -> None:
    tmp = tmp_path_factory.mktemp("idx")
    config = StoreConfig(store_dir=tmp, max_hash_slot_num=8, max_index_num=16, **WATERMARKS_OFF)
    config.index_dir.mkdir(parents=True)
    size = 40 + 8 * 4 + 16 * 20
    content = bytearray(size)
    content[at % size : at % size + len(raw)] = raw[: size - at % size]
    (config.index_dir / "20260101000000000").write_bytes(bytes(content))
    service = IndexService(config)
    try:
        service.load(last_exit_ok=True)
        list(service.iter_offsets("T", "k", 0, 1 << 62, max_scan=64))
    except (ForeignFile, StoreCorrupted):
        pass
    finally:
        service.shutdown()


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 70), 1 << 70)
    | st.floats(allow_nan=False)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
PARSERS = config_file_parsers()
VALID: dict[str, dict[str, Any]] = {
    "topics.json": {
        "topicConfigTable": {
            "T": {"topicName": "T", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}
        },
        "dataVersion": {"counter": 3},
    },
    "subscriptionGroup.json": {"subscriptionGroupTable": {"g": {"groupName": "g"}}},
    "consumerOffset.json": {"offsetTable": {"T@g": {"0": 5, "1": 0}}},
    "delayOffset.json": {
        "offsetTable": {"1": 4},
        "timer": {"low": 2, "delivered": [3]},
        "recalled": [[0, 1]],
    },
    "popState.json": {
        "groups": {
            "g": {"T": {"0": {"low": 1, "next": 3, "done": [2], "leases": {"1": [1, 5, 7, None]}}}}
        },
        "reviveOffset": 0,
    },
}


def _mutate(doc: Any, path: list[int], value: Any) -> Any:
    """Replace the node reached by `path` (indexes into keys/items, modulo) by `value`."""
    if not path or not isinstance(doc, dict | list) or not doc:
        return value
    if isinstance(doc, dict):
        keys = sorted(doc)
        k = keys[path[0] % len(keys)]
        return {**doc, k: _mutate(doc[k], path[1:], value)}
    i = path[0] % len(doc)
    return [*doc[:i], _mutate(doc[i], path[1:], value), *doc[i + 1 :]]


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_config_documents_parse(name: str) -> None:
    assert PARSERS[name](VALID[name]) is not None


@pytest.mark.parametrize("name", sorted(VALID))
@given(path=st.lists(st.integers(0, 7), max_size=6), value=json_values)
def test_config_loaders_refuse_wrong_shapes_cleanly(
    tmp_path_factory: pytest.TempPathFactory, name: str, path: list[int], value: Any
) -> None:
    doc = _mutate(VALID[name], path, value)
    assume(doc != VALID[name])
    tmp = tmp_path_factory.mktemp("cfg")
    target = JsonConfigFile(tmp / name)
    (tmp / name).write_text(json.dumps(doc))
    try:
        target.load(PARSERS[name])  # parsed, or refused as one typed error
    except ConfigFileError as exc:
        assert name in str(exc) and "\n" not in str(exc)
    # with a good backup the load always succeeds, from the backup when the file is bad
    (tmp / f"{name}.bak").write_text(json.dumps(VALID[name]))
    assert target.load(PARSERS[name]) is not None


@given(st.binary(max_size=300))
def test_config_loaders_on_random_bytes(
    tmp_path_factory: pytest.TempPathFactory, raw: bytes
) -> None:
    tmp = tmp_path_factory.mktemp("raw")
    for name, parse in [*PARSERS.items(), ("consumequeue.json", ConsumeQueueStore.parse_registry)]:
        (tmp / name).write_bytes(raw)
        try:
            JsonConfigFile(tmp / name).load(parse)
        except ConfigFileError as exc:
            assert "\n" not in str(exc)


@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stopped store holding a few records of two topics."""
    d = tmp_path_factory.mktemp("verify")
    config = StoreConfig(
        store_dir=d,
        mapped_file_size_commitlog=64 << 10,
        mapped_file_size_consume_queue=100 * CQ_STORE_UNIT_SIZE,
        max_hash_slot_num=64,
        max_index_num=256,
        **WATERMARKS_OFF,
    )
    store = MessageStore(config)
    store.start()
    for i in range(30):
        store.put_message(
            Message(
                topic=f"T{i % 2}",
                body=f"m{i}".encode() * 3,
                queue_id=i % 3,
                properties={"KEYS": f"k{i}"},
            )
        )
    assert store.wait_dispatched(10)
    store.shutdown()
    return d


@given(st.data())
def test_verify_names_every_damaged_file(
    small_store: Path, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    import shutil

    copy = tmp_path_factory.mktemp("copy") / "s"
    shutil.copytree(small_store, copy)
    config = StoreConfig(
        store_dir=copy,
        mapped_file_size_commitlog=64 << 10,
        mapped_file_size_consume_queue=100 * CQ_STORE_UNIT_SIZE,
        max_hash_slot_num=64,
        max_index_num=256,
        **WATERMARKS_OFF,
    )
    assert verify_store(config, PARSERS).ok
    files = sorted(
        p
        for p in copy.rglob("*")
        if p.is_file() and p.name not in ("lock",) and p.stat().st_size > 0
    )
    victim = data.draw(st.sampled_from(files), label="file")
    raw = bytearray(victim.read_bytes())
    used = len(raw.rstrip(b"\0")) or len(raw)
    at = data.draw(st.integers(0, used - 1), label="at")
    raw[at] ^= data.draw(st.integers(1, 255), label="mask")
    victim.write_bytes(bytes(raw))
    report = verify_store(config, PARSERS)  # never raises, whatever the damage
    assert all(isinstance(p.problem, str) for p in report.problems)
    if victim.parent.name == "commitlog":
        assert not report.ok  # every byte of a record is covered
