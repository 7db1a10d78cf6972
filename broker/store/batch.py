"""Batch records: N records of one topic/queue sharing flag, sys flag, born time/host and
properties (the `MessageStore.put_batch` fast path).

Every record is an ordinary commitlog record (codec.py layout): recovery, dispatch and
queries read it exactly like a record of `put_message`. What is constant over the batch
(topic bytes, shared property bytes, hosts, sys flag) is encoded once. A record's
properties are the shared ones, then `KEYS` and `UNIQ_KEY` when given per message, in that
order: the same bytes as `put_message` with `{**shared, KEYS: k, UNIQ_KEY: u}`.

`encode_batch` checks a batch and returns a `RecordBatch`; under its lock the commitlog
calls `place` once per file the batch lands in, which writes as many whole records as fit,
QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP included, straight into the mapping.

Two implementations write the same bytes: the compiled `_recordpack` module (built from
`_recordpack.c` at install: per record a CRC and two copies, ~0.1 us for 1 KiB, written in
place) and `EncodedBatch` below (~2 us: records laid out in a buffer first, then patched
and copied), the reference and the fallback where no C compiler was at hand. `NATIVE`
tells which one `encode_batch` uses; the tests run both and compare bytes.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from broker.store.codec import (
    CRC_MASK,
    FIXED_SIZE,
    HEADER,
    HEADER_SIZE,
    MAX_PROPERTIES_LENGTH,
    POS_CRC,
    POS_QUEUE_OFFSET,
    RECORD_MAGIC_CODE,
    EncodeError,
    cached_host,
    is_queued,
    remember,
    topic_tail,
)
from broker.store.message import PutMessageStatus
from protocol.props import Prop

try:
    from broker.store import _recordpack
except ImportError:  # not built (no C compiler at install): the Python path
    COMPILED = False
else:
    COMPILED = True

NATIVE: bool = COMPILED
"""True when `encode_batch` uses the compiled encoder (tests switch it off to compare)."""

_KEYS = Prop.KEYS.encode()
_UNIQ_KEY = Prop.UNIQ_KEY.encode()
_I16_MAX = MAX_PROPERTIES_LENGTH
_pack_i16 = struct.Struct(">h").pack
_ILLEGAL = PutMessageStatus.MESSAGE_ILLEGAL
# at POS_QUEUE_OFFSET (20): QUEUEOFFSET 8, PHYSICALOFFSET 8, SYSFLAG 4, BORNTIMESTAMP 8,
# BORNHOST 8, STORETIMESTAMP 8: one pack_into rewrites the offsets and the store time
_pack_offsets_to_ts = struct.Struct(">qqiq8sq").pack_into
_pack_crc = struct.Struct(">I").pack_into
_pack_dynamic = struct.Struct(">qqq").pack  # what RECORDCRC covers last (codec.py)


class RecordBatch(Protocol):
    """A checked batch, placed by the commitlog file by file."""

    @property
    def count(self) -> int: ...

    @property
    def total(self) -> int: ...  # bytes of all its records

    def next_size(self) -> int:
        """Size of the next record to place; 0 when all are placed."""
        ...

    def offsets(self) -> list[int]:
        """Commitlog offsets of the records placed so far."""
        ...

    def place(
        self,
        buffer: mmap.mmap | bytearray,
        pos: int,
        limit: int,
        queue_offset: int,
        step: int,
        phy_base: int,
        store_timestamp: int,
    ) -> tuple[int, int, int]:
        """Write the next records that fit whole into `buffer[pos:limit]`, with queue offsets
        from `queue_offset` (+ `step` a record), PHYSICALOFFSET `phy_base` + position and
        STORETIMESTAMP; (records written, position after them, next queue offset)."""
        ...


@dataclass(slots=True)
class EncodedBatch:
    """The Python `RecordBatch`: records laid out back to back in `buf` (`starts[i]` the
    offset of record i, `starts[-1] == len(buf)`), offsets 0 until placed."""

    buf: bytearray
    starts: list[int]
    sys_flag: int
    born_timestamp: int
    born_host_raw: bytes
    partials: list[int]  # each record's checksum before the fields patched in (codec.py)
    cursor: int = 0  # records placed so far
    phys: list[int] = field(default_factory=list)  # their commitlog offsets

    @property
    def count(self) -> int:
        return len(self.starts) - 1

    @property
    def total(self) -> int:
        return self.starts[-1]

    def next_size(self) -> int:
        i = self.cursor
        return 0 if i >= self.count else self.starts[i + 1] - self.starts[i]

    def offsets(self) -> list[int]:
        return list(self.phys)

    def place(
        self,
        buffer: mmap.mmap | bytearray,
        pos: int,
        limit: int,
        queue_offset: int,
        step: int,
        phy_base: int,
        store_timestamp: int,
    ) -> tuple[int, int, int]:
        starts, count, i = self.starts, self.count, self.cursor
        a = starts[i]
        room = limit - pos
        if starts[count] - a <= room:  # the rest fits: the common case
            j = count
        else:  # records i..j-1 fit
            j = bisect_right(starts, a + room, i + 1, count + 1) - 1
        if j <= i:
            return 0, pos, queue_offset
        buf, sys_flag = self.buf, self.sys_flag
        born_ts, born_host = self.born_timestamp, self.born_host_raw
        base = phy_base + pos - a  # PHYSICALOFFSET of the record at buf offset s: base + s
        phys = [base + s for s in starts[i:j]]
        partials = self.partials
        for k, (s, phy) in enumerate(zip(starts[i:j], phys, strict=True), start=i):
            _pack_offsets_to_ts(
                buf,
                s + POS_QUEUE_OFFSET,
                queue_offset,
                phy,
                sys_flag,
                born_ts,
                born_host,
                store_timestamp,
            )
            _pack_crc(
                buf,
                s + POS_CRC,
                zlib.crc32(_pack_dynamic(queue_offset, phy, store_timestamp), partials[k])
                & CRC_MASK,
            )
            queue_offset += step
        n = starts[j] - a
        buffer[pos : pos + n] = memoryview(buf)[a : starts[j]]
        self.phys.extend(phys)
        self.cursor = j
        return j - i, pos + n, queue_offset


def _props_raw(properties: Mapping[str, str]) -> bytes:
    raw = "".join([f"{k}\x01{v}\x02" for k, v in properties.items()]).encode()
    n = len(properties)
    if raw.count(b"\x01") != n or raw.count(b"\x02") != n:
        raise EncodeError(_ILLEGAL, "a property name or value holds \\x01 or \\x02")
    return raw


_SHARED: dict[tuple[tuple[str, str], ...], bytes] = {}  # shared properties -> encoded
_SHARED_LIMIT = 1024


def _shared_raw(properties: Mapping[str, str]) -> bytes:
    """`_props_raw` through a bounded cache: a producer's batches share their properties."""
    items = tuple(properties.items())
    try:
        raw = _SHARED.get(items)
    except TypeError:  # an unhashable value: not cacheable (and refused below)
        return _props_raw(properties)
    return (
        raw if raw is not None else remember(_SHARED, items, _props_raw(properties), _SHARED_LIMIT)
    )


