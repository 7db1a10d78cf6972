"""The commitlog record codec: every field round-trips, every kind of damage is rejected."""

from __future__ import annotations

import contextlib
import random
import struct
import zlib

import pytest

from broker.store.codec import (
    BLANK_MAGIC_CODE,
    FIXED_SIZE,
    MESSAGE_MAGIC_CODE,
    POS_PHYSICAL_OFFSET,
    RECORD_MAGIC_CODE,
    EncodeError,
    _strict_properties,
    check_message_and_return_size,
    decode_message,
    encode_blank,
    encode_host,
    encode_record,
    record_crc,
    reseal,
    seal,
    tags_string_to_code,
)
from broker.store.message import PutMessageStatus, SysFlag
from protocol.props import Prop

STORE_HOST = ("10.1.2.3", 10911)


def _record(
    body: bytes = b"hello",
    topic: str = "TopicA",
    props: dict[str, str] | None = None,
    sys_flag: int = 0,
    queue_offset: int = 7,
    phy: int = 4096,
    store_ts: int = 1234,
    **kw: object,
) -> bytearray:
    buf = bytearray(
        encode_record(
            topic,
            3,
            body,
            0x55,
            props
            if props is not None
            else {Prop.TAGS: "tagA", Prop.KEYS: "k1 k2", Prop.UNIQ_KEY: "U1"},
            sys_flag,
            1_700_000_000_000,
            ("192.168.0.9", 5555),
            encode_host(STORE_HOST),
            4,
            99,
            1 << 20,
        )
    )
    seal(buf, 0, queue_offset, phy, store_ts)
    return buf


def test_every_field_round_trips() -> None:
    body = bytes(range(256)) * 3
    props = {Prop.TAGS: "tagA", Prop.KEYS: "k1 k2", Prop.UNIQ_KEY: "U1", "user": "välue"}
    buf = _record(body, "Topic-Ü", props, int(SysFlag.TRANSACTION_COMMIT))
    assert len(buf) == FIXED_SIZE + len(body) + len("Topic-Ü".encode()) + len(
        "".join(f"{k}\x01{v}\x02" for k, v in props.items()).encode()
    )
    m = decode_message(buf)
    assert m.topic == "Topic-Ü"
    assert m.body == body
    assert m.queue_id == 3
    assert m.flag == 0x55
    assert m.properties == props
    assert m.sys_flag == int(SysFlag.TRANSACTION_COMMIT)
    assert m.born_timestamp == 1_700_000_000_000
    assert m.born_host == ("192.168.0.9", 5555)
    assert m.reconsume_times == 4
    assert m.prepared_tx_offset == 99
    assert m.queue_offset == 7
    assert m.commitlog_offset == 4096
    assert m.store_timestamp == 1234
    assert m.store_host == STORE_HOST
    assert m.store_size == len(buf)
    assert m.body_crc == record_crc(buf, 0, len(buf))  # version 2: the whole record's
    assert m.tags == "tagA" and m.keys == ["k1", "k2"] and m.unique_key == "U1"


def test_layout_is_big_endian_at_the_documented_offsets() -> None:
    buf = _record(
        b"xyz", queue_offset=0x0102030405060708, phy=0x1112131415161718, store_ts=0x2122232425262728
    )
    assert int.from_bytes(buf[0:4], "big") == len(buf)
    assert int.from_bytes(buf[4:8], "big", signed=True) == RECORD_MAGIC_CODE
    assert buf[4:8] == bytes.fromhex("DAA320B2")
    assert buf[20:28] == bytes.fromhex("0102030405060708")
    assert buf[POS_PHYSICAL_OFFSET:36] == bytes.fromhex("1112131415161718")
    assert buf[56:64] == bytes.fromhex("2122232425262728")
    assert buf[64:68] == bytes([10, 1, 2, 3])
    assert int.from_bytes(buf[84:88], "big") == 3
    assert buf[88:91] == b"xyz"
    assert buf[91] == len("TopicA")


def test_check_returns_dispatch_request() -> None:
    buf = _record(phy=4096)
    size, req = check_message_and_return_size(memoryview(buf), 0, expected_offset=4096)
    assert size == len(buf)
    assert req is not None
    assert (req.topic, req.queue_id, req.commitlog_offset, req.msg_size) == (
        "TopicA",
        3,
        4096,
        len(buf),
    )
    assert req.tags_code == tags_string_to_code("tagA")
    assert (req.queue_offset, req.store_timestamp) == (7, 1234)
    assert req.keys == "k1 k2" and req.uniq_key == "U1"


