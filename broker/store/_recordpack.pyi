# Types of the compiled batch record packer (_recordpack.c); see broker/store/batch.py.
from collections.abc import Sequence

CRC: str  # "libdeflate" or "zlib": what computes the body CRC

def encode(bodies: Sequence[bytes], topic_tail: bytes, shared_properties: bytes,
           keys_name: bytes, keys: Sequence[str] | None, uniq_name: bytes,
           uniq_keys: Sequence[str] | None, queue_id: int, flag: int, sys_flag: int,
           born_timestamp: int, born_host: bytes, store_host: bytes, max_message_size: int,
           max_record: int, /) -> tuple[bytearray, list[int], int]: ...
def patch(buf: bytearray, starts: list[int], i: int, j: int, queue_offset: int, step: int,
          base: int, store_timestamp: int, /) -> int: ...
