"""Message values that cross the store's boundary, and the status values of its hot paths.

`Message` is what a producer hands the store; `MessageExt` is what the store hands back:
the same plus everything assigned at store time (offsets, timestamps, hosts). The byte
layout of a stored record lives in `broker.store.codec`.
"""

from __future__ import annotations

import enum
import socket
import struct
from dataclasses import dataclass, field
from typing import Protocol

from protocol.clock import wall_ms
from protocol.props import Prop


class SysFlag(enum.IntFlag):
    """Bits of the record's SYSFLAG field."""

    NONE = 0
    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_PREPARED = 0x1 << 2
    TRANSACTION_COMMIT = 0x2 << 2
    TRANSACTION_ROLLBACK = 0x3 << 2
    BORNHOST_V6 = 0x1 << 4
    STOREHOST_V6 = 0x1 << 5

    @staticmethod
    def transaction_value(flag: int) -> int:
        return flag & (0x3 << 2)


class PutMessageStatus(enum.Enum):
    """Outcome of a put, as the producer's acknowledgement reports it."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"  # written, but fsync did not finish in time
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"  # not running / shutting down
    DISK_FULL = "DISK_FULL"  # disk use above the refuse watermark
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGE_CACHE_BUSY = "OS_PAGE_CACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"

    @property
    def ok(self) -> bool:
        return self is PutMessageStatus.PUT_OK

    @property
    def stored(self) -> bool:
        """The bytes are in the commitlog (possibly not yet on disk)."""
        return self in (
            PutMessageStatus.PUT_OK,
            PutMessageStatus.FLUSH_DISK_TIMEOUT,
            PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
            PutMessageStatus.SLAVE_NOT_AVAILABLE,
        )


class GetMessageStatus(enum.Enum):
    """Outcome of reading a consume queue."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"  # units read, none passed the tag filter
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"  # offset > max offset
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"  # offset == max offset: nothing new yet
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"  # offset < min offset (files were cleaned)
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


def encode_properties(props: dict[str, str]) -> bytes:
    """`name\\x01value\\x02` pairs, UTF-8."""
    if not props:
        return b""
    return "".join(f"{k}\x01{v}\x02" for k, v in props.items()).encode()


def decode_properties(raw: bytes) -> dict[str, str]:
    """Inverse of `encode_properties`; a pair without `\\x01` is skipped."""
    if not raw:
        return {}
    text = raw.decode()
    if text[-1] == "\x02" and text.count("\x02") == 1 and text.count("\x01") == 1:
        # one whole pair (a producer's message with its UNIQ_KEY alone): half the cost
        name, _, value = text[:-1].partition("\x01")
        return {name: value}
    try:  # the fast path: well-formed properties (every record the store writes)
        return dict(pair.split("\x01", 1) for pair in text.split("\x02") if pair)
    except ValueError:
        pass
    out: dict[str, str] = {}
    for pair in text.split("\x02"):
        if not pair:
            continue
        name, sep, value = pair.partition("\x01")
        if sep:
            out[name] = value
    return out