def _per_message(name: str, values: Sequence[str] | None, count: int) -> list[bytes] | None:
    if values is None:
        return None
    if len(values) != count:
        raise EncodeError(_ILLEGAL, f"{len(values)} {name} values for {count} bodies")
    if not all(isinstance(v, str) for v in values):
        raise EncodeError(_ILLEGAL, f"a {name} value is not a str")
    try:
        raw = [f"{name}\x01{v}\x02".encode() for v in values]
    except UnicodeEncodeError as exc:
        raise EncodeError(_ILLEGAL, f"a {name} value does not encode: {exc}") from exc
    joined = b"".join(raw)
    if joined.count(b"\x01") != count or joined.count(b"\x02") != count:
        raise EncodeError(_ILLEGAL, f"a {name} value holds \\x01 or \\x02")
    return raw


def encode_batch(
    topic: str,
    queue_id: int,
    bodies: Sequence[bytes],
    properties: Mapping[str, str] | None,
    keys: Sequence[str] | None,
    uniq_keys: Sequence[str] | None,
    flag: int,
    sys_flag: int,
    born_timestamp: int,
    born_host: tuple[str, int],
    store_host_raw: bytes,
    max_message_size: int,
    max_record: int,
) -> tuple[RecordBatch, str | None]:
    """Check and encode the batch: (the batch, its topic-queue key or None when its records
    take no queue offset); EncodeError (nothing to store) for any invalid part of it.

    Each record must fit `max_message_size` (body + topic + properties) and `max_record`
    (a commitlog file less its end blank); the whole batch's bodies, topics and properties
    must fit `max_message_size` too, as a RocketMQ batch must.
    """
    count = len(bodies)
    if count == 0:
        raise EncodeError(_ILLEGAL, "empty batch")
    if queue_id < 0:
        raise EncodeError(_ILLEGAL, f"queue id {queue_id} is negative")
    tail = topic_tail(topic)
    shared_raw = _checked_shared(properties or {}, keys, uniq_keys)
    host = cached_host(born_host)
    key = f"{topic}-{queue_id}" if is_queued(sys_flag) else None
    if NATIVE:
        try:
            return _recordpack.prepare(
                bodies,
                tail,
                shared_raw,
                _KEYS,
                keys,
                _UNIQ_KEY,
                uniq_keys,
                queue_id,
                flag,
                sys_flag,
                born_timestamp,
                host,
                store_host_raw,
                max_message_size,
                max_record,
            ), key
        except OverflowError as exc:
            status = (
                PutMessageStatus.PROPERTIES_SIZE_EXCEEDED if "properties" in str(exc) else _ILLEGAL
            )
            raise EncodeError(status, str(exc)) from exc
        except TypeError:
            pass  # bodies that are bytes-like but not bytes: the Python path takes them
        except ValueError as exc:  # a bad value, a record or the batch too large
            raise EncodeError(_ILLEGAL, str(exc)) from exc
    const_tail, tails = _record_tails(tail, shared_raw, keys, uniq_keys, count)
    tails_len = len(const_tail) * count if tails is None else sum(map(len, tails))
    # the batch as RocketMQ sizes it: bodies + topics + properties of every message
    payload = sum(map(len, bodies)) + tails_len - 3 * count
    if payload > max_message_size:
        raise EncodeError(_ILLEGAL, f"batch of {payload} bytes exceeds {max_message_size}")
    batch, biggest = _encode_records(
        bodies, const_tail, tails, queue_id, flag, sys_flag, born_timestamp, host, store_host_raw
    )
    if biggest - FIXED_SIZE > max_message_size or biggest > max_record:
        raise EncodeError(_ILLEGAL, f"a record of {biggest} bytes is too large")
    return batch, key


