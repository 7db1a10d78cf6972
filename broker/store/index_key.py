"""Index keys and their hashes: what a record is indexed under, and how a key is hashed.

Every message is indexed under `topic#key` for each key in its `KEYS` property (space
separated) and under `topic#<UNIQ_KEY>`. The hash stored in an index entry is zlib's CRC-32
of the UTF-8 `topic#key`, masked to 31 bits (never negative). It runs at C speed and is
incremental: crc32(key, crc32(prefix)) == crc32(prefix + key), so the `topic#` part is
hashed once per topic. (RocketMQ hashes with |String.hashCode|; the index format is ours,
its files are derived data: see docs/store.md.)
"""

from __future__ import annotations

import functools
import zlib

from broker.store.codec import DispatchRequest

_HASH_MASK = 0x7FFFFFFF
_crc32 = zlib.crc32


def index_key_hash(key: str) -> int:
    """Non-negative key hash as stored in an entry: crc32(UTF-8 key) & 0x7FFFFFFF."""
    return _crc32(key.encode()) & _HASH_MASK


@functools.lru_cache(maxsize=4096)
def _topic_prefix_crc(topic: str) -> int:
    return _crc32(f"{topic}#".encode())


def topic_key_hash(topic: str, key: str) -> int:
    """`index_key_hash(topic + "#" + key)`, hashing only `key` (the prefix is cached)."""
    return _crc32(key.encode(), _topic_prefix_crc(topic)) & _HASH_MASK


def build_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


def _distinct_keys(request: DispatchRequest) -> list[str]:
    keys = request.keys
    if " " in keys:
        out = list(dict.fromkeys(k for k in keys.split(" ") if k))
    else:
        out = [keys] if keys else []
    uniq = request.uniq_key
    if uniq and uniq not in out:
        out.append(uniq)
    return out


def index_key_hashes(request: DispatchRequest) -> list[int]:
    """The stored hashes of every key a record is indexed under."""
    prefix = _topic_prefix_crc(request.topic)
    if not request.keys:  # most records: the unique key alone
        uniq = request.uniq_key
        return [_crc32(uniq.encode(), prefix) & _HASH_MASK] if uniq else []
    crc = _crc32
    return [crc(k.encode(), prefix) & _HASH_MASK for k in _distinct_keys(request)]
