# Types of the compiled batch record packer (_recordpack.c); see broker/store/batch.py.
import mmap
from collections.abc import Sequence

CRC: str  # "libdeflate" or "zlib": what computes the body CRC

class Batch:
    """A checked batch of records, written into mappings by `place`."""

    @property
    def count(self) -> int: ...
    @property
    def total(self) -> int: ...
    @property
    def payload(self) -> int: ...
    @property
    def placed(self) -> int: ...
    def next_size(self) -> int: ...
    def offsets(self) -> list[int]: ...
    def place(
        self,
        buffer: mmap.mmap | bytearray,
        pos: int,
        limit: int,
        queue_offset: int,
        step: int,
        phy_base: int,
        store_timestamp: int,
        /,
    ) -> tuple[int, int, int]: ...

def prepare(
    bodies: Sequence[bytes],
    topic_tail: bytes,
    shared_properties: bytes,
    keys_name: bytes,
    keys: Sequence[str] | None,
    uniq_name: bytes,
    uniq_keys: Sequence[str] | None,
    queue_id: int,
    flag: int,
    sys_flag: int,
    born_timestamp: int,
    born_host: bytes,
    store_host: bytes,
    max_message_size: int,
    max_record: int,
    /,
) -> Batch: ...
def record_crc(
    buffer: bytes | bytearray | memoryview | mmap.mmap, pos: int, total: int, /
) -> int: ...
def seal(
    buffer: bytearray | mmap.mmap | memoryview,
    pos: int,
    queue_offset: int,
    physical_offset: int,
    store_timestamp: int,
    /,
) -> None: ...
def partial(record: bytearray | memoryview, /) -> None: ...
def dispatch_record(
    buffer: bytes | bytearray | memoryview | mmap.mmap, pos: int, /
) -> tuple[object, ...]: ...
def index_entries(
    mapping: mmap.mmap | bytearray,
    entries_at: int,
    slots: int,
    first: int,
    begin: int,
    end_ts: int,
    used: int,
    records: list[tuple[Sequence[int], int, int]],
    /,
) -> tuple[int, int, int, int]: ...