class _PropertyAccessors:
    """The properties a message carries by name: tags, keys, unique key."""

    __slots__ = ()
    properties: dict[str, str]

    @property
    def tags(self) -> str | None:
        return self.properties.get(Prop.TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(Prop.KEYS, "")
        return [k for k in raw.split(" ") if k]

    @property
    def unique_key(self) -> str | None:
        return self.properties.get(Prop.UNIQ_KEY)


@dataclass(slots=True)
class Message(_PropertyAccessors):
    """A message as a producer hands it to the store."""

    topic: str
    body: bytes
    queue_id: int = 0
    flag: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    sys_flag: int = 0
    born_timestamp: int = field(default_factory=wall_ms)
    born_host: tuple[str, int] = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_tx_offset: int = 0


@dataclass(slots=True)
class MessageExt(_PropertyAccessors):
    """A stored message: the record read back from the commitlog, every field of it."""

    topic: str
    body: bytes
    queue_id: int
    flag: int
    properties: dict[str, str]
    sys_flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    reconsume_times: int
    prepared_tx_offset: int
    # assigned by the store
    queue_offset: int
    commitlog_offset: int
    store_timestamp: int
    store_host: tuple[str, int]
    store_size: int
    body_crc: int

    @property
    def offset_msg_id(self) -> str:
        return encode_offset_msg_id(self.store_host, self.commitlog_offset)

    @property
    def msg_id(self) -> str:
        """The client-visible id: `UNIQ_KEY` when set, else the offset message id."""
        return self.unique_key or self.offset_msg_id


# --- offset message id: store host (IPv4 4 B + port 4 B) + commitlog offset (8 B), 32 hex chars
_OFFSET_ID = struct.Struct(">4sIq")


def encode_offset_msg_id(store_host: tuple[str, int], commitlog_offset: int) -> str:
    ip = socket.inet_aton(store_host[0])
    return _OFFSET_ID.pack(ip, store_host[1], commitlog_offset).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[tuple[str, int], int]:
    """Inverse of `encode_offset_msg_id`; raises ValueError for anything else."""
    if len(msg_id) != 32:
        raise ValueError(f"offset message id must be 32 hex chars, got {len(msg_id)}")
    ip, port, offset = _OFFSET_ID.unpack(bytes.fromhex(msg_id))
    return (socket.inet_ntoa(ip), port), offset


class _PlacedRecords(Protocol):
    def offsets(self) -> list[int]: ...


class AppendMessageResult:
    """Where a record (or a batch) landed in the commitlog.

    A plain slotted class, built once per put on the hot path: the offset message id (32
    hex characters) is formatted only when someone reads `msg_id` (pass `msg_id_prefix`,
    the store host's 16 hex characters, instead of `msg_id`).
    """

    __slots__ = (
        "_batch",
        "_id_prefix",
        "_msg_id",
        "msg_num",
        "queue_offset",
        "store_timestamp",
        "wrote_bytes",
        "wrote_offset",
    )

    def __init__(
        self,
        wrote_offset: int,
        wrote_bytes: int,
        msg_id: str | None = None,
        store_timestamp: int = 0,
        queue_offset: int = 0,
        msg_num: int = 1,
        *,
        msg_id_prefix: str = "",
        batch: _PlacedRecords | None = None,
    ) -> None:
        self.wrote_offset = wrote_offset  # commitlog offset of the first record
        self.wrote_bytes = wrote_bytes
        self._msg_id = msg_id
        self.store_timestamp = store_timestamp
        self.queue_offset = queue_offset  # consume-queue offset of the first message
        self.msg_num = msg_num
        self._id_prefix = msg_id_prefix
        self._batch = batch  # a put_batch's RecordBatch: its records' offsets, on demand

    @property
    def record_offsets(self) -> list[int]:
        """Commitlog offset of every record (a batch's may have a blank record between two
        of them, where it crossed into the next file)."""
        if self._batch is None:
            return [self.wrote_offset]
        return self._batch.offsets()

    def msg_id_at(self, offset: int) -> str:
        """Offset message id of the record at commitlog `offset` (one of `record_offsets`)."""
        return f"{self._id_prefix or (self._msg_id or '')[:16]}{offset:016X}"

    @property
    def msg_id(self) -> str:
        """Offset message id of the first record."""
        msg_id = self._msg_id
        if msg_id is None:
            msg_id = self._msg_id = self.msg_id_at(self.wrote_offset)
        return msg_id

    @msg_id.setter
    def msg_id(self, value: str) -> None:
        self._msg_id = value

    def _key(self) -> tuple[int, int, str, int, int, int]:
        return (
            self.wrote_offset,
            self.wrote_bytes,
            self.msg_id,
            self.store_timestamp,
            self.queue_offset,
            self.msg_num,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AppendMessageResult):
            return NotImplemented
        return self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dataclass it replaced

    def __repr__(self) -> str:
        return (
            f"AppendMessageResult(wrote_offset={self.wrote_offset}, "
            f"wrote_bytes={self.wrote_bytes}, msg_id={self.msg_id!r}, "
            f"store_timestamp={self.store_timestamp}, queue_offset={self.queue_offset}, "
            f"msg_num={self.msg_num})"
        )


@dataclass(slots=True)
class PutMessageResult:
    status: PutMessageStatus
    append: AppendMessageResult | None = None

    @property
    def ok(self) -> bool:
        return self.status.ok


@dataclass(slots=True)
class GetMessageResult:
    """What a consume-queue read returns: messages plus where to continue."""

    status: GetMessageStatus
    messages: list[MessageExt]
    next_begin_offset: int
    min_offset: int
    max_offset: int

    @property
    def found(self) -> bool:
        return self.status is GetMessageStatus.FOUND
