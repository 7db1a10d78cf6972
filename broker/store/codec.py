"""The commitlog record: layout, encoding, validation and decoding (docs/store.md).

Commitlog record, big-endian, 91 bytes + body + topic + properties:

    offset size  field
     0     4     TOTALSIZE           whole record, these 4 bytes included
     4     4     MAGICCODE           RECORD_MAGIC_CODE (0xDAA320B2): version 2, written now
                                     MESSAGE_MAGIC_CODE (0xDAA320A7): version 1, read only
     8     4     CRC                 v2: RECORDCRC, the checksum of the whole record (below)
                                     v1: BODYCRC, zlib.crc32(body) & 0x7FFFFFFF
    12     4     QUEUEID
    16     4     FLAG                producer's flag, opaque
    20     8     QUEUEOFFSET         index in the consume queue     (set under the lock)
    28     8     PHYSICALOFFSET      commitlog offset of this record (set under the lock)
    36     4     SYSFLAG             SysFlag bits
    40     8     BORNTIMESTAMP       ms
    48     8     BORNHOST            IPv4 4 B + port i32
    56     8     STORETIMESTAMP      ms                             (set under the lock)
    64     8     STOREHOST           IPv4 4 B + port i32
    72     4     RECONSUMETIMES
    76     8     PREPARED_TX_OFFSET
    84     4     BODYLEN
    88     n     BODY
    88+n   1     TOPICLEN            1..127
    89+n   t     TOPIC               UTF-8
    89+n+t 2     PROPERTIESLEN       0..32767
    91+n+t p     PROPERTIES          UTF-8 `name\\x01value\\x02` pairs

Blank record, filling the tail of a file that cannot hold the next record (at least 8
bytes are always left for it):

     0     4     TOTALSIZE           bytes left in the file
     4     4     MAGICCODE           BLANK_MAGIC_CODE (0xCBD43194)
     8     ...   unspecified (zeros)

Everything but QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP is encoded before the
commitlog's append lock is taken; under it only those three are patched in.

RECORDCRC (version 2) covers every byte of the record. So that the costly part is computed
outside the lock, it is defined in two steps:

    partial   = zlib.crc32(the record with CRC, QUEUEOFFSET, PHYSICALOFFSET and
                           STORETIMESTAMP all zero)                     (encoding, no lock)
    RECORDCRC = zlib.crc32(QUEUEOFFSET + PHYSICALOFFSET + STORETIMESTAMP, partial)
                & 0x7FFFFFFF                                   (placing: 24 bytes, locked)

An encoded record not yet placed carries `partial` (unmasked) in its CRC field; `seal`
patches the three fields and replaces it with RECORDCRC.
"""

from __future__ import annotations

import functools
import mmap
import socket
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from broker.store.errors import InvalidMessage
from broker.store.message import MessageExt, PutMessageStatus, SysFlag, decode_properties
from protocol.names import SCHEDULE_TOPIC, TOPIC_MAX_LENGTH
from protocol.props import Prop

MESSAGE_MAGIC_CODE = -626843481  # 0xDAA320A7 as a signed i32: version 1 (body CRC)
RECORD_MAGIC_CODE = -626843470  # 0xDAA320B2 as a signed i32: version 2 (whole-record CRC)
RECORD_MAGIC_CODES = (RECORD_MAGIC_CODE, MESSAGE_MAGIC_CODE)
BLANK_MAGIC_CODE = -875286124  # 0xCBD43194 as a signed i32
END_FILE_MIN_BLANK_LENGTH = 4 + 4  # TOTALSIZE + MAGICCODE of a blank record

MAX_PROPERTIES_LENGTH = 32767  # PROPERTIESLEN is an i16