def test_schedule_topic_tag_code_is_delivery_time() -> None:
    buf = _record(
        topic="SCHEDULE_TOPIC_XXXX", props={Prop.TAGS: "t", Prop.TIMER_DELIVER_MS: "1700000005000"}
    )
    _, req = check_message_and_return_size(buf, 0)
    assert req is not None and req.tags_code == 1700000005000


def test_blank_record_and_end_of_file() -> None:
    buf = bytearray(64)
    buf[0:8] = encode_blank(64)
    assert check_message_and_return_size(buf, 0) == (0, None)
    assert int.from_bytes(buf[4:8], "big", signed=True) == BLANK_MAGIC_CODE
    assert check_message_and_return_size(buf, 64) == (0, None)
    buf[0:8] = encode_blank(60)  # a blank record must fill the file exactly
    assert check_message_and_return_size(buf, 0)[0] == -1


@pytest.mark.parametrize(
    "damage",
    ["magic", "crc", "size_big", "size_small", "topic_len", "props_len", "zeros", "phy", "half"],
)
def test_damaged_records_are_invalid(damage: str) -> None:
    buf = _record(b"payload-bytes", phy=0)
    file = bytearray(len(buf) + 100)
    n = len(buf)
    if damage == "magic":
        buf[4] ^= 0xFF
    elif damage == "crc":
        buf[90] ^= 0x01
    elif damage == "size_big":
        buf[0:4] = (n + 500).to_bytes(4, "big")
    elif damage == "size_small":
        buf[0:4] = (FIXED_SIZE - 1).to_bytes(4, "big")
    elif damage == "topic_len":
        buf[88 + 13] = 60
    elif damage == "props_len":
        buf[88 + 13 + 1 + 6] ^= 0x01
    elif damage == "zeros":
        buf[:] = bytes(n)
    elif damage == "half":
        buf[n // 2 :] = bytes(n - n // 2)
    file[:n] = buf
    expected = 8 if damage == "phy" else 0
    assert check_message_and_return_size(memoryview(file), 0, expected_offset=expected)[0] == -1


def test_crc_check_can_be_skipped() -> None:
    buf = _record(b"payload")
    buf[89] ^= 0x01
    assert check_message_and_return_size(buf, 0)[0] == -1
    assert check_message_and_return_size(buf, 0, check_crc=False)[0] == len(buf)


def test_encode_rejects_illegal_messages() -> None:
    with pytest.raises(EncodeError) as e:
        _record(topic="")
    assert e.value.status is PutMessageStatus.MESSAGE_ILLEGAL
    with pytest.raises(EncodeError):
        _record(topic="t" * 128)
    with pytest.raises(EncodeError) as e:
        _record(props={"k": "v" * 40000})
    assert e.value.status is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
    with pytest.raises(EncodeError):
        _record(props={"k": "a\x02b"})
    for topic in ("a/b", ".", ".."):  # would name no consume-queue directory: undispatchable
        with pytest.raises(EncodeError, match="directory") as e:
            _record(topic=topic)
        assert e.value.status is PutMessageStatus.MESSAGE_ILLEGAL
    with pytest.raises(EncodeError, match="negative") as e:
        encode_record(
            "t", -1, b"x", 0, {}, 0, 0, ("1.2.3.4", 1), encode_host(STORE_HOST), 0, 0, 1000
        )
    assert e.value.status is PutMessageStatus.MESSAGE_ILLEGAL
    with pytest.raises(EncodeError) as e:
        encode_record(
            "t", 0, b"x" * 2000, 0, {}, 0, 0, ("1.2.3.4", 1), encode_host(STORE_HOST), 0, 0, 1000
        )
    assert e.value.status is PutMessageStatus.MESSAGE_ILLEGAL


def test_tags_code_is_java_string_hashcode() -> None:
    # values of java.lang.String#hashCode
    assert tags_string_to_code(None) == 0
    assert tags_string_to_code("") == 0
    assert tags_string_to_code("a") == 97
    assert tags_string_to_code("TagA") == 2598919
    assert tags_string_to_code("hello world") == 1794106052
    assert tags_string_to_code("polygenelubricants") == -2147483648
    assert tags_string_to_code("é") == 233
    assert tags_string_to_code("😀") == 1772899  # surrogate pair: 0xD83D, 0xDE00


def _v1_record(body: bytes = b"old-body", phy: int = 0) -> bytearray:
    """A version-1 record as the store wrote it before version 2: body CRC only."""
    buf = _record(body, phy=phy)
    buf[4:8] = MESSAGE_MAGIC_CODE.to_bytes(4, "big", signed=True)
    reseal(buf, 0)
    return buf


def test_version_1_records_stay_readable() -> None:
    buf = _v1_record(b"written-by-v1", phy=64)
    size, req = check_message_and_return_size(buf, 0, expected_offset=64)
    assert size == len(buf) and req is not None and req.topic == "TopicA"
    m = decode_message(buf)
    assert m.body == b"written-by-v1" and m.body_crc == zlib.crc32(b"written-by-v1") & 0x7FFFFFFF
    # version 1's CRC covers only the body: a damaged topic byte is not seen (why v2 exists)
    buf[88 + len(b"written-by-v1") + 1] ^= 0x20
    assert check_message_and_return_size(buf, 0)[0] == len(buf)


@pytest.mark.parametrize(
    "field",
    [
        "topic",
        "property",
        "queue_id",
        "queue_offset",
        "phy",
        "store_ts",
        "born_host",
        "flag",
        "body",
    ],
)
def test_version_2_checksum_covers_every_field(field: str) -> None:
    buf = _record(b"payload", phy=0)
    at = {
        "topic": 88 + 7 + 1,
        "property": len(buf) - 2,
        "queue_id": 15,
        "queue_offset": 27,
        "phy": 35,
        "store_ts": 63,
        "born_host": 50,
        "flag": 19,
        "body": 90,
    }[field]
    buf[at] ^= 0x04
    assert check_message_and_return_size(buf, 0)[0] == -1
    assert check_message_and_return_size(buf, 0, check_crc=False)[0] in (-1, len(buf))


def test_seal_matches_a_recomputed_checksum() -> None:
    buf = _record(b"x" * 300, queue_offset=1 << 40, phy=(1 << 33) + 5, store_ts=1 << 41)
    assert int.from_bytes(buf[8:12], "big") == record_crc(buf, 0, len(buf))


def test_compiled_and_python_record_checksums_agree() -> None:
    from broker.store import codec

    for n in (0, 1, 77, 1024, 5000):
        buf = _record(bytes(range(256)) * (n // 256) + b"z" * (n % 256), phy=n)
        padded = bytes(13) + bytes(buf) + bytes(5)
        assert (
            codec.record_crc(padded, 13, len(buf))
            == codec.py_record_crc(padded, 13, len(buf))
            == int.from_bytes(buf[8:12], "big")
        )


def test_compiled_and_python_seal_agree() -> None:
    from broker.store import codec

    for n in (0, 5, 1000):
        a = bytearray(
            bytes(9)
            + encode_record(
                "T", 1, b"b" * n, 0, {"k": "v"}, 0, 1, ("1.2.3.4", 5), bytes(8), 0, 0, 1 << 20
            )
        )
        b = bytearray(a)
        raw = bytearray(a[9:])
        raw[8:12] = bytes(4)
        codec._py_write_partial(raw)
        assert raw == a[9:]  # the compiled encoder's partial checksum is the Python one's
        codec.seal(a, 9, 7, 1 << 35, 123)
        codec.py_seal(b, 9, 7, 1 << 35, 123)
        assert a == b
        assert check_message_and_return_size(a, 9, True, 1 << 35)[0] == len(a) - 9


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"", {}),
        (b"UNIQ_KEY\x01ABC\x02", {"UNIQ_KEY": "ABC"}),
        (b"a\x01\x02", {"a": ""}),
        (b"a\x011\x02b\x012\x02", {"a": "1", "b": "2"}),
        (b"a\x011\x02b\x012\x02a\x013\x02", {"a": "3", "b": "2"}),
    ],
)
def test_record_properties_decode_strictly(raw: bytes, expected: dict[str, str]) -> None:
    assert _strict_properties(memoryview(raw)) == expected


