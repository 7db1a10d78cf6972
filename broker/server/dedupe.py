"""The send de-duplication cache: recent sends' results, bounded by bytes.

Two sends are the same send when they agree on topic, message id and user properties (see
`broker.server.producing`). The cache keys each send by a 16-byte BLAKE2b digest of those
three, never by the fields themselves: a message may carry 16 KiB of properties, and keeping
them would make each entry cost ~38 KB. The value is the serialized `SendResultEntry` the
first send got (tens of bytes: message id, offset, maybe a transaction id or recall handle).

    cache = SendResults(max_bytes=32 << 20)
    key = send_key(topic, message_id, user_properties)
    cache.get(key)            # the first result's bytes, or None
    cache.put(key, raw)       # evicts the oldest entries past the budget

Each entry is charged its key and value lengths plus `ENTRY_OVERHEAD` (the Python objects
and the ordered dict's slot around them), so the budget is what the cache really holds, to
within the allocator's rounding.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Iterable, Mapping

DIGEST_BYTES = 16
# per entry: two bytes objects' headers (2 x 33), the ordered dict's entry and link (~100)
ENTRY_OVERHEAD = 170
_LENGTH = struct.Struct(">I")


def send_key(topic: str, message_id: str, properties: Mapping[str, str]) -> bytes:
    """The digest naming one send: topic, message id and the sorted user properties.

    Every part is length-prefixed, so no two different sends encode to the same bytes.
    """
    if not properties:  # the common case: the same bytes as the loop below, the topic's
        # part hashed once per topic (a hash's copy goes on from where the topic left it)
        h = _TOPIC_HASHES.get(topic)
        if h is None:
            h = _topic_hash(topic)
        h = h.copy()
        m = message_id.encode("utf-8", "surrogatepass")
        h.update(_LENGTH.pack(len(m)) + m)
        return h.digest()
    parts = [topic, message_id]
    if properties:
        for name, value in sorted(properties.items()):
            parts += (name, value)
    out = bytearray()
    for part in parts:
        raw = part.encode("utf-8", "surrogatepass")
        out += _LENGTH.pack(len(raw))
        out += raw
    return hashlib.blake2b(out, digest_size=DIGEST_BYTES).digest()


_TOPIC_HASHES: dict[str, hashlib.blake2b] = {}  # topic -> the hash of its length-prefixed bytes
_TOPIC_HASHES_MAX = 1024  # topics remembered; past this the table starts again


def _topic_hash(topic: str) -> hashlib.blake2b:
    if len(_TOPIC_HASHES) >= _TOPIC_HASHES_MAX:
        _TOPIC_HASHES.clear()
    t = topic.encode("utf-8", "surrogatepass")
    h = _TOPIC_HASHES[topic] = hashlib.blake2b(_LENGTH.pack(len(t)) + t, digest_size=DIGEST_BYTES)
    return h


class SendResults:
    """Least-recently-stored results of sends, within `max_bytes` (and `max_entries`)."""

    def __init__(self, max_bytes: int, max_entries: int | None = None) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, bytes] = OrderedDict()
        self._bytes = 0

    @staticmethod
    def cost(key: bytes, value: bytes) -> int:
        return len(key) + len(value) + ENTRY_OVERHEAD

    @property
    def nbytes(self) -> int:
        """What the entries are charged, in bytes (never above `max_bytes`)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> bytes | None:
        return self._entries.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self.put_many(((key, value),))

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        """`put` of each (key, value) in turn (a request's results at once)."""
        entries = self._entries
        max_bytes = self.max_bytes
        limit = self.max_entries
        for key, value in items:
            old = entries.pop(key, None)
            if old is not None:
                self._bytes -= len(key) + len(old) + ENTRY_OVERHEAD  # `cost`
            cost = len(key) + len(value) + ENTRY_OVERHEAD
            if cost > max_bytes:
                continue  # could never fit: not remembered
            entries[key] = value
            self._bytes += cost
            while self._bytes > max_bytes or (limit is not None and len(entries) > limit):
                oldest, raw = entries.popitem(last=False)
                self._bytes -= len(oldest) + len(raw) + ENTRY_OVERHEAD