# TOTALSIZE .. BODYLEN: the 88 fixed bytes before the body
HEADER = struct.Struct(">iiiiiqqiq8sq8siqi")
HEADER_SIZE = HEADER.size  # 88
assert HEADER_SIZE == 88
FIXED_SIZE = HEADER_SIZE + 1 + 2  # + TOPICLEN + PROPERTIESLEN = 91
POS_QUEUE_OFFSET = 20
POS_PHYSICAL_OFFSET = 28
POS_STORE_TIMESTAMP = 56
QUEUE_AND_PHYSICAL_OFFSET = struct.Struct(">qq")  # at POS_QUEUE_OFFSET
STORE_TIMESTAMP = struct.Struct(">q")  # at POS_STORE_TIMESTAMP
BLANK = struct.Struct(">ii")  # TOTALSIZE, MAGICCODE
POS_CRC = 8
CRC_MASK = 0x7FFFFFFF
_U32 = struct.Struct(">I")
_DYNAMIC = struct.Struct(">qqq")  # QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP, as CRC'd
_ZEROS_16 = bytes(16)
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PREFIX = struct.Struct(">ii")  # TOTALSIZE, MAGICCODE
# what validation and dispatch need of the 88 fixed bytes (flag, born time/host, store host
# and reconsume times skipped as pad bytes: no bytes objects built for hosts):
#   TOTALSIZE MAGICCODE BODYCRC QUEUEID [FLAG] QUEUEOFFSET PHYSICALOFFSET SYSFLAG
#   [BORNTIMESTAMP BORNHOST] STORETIMESTAMP [STOREHOST RECONSUMETIMES] PREPARED_TX BODYLEN
_DISPATCH_HEADER = struct.Struct(">iiii4xqqi16xq12xqi")
assert _DISPATCH_HEADER.size == HEADER_SIZE

_TRAN_MASK = 0x3 << 2
_NOT_QUEUED = (int(SysFlag.TRANSACTION_PREPARED), int(SysFlag.TRANSACTION_ROLLBACK))


def body_crc(body: bytes | bytearray | memoryview) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


def record_crc(buf: memoryview | bytes | bytearray | mmap.mmap, pos: int, total: int) -> int:
    """RECORDCRC of the version-2 record of `total` bytes at `pos` (its CRC field ignored).

    The compiled `_recordpack.record_crc` replaces this when built (one call, ~0.2 us for a
    1 KiB record against ~1.5 us here); the two are compared by the tests."""
    head = bytearray(buf[pos : pos + HEADER_SIZE])
    dynamic = (
        head[POS_QUEUE_OFFSET : POS_QUEUE_OFFSET + 16]
        + head[POS_STORE_TIMESTAMP : POS_STORE_TIMESTAMP + 8]
    )
    head[POS_CRC : POS_CRC + 4] = b"\0\0\0\0"
    head[POS_QUEUE_OFFSET : POS_QUEUE_OFFSET + 16] = _ZEROS_16
    head[POS_STORE_TIMESTAMP : POS_STORE_TIMESTAMP + 8] = _ZEROS_16[:8]
    partial = zlib.crc32(memoryview(buf)[pos + HEADER_SIZE : pos + total], zlib.crc32(head))
    return zlib.crc32(dynamic, partial) & CRC_MASK


def seal(
    buf: bytearray | mmap.mmap | memoryview,
    pos: int,
    queue_offset: int,
    physical_offset: int,
    store_timestamp: int,
) -> None:
    """Patch QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP of the encoded record at `pos`
    and, for a version-2 record, turn its partial checksum into RECORDCRC."""
    QUEUE_AND_PHYSICAL_OFFSET.pack_into(buf, pos + POS_QUEUE_OFFSET, queue_offset, physical_offset)
    STORE_TIMESTAMP.pack_into(buf, pos + POS_STORE_TIMESTAMP, store_timestamp)
    if _I32.unpack_from(buf, pos + 4)[0] == RECORD_MAGIC_CODE:
        (partial,) = _U32.unpack_from(buf, pos + POS_CRC)
        _U32.pack_into(
            buf,
            pos + POS_CRC,
            _crc32(_DYNAMIC.pack(queue_offset, physical_offset, store_timestamp), partial)
            & CRC_MASK,
        )