@pytest.mark.parametrize(
    "raw",
    [
        b"a\x011",  # no closing separator
        b"a\x02",  # a pair without a value separator
        b"a\x01b\x01c\x02",  # two value separators in one pair
        b"a\x01b\x01c\x02d\x02",  # counts agree, pairs do not
        b"\x02",
        b"a\x01\xff\x02",  # not UTF-8
    ],
)
def test_malformed_record_properties_are_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        _strict_properties(memoryview(raw))


def _python_check(buf: bytes, pos: int) -> tuple[int, object]:
    from broker.store import codec

    native, codec._dispatch_record = codec._dispatch_record, None
    try:
        return check_message_and_return_size(buf, pos, check_crc=False)
    finally:
        codec._dispatch_record = native


def _damaged(rng: random.Random, record: bytes | bytearray, least: int = 1) -> bytearray:
    """A seeded damaged copy of `record`: `least` to 3 changes (a byte of the topic and
    properties or of the header, a cut, an inserted separator or UTF-8 lead byte), its
    TOTALSIZE often made to match its new length (lengths that still add up)."""
    buf = bytearray(record)
    for _ in range(rng.randint(least, 3)):
        if not buf:
            break
        how = rng.random()
        if how < 0.6:
            at = len(buf) - 1 - rng.randrange(min(len(buf), 60))
            if how < 0.15:
                at = rng.randrange(len(buf))
            buf[at] = rng.choice([0, 1, 2, 0x7F, 0x80, 0xC3, 0xFF, rng.randrange(256)])
        elif how < 0.8:
            del buf[rng.randrange(len(buf) + 1) :]
        else:
            at = rng.randrange(len(buf) + 1)
            buf[at:at] = bytes([rng.choice([1, 2, 0x41, 0xE2])])
    if rng.random() < 0.6 and len(buf) >= 4:
        buf[0:4] = struct.pack(">i", len(buf))
    return buf


