"""The server's bounded helpers: the send de-duplication cache and the log limiter."""

from __future__ import annotations

import logging

import pytest

from broker.server.dedupe import ENTRY_OVERHEAD, SendResults, send_key
from broker.server.ratelimit import LogLimiter


def test_send_key_tells_sends_apart() -> None:
    base = send_key("t", "ID", {"a": "1", "b": "2"})
    assert send_key("t", "ID", {"b": "2", "a": "1"}) == base  # order does not matter
    assert len(base) == 16
    others = {
        send_key("u", "ID", {"a": "1", "b": "2"}),
        send_key("t", "ID2", {"a": "1"}),
        send_key("t", "ID", {"a": "1", "b": "3"}),
        send_key("t", "ID", {"a": "12"}),
        send_key("t", "ID", {"a": "1", "b": "2", "c": ""}),
        send_key("tI", "D", {}),
        send_key("t", "ID", {"a1": "", "b": "2"}),
    }
    assert base not in others and len(others) == 7  # no ambiguity between the parts


def test_send_key_without_properties_is_the_length_prefixed_digest() -> None:
    """The no-properties shortcut must name a send exactly as the general encoding does."""
    import hashlib
    import struct

    for topic, message_id in (("t", "ID"), ("topic-\u00e9", "7F000001"), ("", "x")):
        raw = b"".join(struct.pack(">I", len(p.encode())) + p.encode() for p in (topic, message_id))
        assert send_key(topic, message_id, {}) == hashlib.blake2b(raw, digest_size=16).digest()
    assert send_key("t", "ID", {}) != send_key("t", "ID", {"": ""})


def test_cache_is_bounded_by_bytes_whatever_the_properties() -> None:
    huge = {f"p{i}": "v" * 1000 for i in range(15)}  # 15 KiB of properties per send
    result = b"r" * 40
    per_entry = 16 + len(result) + ENTRY_OVERHEAD
    cache = SendResults(max_bytes=100 * per_entry)
    keys = [send_key("t", f"ID{i}", huge) for i in range(1000)]
    for key in keys:
        cache.put(key, result)
        assert cache.nbytes <= cache.max_bytes
    assert len(cache) == 100 and cache.nbytes == 100 * per_entry
    # the oldest went first; the newest are remembered
    assert cache.get(keys[0]) is None and cache.get(keys[899]) is None
    assert all(cache.get(k) == result for k in keys[900:])


def test_cache_replaces_and_honours_the_entry_limit() -> None:
    cache = SendResults(max_bytes=1 << 20, max_entries=3)
    for i in range(5):
        cache.put(bytes([i]) * 16, b"x")
    assert len(cache) == 3 and cache.get(bytes([0]) * 16) is None
    before = cache.nbytes
    cache.put(bytes([4]) * 16, b"y" * 10)  # same key again: replaced, charged once
    assert len(cache) == 3 and cache.nbytes == before + 9
    assert SendResults(max_bytes=10).put(b"k" * 16, b"v") is None  # never fits: skipped
    with pytest.raises(ValueError):
        SendResults(max_bytes=-1)


def test_log_limiter_one_line_per_kind_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    limiter = LogLimiter(logging.getLogger("test.limiter"), interval_s=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.limiter"):
        assert limiter.log(logging.WARNING, "a", "bad %s", "one")
        for _ in range(500):
            assert not limiter.log(logging.WARNING, "a", "bad %s", "again")
        assert limiter.log(logging.WARNING, "b", "other kind")  # kinds are independent
        now[0] = 61.0
        assert limiter.log(logging.WARNING, "a", "bad %s", "later")
    # its own logger's lines only: another test's leftovers may log meanwhile (e.g. a task
    # collected here)
    assert [r.getMessage() for r in caplog.records if r.name == "test.limiter"] == [
        "bad one",
        "other kind",
        "bad later (and 500 more like it since the last such line)",
    ]