def _py_write_partial(rec: bytearray | memoryview) -> None:
    _U32.pack_into(rec, POS_CRC, zlib.crc32(rec))


py_record_crc = record_crc
py_seal = seal
_write_partial = _py_write_partial
# `check_message_and_return_size` without a CRC check, compiled: (size, topic, queue id,
# physical offset, store time, queue offset, sys flag, prepared transaction offset,
# properties), or (0 | -1, None); None when not built
_dispatch_record: Callable[[Any, int], tuple[Any, ...]] | None = None
# `look_record`, compiled: (message type, host cache, buffer, pos, limit, verify)
_look_record_compiled: Callable[..., Any] | None = None
try:
    from broker.store import _recordpack
except ImportError:  # not built: the Python definitions
    pass
else:  # one C call each (and libdeflate's CRC when it was found at build time)
    record_crc = _recordpack.record_crc  # type: ignore[assignment]
    seal = _recordpack.seal  # type: ignore[assignment]
    _write_partial = _recordpack.partial  # type: ignore[assignment]
    # a module built from an older source has none: the Python path then
    _dispatch_record = getattr(_recordpack, "dispatch_record", None)
    _look_record_compiled = getattr(_recordpack, "look_record", None)


def look_record(
    buf: memoryview | bytes | bytearray | mmap.mmap, pos: int, limit: int, verify: bool
) -> MessageExt | Literal[False] | None:
    """The whole record at `pos` (all of it before `limit`), decoded: None when there is
    none there (a bad magic code or size, fields that overrun the record, text that is not
    UTF-8); False when `verify` and a version-2 record fails its RECORDCRC. The read path
    of every served record (`CommitLog.look_messages`); the compiled
    `_recordpack.look_record` replaces it when built (one call instead of ~25 interpreted
    operations: the checks, the checksum and the decode)."""
    limit = min(limit, len(buf))
    if pos < 0 or pos + FIXED_SIZE > limit:
        return None
    size, magic = _PREFIX.unpack_from(buf, pos)
    if magic not in RECORD_MAGIC_CODES or size < FIXED_SIZE or pos + size > limit:
        return None
    (blen,) = _I32.unpack_from(buf, pos + HEADER_SIZE - 4)
    if blen < 0 or FIXED_SIZE + blen > size:
        return None
    tlen = buf[pos + HEADER_SIZE + blen]
    if FIXED_SIZE + blen + tlen > size:
        return None
    (plen,) = _I16.unpack_from(buf, pos + HEADER_SIZE + blen + 1 + tlen)
    if plen < 0 or FIXED_SIZE + blen + tlen + plen != size:
        return None
    if (
        verify
        and magic == RECORD_MAGIC_CODE
        and record_crc(buf, pos, size) != _U32.unpack_from(buf, pos + POS_CRC)[0]
    ):
        return False
    try:
        return decode_message(buf, pos)
    except UnicodeDecodeError:
        return None


py_look_record = look_record
if _look_record_compiled is not None:
    # (message type, host cache) bound: a partial's call costs no interpreted frame
    look_record = functools.partial(_look_record_compiled, MessageExt, {})


def reseal(buf: bytearray | mmap.mmap | memoryview, pos: int) -> None:
    """Recompute the CRC of the valid-layout record at `pos` after a deliberate edit of its
    fields (tools and tests; the store itself never rewrites a record)."""
    total, magic = _PREFIX.unpack_from(buf, pos)
    if magic == RECORD_MAGIC_CODE:
        _U32.pack_into(buf, pos + POS_CRC, record_crc(buf, pos, total))
    elif magic == MESSAGE_MAGIC_CODE:
        (blen,) = _I32.unpack_from(buf, pos + HEADER_SIZE - 4)
        _U32.pack_into(
            buf, pos + POS_CRC, body_crc(buf[pos + HEADER_SIZE : pos + HEADER_SIZE + blen])
        )