def test_compiled_and_python_dispatch_checks_agree() -> None:
    """Without a CRC check the compiled reader gives the Python one's verdict and fields,
    on records and on (seeded) damaged copies of them: lengths, bytes, UTF-8, separators."""
    from broker.store import codec

    assert codec._dispatch_record is not None  # the compiled one is in use
    records = [
        _record(),
        _record(b"x" * 300, topic="тема", props={"a": "é", Prop.UNIQ_KEY: "U"}),
        _record(props={}),
        _record(props={"": "v", "b": ""}),
        _record(topic="SCHEDULE_TOPIC_XXXX", props={Prop.TIMER_DELIVER_MS: "1700000005000"}),
    ]
    tail = encode_blank(16) + bytes(8)
    for rec in records:
        for buf in (bytes(rec), bytes(rec) + tail, bytes(rec) + bytes(3)):
            for pos in (0, len(rec)):
                want = _python_check(buf, pos)
                assert check_message_and_return_size(buf, pos, check_crc=False) == want
                view = memoryview(bytearray(buf))
                assert check_message_and_return_size(view, pos, check_crc=False) == want
    rng = random.Random(20261124)
    valid = 0
    for _ in range(20_000):
        buf = _damaged(rng, rng.choice(records))
        want = _python_check(bytes(buf), 0)
        assert check_message_and_return_size(bytes(buf), 0, check_crc=False) == want
        valid += want[1] is not None
    assert valid > 1_000  # the damage left many records readable, not only refused ones


def test_a_record_is_read_whole_or_not_at_all() -> None:
    """`look_record`, the read of every served record: the decoded message; False for a
    version-2 record that fails its checksum (when verifying); None where no whole record
    lies before the limit or its fields overrun it."""
    from broker.store import codec

    props = {"a": "x\x01y", Prop.UNIQ_KEY: "U1"}  # a value may hold \x01 once stored
    rec = _record(b"payload", props={"a": "xQy", Prop.UNIQ_KEY: "U1"})
    rec[rec.index(b"xQy") + 1] = 1
    reseal(rec, 0)
    for look in (codec.look_record, codec.py_look_record):
        msg = look(bytes(rec), 0, len(rec), True)
        assert msg == decode_message(rec)
        assert msg.properties == props and msg.store_host == STORE_HOST
        assert look(bytes(rec), 0, len(rec) - 1, True) is None  # the limit cuts it
        assert look(bytes(rec), -1, len(rec), True) is None
        assert look(bytes(rec) + bytes(8), 0, len(rec) + 8, True) == msg
        damaged = bytearray(rec)
        damaged[HEADER_AT_BODY] ^= 0x01  # a body byte: the checksum fails
        assert look(bytes(damaged), 0, len(rec), True) is False
        assert look(bytes(damaged), 0, len(rec), False).body == b"qayload"
        overrun = bytearray(rec)
        overrun[84:88] = (len(rec)).to_bytes(4, "big")  # BODYLEN past the record's end
        assert look(bytes(overrun), 0, len(rec), False) is None
        skipped = _record(props={"k": "v", "n": "w"})
        # a property without its \x01 is skipped, not an error (the lenient decode)
        raw = bytes(skipped).replace(b"k\x01v\x02", b"kxv\x02")
        assert look(raw, 0, len(raw), False).properties == {"n": "w"}
        bad_text = bytes(skipped).replace(b"k\x01v", b"k\x01\xff")
        assert look(bad_text, 0, len(bad_text), False) is None
        v1 = _v1_record(b"written-by-v1")
        assert look(bytes(v1), 0, len(v1), True).body == b"written-by-v1"


