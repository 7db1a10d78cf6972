"""Message queries the store facade answers: by key, by unique key, by offset message id.

The hash index only knows 31-bit key hashes (`index_key`: a masked CRC-32 of `topic#key`),
so two keys with the same hash share entries. Every candidate is therefore decoded and kept
only when its real topic and keys match: a query never returns a colliding message. A query is
bounded three ways: results (`max_num`, and the store's `max_query_results`), index entries
visited (`IndexService.iter_offsets`'s scan budget) and records decoded (`max_candidates`).

Time ranges are padded by `QUERY_CLOCK_SKEW_MS` on both sides: index entries carry the
broker's store time while users ask in their own (producer) clock, and entries are only
precise to the second.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from typing import Protocol

from broker.store.codec import POS_STORE_TIMESTAMP
from broker.store.errors import InvalidQuery
from broker.store.message import MessageExt, decode_offset_msg_id

QUERY_CLOCK_SKEW_MS = 10 * 60_000  # producer/broker clocks may disagree by this much
MAX_TIME_MS = (1 << 63) - 1
DEFAULT_MAX_NUM = 64

MessageLookup = Callable[[int], MessageExt | None]  # commitlog offset -> message or None
ReadBytes = Callable[[int, int], bytes | None]  # (commitlog offset, size) -> bytes or None


class KeyMatch(enum.Enum):
    """Which of a message's indexed strings a key query compares against."""

    KEYS = "keys"  # one of the space-separated KEYS
    UNIQUE_KEY = "unique_key"  # UNIQ_KEY
    ANY = "any"  # either


class OffsetIndex(Protocol):
    """The index's lookup (IndexService)."""

    max_query_results: int

    def iter_offsets(
        self, topic: str, key: str, begin_ms: int, end_ms: int, max_scan: int = ...
    ) -> Iterator[int]: ...


def pad_time_range(
    begin_ms: int, end_ms: int | None, skew_ms: int = QUERY_CLOCK_SKEW_MS
) -> tuple[int, int]:
    """[begin - skew, end + skew], clamped; an open end means "up to now and beyond"."""
    begin = max(0, begin_ms - skew_ms)
    end = MAX_TIME_MS if end_ms is None else min(MAX_TIME_MS, end_ms + skew_ms)
    if end < begin:
        raise InvalidQuery(
            "time range", f"time range ends ({end_ms}) before it begins ({begin_ms})"
        )
    return begin, end


def message_matches(msg: MessageExt, topic: str, key: str, match: KeyMatch) -> bool:
    """The exact test after a hash lookup."""
    if msg.topic != topic:
        return False
    if match is not KeyMatch.UNIQUE_KEY and key in msg.keys:
        return True
    return match is not KeyMatch.KEYS and msg.unique_key == key


def _check_key(key: str) -> None:
    if not key or " " in key:
        raise InvalidQuery(
            "key", f"key {key!r} must be non-empty and hold no space (KEYS are space-separated)"
        )


def query_by_key(
    index: OffsetIndex,
    look: MessageLookup,
    topic: str,
    key: str,
    *,
    max_num: int = DEFAULT_MAX_NUM,
    begin_ms: int = 0,
    end_ms: int | None = None,
    skew_ms: int = QUERY_CLOCK_SKEW_MS,
    match: KeyMatch = KeyMatch.KEYS,
    max_candidates: int | None = None,
) -> list[MessageExt]:
    """Messages of `topic` whose key is exactly `key`, newest first, at most `max_num`.

    At most `max_candidates` records are decoded (default: 4 x the result cap + 32), so a
    key sharing its hash with a hot key cannot make one query read the whole log.
    """
    _check_key(key)
    limit = min(max_num, index.max_query_results)
    if limit <= 0:
        return []
    begin, end = pad_time_range(begin_ms, end_ms, skew_ms)
    budget = max_candidates if max_candidates is not None else 4 * limit + 32
    found: list[MessageExt] = []
    for phy in index.iter_offsets(topic, key, begin, end):
        if budget <= 0:
            break
        budget -= 1
        msg = look(phy)
        if (
            msg is not None
            and msg.commitlog_offset == phy
            and message_matches(msg, topic, key, match)
        ):
            found.append(msg)
            if len(found) >= limit:
                break
    return found


def look_by_offset_msg_id(look: MessageLookup, msg_id: str) -> MessageExt | None:
    """The message an offset message id names; None when it is not (or no longer) here.

    Raises InvalidQuery for a string that is not an offset message id at all.
    """
    try:
        _host, offset = decode_offset_msg_id(msg_id)
    except ValueError as exc:
        raise InvalidQuery("message id", f"{msg_id!r} is not an offset message id: {exc}") from exc
    msg = look(offset)
    if msg is None or msg.offset_msg_id != msg_id.upper():
        return None  # another broker's id, or a record since deleted
    return msg


def query_by_unique_key(
    index: OffsetIndex,
    look: MessageLookup,
    topic: str,
    unique_key: str,
    *,
    begin_ms: int = 0,
    end_ms: int | None = None,
    skew_ms: int = QUERY_CLOCK_SKEW_MS,
) -> MessageExt | None:
    """The message whose UNIQ_KEY is `unique_key`; falls back to reading it as an offset id.

    Producers' unique keys are indexed; an id that was never a UNIQ_KEY (a message stored
    without one reports its offset message id) is decoded to its commitlog offset instead.
    """
    _check_key(unique_key)
    hits = query_by_key(
        index,
        look,
        topic,
        unique_key,
        max_num=1,
        begin_ms=begin_ms,
        end_ms=end_ms,
        skew_ms=skew_ms,
        match=KeyMatch.UNIQUE_KEY,
    )
    if hits:
        return hits[0]
    try:
        msg = look_by_offset_msg_id(look, unique_key)
    except InvalidQuery:
        return None
    return msg if msg is not None and msg.topic == topic else None


def store_timestamp_lookup(read: ReadBytes) -> Callable[[int, int], int]:
    """`lookup(offset, size)` -> STORETIMESTAMP of the record at `offset`, -1 when gone.

    Reads 8 bytes, not the record: what a binary search over a queue needs.
    """

    def lookup(offset: int, size: int) -> int:
        raw = read(offset + POS_STORE_TIMESTAMP, 8)
        if raw is None or len(raw) != 8:
            return -1
        return int.from_bytes(raw, "big", signed=True)

    return lookup