def is_queued(sys_flag: int) -> bool:
    """False for PREPARED/ROLLBACK transaction records: no consume queue unit, offset 0."""
    return (sys_flag & _TRAN_MASK) not in _NOT_QUEUED


@functools.lru_cache(maxsize=4096)
def tags_string_to_code(tags: str | None) -> int:
    """Java `String.hashCode()` of the tags (signed 32-bit), 0 for no tags."""
    if not tags:
        return 0
    h = 0
    units = tags.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def tags_code_for(topic: str, properties: dict[str, str]) -> int:
    """The consume-queue tag code: the delivery time for the schedule topic, else the tags."""
    if topic == SCHEDULE_TOPIC:
        deliver = properties.get(Prop.TIMER_DELIVER_MS)
        if deliver is not None:
            try:
                return int(deliver)
            except ValueError:
                pass
    return tags_string_to_code(properties.get(Prop.TAGS))


@functools.lru_cache(maxsize=1024)
def encode_host(host: tuple[str, int]) -> bytes:
    """8 bytes: IPv4 + port. Anything not IPv4 is stored as 0.0.0.0 (the port is kept)."""
    try:
        ip = socket.inet_aton(host[0])
    except (OSError, TypeError):
        ip = b"\0\0\0\0"
    return ip + _I32.pack(host[1] & 0x7FFFFFFF)


@functools.lru_cache(maxsize=1024)
def decode_host(raw: bytes) -> tuple[str, int]:
    return socket.inet_ntoa(raw[:4]), _I32.unpack(raw[4:8])[0]


@dataclass(slots=True)
class DispatchRequest:
    """What a dispatcher needs from one commitlog record.

    Not frozen: one is built per dispatched record, and a frozen dataclass pays an
    `object.__setattr__` per field. Dispatchers treat it as read-only.
    """

    topic: str
    queue_id: int
    commitlog_offset: int
    msg_size: int
    tags_code: int
    store_timestamp: int
    queue_offset: int
    keys: str
    uniq_key: str | None
    sys_flag: int
    prepared_tx_offset: int
    properties: dict[str, str] = field(default_factory=dict)
    success: bool = True


class EncodeError(InvalidMessage):
    """A message cannot be encoded as a record; `status` is the put status to report."""

    def __init__(self, status: PutMessageStatus, reason: str) -> None:
        self.status = status
        super().__init__(reason)


@functools.lru_cache(maxsize=4096)
def _topic_tail(topic: str) -> bytes:
    """TOPICLEN + TOPIC, validated once per topic."""
    raw = topic.encode()
    if not 0 < len(raw) <= TOPIC_MAX_LENGTH or b"\x00" in raw:
        raise EncodeError(
            PutMessageStatus.MESSAGE_ILLEGAL,
            f"topic must be 1..{TOPIC_MAX_LENGTH} bytes without NUL: {topic!r}",
        )
    if b"/" in raw or topic in (".", ".."):
        # it names a consume-queue directory: such a record could never be dispatched
        raise EncodeError(
            PutMessageStatus.MESSAGE_ILLEGAL,
            f"topic cannot name a consume queue directory: {topic!r}",
        )
    return bytes((len(raw),)) + raw


topic_tail = _topic_tail  # TOPICLEN + TOPIC of a valid topic (EncodeError otherwise)

_TOPIC_TAILS: dict[str, bytes] = {}  # topic -> TOPICLEN + TOPIC, validated (bounded below)
_HOSTS: dict[tuple[str, int], bytes] = {}  # born host -> 8 encoded bytes
_CACHE_LIMIT = 4096
_pack_header = HEADER.pack
_pack_i16 = _I16.pack
_crc32 = zlib.crc32


K = TypeVar("K")
V = TypeVar("V")