HEADER_AT_BODY = 88


def test_compiled_and_python_record_reads_agree() -> None:
    """The compiled `look_record` gives the Python one's result (the same message, None
    or False) on records and on (seeded) damaged copies of them, verifying or not."""
    from broker.store import codec

    assert codec.look_record is not codec.py_look_record  # the compiled one is in use
    records = [
        _record(),
        _record(b"x" * 300, topic="тема", props={"a": "é", Prop.UNIQ_KEY: "U"}),
        _record(props={}),
        _record(props={"": "v", "b": "", "c": "1Q2"}).replace(b"1Q2", b"1\x012"),
        _v1_record(),
    ]
    rng = random.Random(20261124)
    valid = refused = failed = 0
    for i in range(20_000):
        buf = _damaged(rng, rng.choice(records), least=0 if i < 50 else 1)
        data = bytes(buf) + bytes(rng.randrange(3))
        limit = len(data) - rng.randrange(3)
        verify = rng.random() < 0.5
        want = codec.py_look_record(data, 0, limit, verify)
        assert codec.look_record(data, 0, limit, verify) == want
        assert codec.look_record(memoryview(bytearray(data)), 0, limit, verify) == want
        valid += want is not None and want is not False
        refused += want is None
        failed += want is False
    assert valid > 1_000 and refused > 1_000 and failed > 1_000


def test_recoverys_scan_gives_the_full_checks_verdict() -> None:
    """`scan_record` (compiled checks, position and RECORDCRC) answers as
    `check_message_and_return_size(..., check_crc=True, expected_offset=...)` does, with the
    record's store time, on records and on (seeded) damaged copies, resealed or not (a
    damaged record whose checksum matches again), at the expected position or not."""
    from broker.store import codec

    assert codec._dispatch_record is not None  # the compiled path is the one tested
    records = [
        _record(),
        _record(b"x" * 300, topic="тема", props={"a": "é", Prop.UNIQ_KEY: "U"}),
        _record(props={}),
        _record(topic="SCHEDULE_TOPIC_XXXX", props={Prop.TIMER_DELIVER_MS: "1700000005000"}),
    ]

    def want(buf: bytes, pos: int, expected: int) -> tuple[int, int]:
        size, req = check_message_and_return_size(buf, pos, True, expected)
        return size, (req.store_timestamp if req is not None else 0)

    tail = encode_blank(16) + bytes(8)
    for rec in records:
        for buf in (bytes(rec), bytes(rec) + tail, bytes(rec) + bytes(3)):
            for pos, expected in ((0, 4096), (0, 4097), (len(rec), 4096 + len(rec))):
                assert codec.scan_record(buf, pos, expected) == want(buf, pos, expected)
    rng = random.Random(20261129)
    valid = 0
    for _ in range(20_000):
        buf = _damaged(rng, rng.choice(records))
        if rng.random() < 0.5 and len(buf) >= 91:
            with contextlib.suppress(Exception):  # a header too broken to reseal stays so
                reseal(buf, 0)
        expected = 4096 if rng.random() < 0.9 else rng.choice([0, 4095, 4097])
        verdict = want(bytes(buf), 0, expected)
        assert codec.scan_record(bytes(buf), 0, expected) == verdict
        valid += verdict[0] > 0
    assert valid > 1_000
