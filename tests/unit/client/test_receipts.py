"""`send_receipt`, the send paths' receipt builder, makes what `SendReceipt(...)` makes."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from reliable.message import SendReceipt, SendStatus, send_receipt


@pytest.mark.parametrize(
    "fields",
    [
        ("id-1", "orders", 3, 42, SendStatus.SEND_OK, "0A0000010000000000001234", None, None),
        ("id-2", "orders", -1, 7, SendStatus.FLUSH_DISK_TIMEOUT, None, "tx-9", "recall-1"),
    ],
)
def test_a_receipt_built_through_its_slots_is_the_dataclass_one(fields: tuple[Any, ...]) -> None:
    fast, slow = send_receipt(*fields), SendReceipt(*fields)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert dataclasses.astuple(fast) == fields
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.queue_offset = 1  # type: ignore[misc]