def remember(cache: dict[K, V], key: K, value: V, limit: int = _CACHE_LIMIT) -> V:
    """Put `value` in a hot-path cache that is emptied whenever it reaches `limit` entries
    (the entries repeat: a put's topics, hosts, shared properties)."""
    if len(cache) >= limit:
        cache.clear()
    cache[key] = value
    return value


def cached_host(born_host: tuple[str, int]) -> bytes:
    """`encode_host` through a bounded cache: a put's hosts repeat."""
    host = _HOSTS.get(born_host)
    return host if host is not None else remember(_HOSTS, born_host, encode_host(born_host))


def encode_record(
    topic: str,
    queue_id: int,
    body: bytes,
    flag: int,
    properties: dict[str, str],
    sys_flag: int,
    born_timestamp: int,
    born_host: tuple[str, int],
    store_host_raw: bytes,
    reconsume_times: int,
    prepared_tx_offset: int,
    max_message_size: int,
) -> bytearray:
    """The whole record with QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP left at 0 and the
    partial checksum in its CRC field (`seal` completes it).

    Raises EncodeError with status MESSAGE_ILLEGAL or PROPERTIES_SIZE_EXCEEDED. On every
    put's path: topics and hosts are encoded once (dict caches), the rest in few C calls.
    """
    tail = _TOPIC_TAILS.get(topic)
    if tail is None:
        tail = remember(_TOPIC_TAILS, topic, _topic_tail(topic))
    if queue_id < 0:
        raise EncodeError(PutMessageStatus.MESSAGE_ILLEGAL, f"queue id {queue_id} is negative")
    if properties:
        props_raw = "".join([f"{k}\x01{v}\x02" for k, v in properties.items()]).encode()
        plen = len(props_raw)
        if plen > MAX_PROPERTIES_LENGTH:
            raise EncodeError(
                PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
                f"properties of {plen} bytes exceed {MAX_PROPERTIES_LENGTH}",
            )
        n = len(properties)
        if props_raw.count(b"\x01") != n or props_raw.count(b"\x02") != n:
            raise EncodeError(
                PutMessageStatus.MESSAGE_ILLEGAL, "a property name or value holds \\x01 or \\x02"
            )
    else:
        props_raw = b""
        plen = 0
    blen = len(body)
    size = blen + len(tail) - 1 + plen
    if size > max_message_size:
        raise EncodeError(
            PutMessageStatus.MESSAGE_ILLEGAL, f"message of {size} bytes exceeds {max_message_size}"
        )
    host = _HOSTS.get(born_host) or cached_host(born_host)
    rec = bytearray().join(
        (
            _pack_header(
                FIXED_SIZE + size,
                RECORD_MAGIC_CODE,
                0,
                queue_id,
                flag,
                0,
                0,
                sys_flag,
                born_timestamp,
                host,
                0,
                store_host_raw,
                reconsume_times,
                prepared_tx_offset,
                blen,
            ),
            body,
            tail,
            _pack_i16(plen),
            props_raw,
        )
    )
    _write_partial(rec)  # the partial checksum, in the CRC field until `seal`
    return rec