def _checked_shared(
    shared: Mapping[str, str], keys: Sequence[str] | None, uniq_keys: Sequence[str] | None
) -> bytes:
    """The shared properties' bytes; KEYS and UNIQ_KEY may be shared or per message, not
    both."""
    if keys is not None and Prop.KEYS in shared:
        raise EncodeError(_ILLEGAL, "KEYS given both shared and per message")
    if uniq_keys is not None and Prop.UNIQ_KEY in shared:
        raise EncodeError(_ILLEGAL, "UNIQ_KEY given both shared and per message")
    return _shared_raw(shared)


def _record_tails(
    tail: bytes,
    shared_raw: bytes,
    keys: Sequence[str] | None,
    uniq_keys: Sequence[str] | None,
    count: int,
) -> tuple[bytes, list[bytes] | None]:
    """What follows each body (topic, properties length, properties): one tail for every
    record when no message has keys of its own, else one per record (the constant one
    then empty)."""
    per_keys = _per_message(Prop.KEYS, keys, count)
    per_uniq = _per_message(Prop.UNIQ_KEY, uniq_keys, count)
    if per_keys is None and per_uniq is None:
        plen = len(shared_raw)
        if plen > _I16_MAX:
            raise EncodeError(
                PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
                f"properties of {plen} bytes exceed {_I16_MAX}",
            )
        return tail + plen.to_bytes(2, "big") + shared_raw, None
    if per_keys is not None and per_uniq is not None:
        raws = [shared_raw + k + u for k, u in zip(per_keys, per_uniq, strict=True)]
    else:
        raws = [shared_raw + x for x in (per_keys or per_uniq or ())]
    if max(map(len, raws)) > _I16_MAX:
        raise EncodeError(
            PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
            f"properties of {max(map(len, raws))} bytes exceed {_I16_MAX}",
        )
    return b"", [tail + _pack_i16(len(raw)) + raw for raw in raws]


def _encode_records(
    bodies: Sequence[bytes],
    const_tail: bytes,
    tails: list[bytes] | None,
    queue_id: int,
    flag: int,
    sys_flag: int,
    born_timestamp: int,
    host: bytes,
    store_host_raw: bytes,
) -> tuple[EncodedBatch, int]:
    """The records laid out in one buffer (the Python path), each with the CRC of its
    fields known so far (the offsets and store time are patched in by `place`), and the
    size of the largest record."""
    pack = HEADER.pack
    crc32 = zlib.crc32
    parts: list[bytes] = []
    append = parts.append
    starts: list[int] = []
    partials: list[int] = []
    at = 0
    biggest = 0
    try:
        for i, body in enumerate(bodies):
            t = const_tail if tails is None else tails[i]
            blen = len(body)
            total = HEADER_SIZE + blen + len(t)
            header = pack(
                total,
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
                0,
                0,
                blen,
            )
            partials.append(crc32(t, crc32(body, crc32(header))))
            append(header)
            append(body)
            append(t)
            starts.append(at)
            at += total
            if total > biggest:
                biggest = total
        buf = bytearray().join(parts)  # one copy
    except (TypeError, struct.error) as exc:  # a body not bytes, a field out of range
        raise EncodeError(_ILLEGAL, f"cannot encode the batch: {exc}") from exc
    starts.append(at)
    return EncodedBatch(buf, starts, sys_flag, born_timestamp, host, partials), biggest