def check_message_and_return_size(
    buf: memoryview | bytes | bytearray | mmap.mmap,
    pos: int,
    check_crc: bool = True,
    expected_offset: int | None = None,
) -> tuple[int, DispatchRequest | None]:
    """Validate the record at `pos` of a file's buffer (either record version).

    Returns (size > 0, request) for a valid record; (0, None) for a blank record (or the
    exact end of the file): continue with the next file; (-1, None) for anything invalid
    (bad magic, size out of bounds, lengths that do not add up, a checksum mismatch: the
    whole record's for version 2, the body's for version 1, a
    PHYSICALOFFSET other than `expected_offset`, undecodable topic/properties, zeros).

    Without a CRC check or an expected offset (the dispatcher's reading of what this
    process appended), the compiled `_recordpack.dispatch_record` does the checks and
    decoding when built: the same verdicts and fields (a test compares them).
    """
    if not check_crc and expected_offset is None and _dispatch_record is not None and pos >= 0:
        fields = _dispatch_record(buf, pos)
        return fields if fields[1] is None else (fields[0], _dispatch_request(*fields))
    limit = len(buf)
    left = limit - pos
    if left == 0:
        return 0, None
    if left < END_FILE_MIN_BLANK_LENGTH:
        return -1, None
    total, magic = _PREFIX.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        return (0, None) if total == left else (-1, None)
    if (
        (magic != RECORD_MAGIC_CODE and magic != MESSAGE_MAGIC_CODE)
        or total < FIXED_SIZE
        or total > left
    ):
        return -1, None
    (_, _, crc, queue_id, queue_offset, phy, sys_flag, store_ts, prepared_tx, blen) = (
        _unpack_dispatch(buf, pos)
    )
    if expected_offset is not None and phy != expected_offset:
        return -1, None
    if blen < 0 or FIXED_SIZE + blen > total:
        return -1, None
    body_start = pos + HEADER_SIZE
    body_end = body_start + blen
    tlen = buf[body_end]
    props_len_at = body_end + 1 + tlen
    if tlen == 0 or FIXED_SIZE + blen + tlen > total:
        return -1, None
    (plen,) = _I16.unpack_from(buf, props_len_at)
    if plen < 0 or FIXED_SIZE + blen + tlen + plen != total:
        return -1, None
    if check_crc:
        if magic == RECORD_MAGIC_CODE:
            if record_crc(buf, pos, total) != crc:
                return -1, None
        elif (zlib.crc32(buf[body_start:body_end]) & CRC_MASK) != crc:
            return -1, None
    try:
        topic = str(buf[body_end + 1 : props_len_at], "utf-8")
        properties = _strict_properties(buf[props_len_at + 2 : props_len_at + 2 + plen])
    except ValueError:
        return -1, None
    if "\x00" in topic:
        return -1, None
    return total, _dispatch_request(
        total, topic, queue_id, phy, store_ts, queue_offset, sys_flag, prepared_tx, properties
    )


_MAGIC_CRC = struct.Struct(">iI")  # MAGICCODE, CRC


def scan_record(
    buf: memoryview | bytes | bytearray | mmap.mmap, pos: int, expected_offset: int
) -> tuple[int, int]:
    """`check_message_and_return_size(buf, pos, True, expected_offset)`'s verdict, and the
    record's store time (0 when not valid): recovery's scan, which needs nothing else.

    A version-2 record goes through the compiled checks (`_dispatch_record`), its position
    and its RECORDCRC: one C call each, ~2.5x faster than the Python path for a 1 KiB
    record. Anything those do not accept whole (a blank record, an invalid or version-1
    record) gets the Python path's verdict, so the answers are the same (a test compares
    them on damaged records)."""
    if _dispatch_record is not None and pos >= 0:
        fields = _dispatch_record(buf, pos)
        if fields[1] is not None and fields[3] == expected_offset:
            total = fields[0]
            magic, crc = _MAGIC_CRC.unpack_from(buf, pos + 4)
            if magic == RECORD_MAGIC_CODE:
                return (total, fields[4]) if record_crc(buf, pos, total) == crc else (-1, 0)
    size, req = check_message_and_return_size(buf, pos, True, expected_offset)
    return size, (req.store_timestamp if req is not None else 0)


def _dispatch_request(
    total: int,
    topic: str,
    queue_id: int,
    phy: int,
    store_ts: int,
    queue_offset: int,
    sys_flag: int,
    prepared_tx: int,
    properties: dict[str, str],
) -> DispatchRequest:
    """The request of a record checked valid, from its fields (the compiled reader's
    tuple, in this order, after its size)."""
    get = properties.get
    if topic == SCHEDULE_TOPIC:
        tags_code = tags_code_for(topic, properties)
    else:
        tags_code = tags_string_to_code(get(_TAGS))
    return DispatchRequest(
        topic,
        queue_id,
        phy,
        total,
        tags_code,
        store_ts,
        queue_offset,
        get(_KEYS, ""),
        get(_UNIQ_KEY),
        sys_flag,
        prepared_tx,
        properties,
    )


_unpack_dispatch = _DISPATCH_HEADER.unpack_from
_TAGS = Prop.TAGS
_KEYS = Prop.KEYS
_UNIQ_KEY = Prop.UNIQ_KEY


def _strict_properties(raw: bytes | bytearray | memoryview) -> dict[str, str]:
    """Decode properties, rejecting anything not made of whole `name\\x01value\\x02` pairs.

    One pass: every pair must split into exactly a name and a value (`dict` raises
    ValueError on a pair without `\\x01`; one with two leaves `\\x01` in the value, which
    the counts catch).
    """
    if not raw:
        return {}
    text = str(raw, "utf-8")
    pairs = text.count("\x02")
    if text[-1] != "\x02" or text.count("\x01") != pairs:
        raise ValueError("malformed properties")
    if pairs == 1:  # most records (a producer's message: its UNIQ_KEY alone): a third
        # of the general path's cost; one \x01 and the one \x02 at the end: one whole pair
        name, _, value = text[:-1].partition("\x01")
        return {name: value}
    return dict(pair.split("\x01", 1) for pair in text[:-1].split("\x02"))


def decode_message(buf: memoryview | bytes | bytearray | mmap.mmap, pos: int = 0) -> MessageExt:
    """Every field of the record at `pos` (no validation beyond the layout; `body_crc` is
    the CRC field as stored: RECORDCRC for version 2, BODYCRC for version 1)."""
    (
        total,
        magic,
        crc,
        queue_id,
        flag,
        queue_offset,
        phy,
        sys_flag,
        born_ts,
        born_host,
        store_ts,
        store_host,
        reconsume,
        prepared_tx,
        blen,
    ) = HEADER.unpack_from(buf, pos)
    if magic != RECORD_MAGIC_CODE and magic != MESSAGE_MAGIC_CODE:
        raise ValueError(f"no message record at {pos} (magic {magic & 0xFFFFFFFF:#x})")
    body_start = pos + HEADER_SIZE
    body_end = body_start + blen
    tlen = buf[body_end]
    raw_topic = bytes(buf[body_end + 1 : body_end + 1 + tlen])
    topic = _TOPICS.get(raw_topic)
    if topic is None:  # a read decodes the same few topic names over and over
        topic = raw_topic.decode()
        if len(_TOPICS) >= _TOPICS_KEPT:
            _TOPICS.clear()
        _TOPICS[raw_topic] = topic
    (plen,) = _I16.unpack_from(buf, body_end + 1 + tlen)
    props_at = body_end + 3 + tlen
    # positional, in MessageExt's field order (a read builds one per message)
    return MessageExt(
        topic,
        bytes(buf[body_start:body_end]),
        queue_id,
        flag,
        decode_properties(bytes(buf[props_at : props_at + plen])),
        sys_flag,
        born_ts,
        decode_host(born_host),
        reconsume,
        prepared_tx,
        queue_offset,
        phy,
        store_ts,
        decode_host(store_host),
        total,
        crc,
    )


_TOPICS: dict[bytes, str] = {}  # topic name bytes -> str, for decode_message
_TOPICS_KEPT = 4096


def encode_blank(size: int) -> bytes:
    return BLANK.pack(size, BLANK_MAGIC_CODE)


__all__ = [
    "BLANK_MAGIC_CODE",
    "END_FILE_MIN_BLANK_LENGTH",
    "MESSAGE_MAGIC_CODE",
    "RECORD_MAGIC_CODE",
    "DispatchRequest",
    "EncodeError",
    "check_message_and_return_size",
    "decode_message",
    "encode_record",
    "record_crc",
    "reseal",
    "seal",
    "tags_string_to_code",
]
