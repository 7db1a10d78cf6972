"""Receipt handles: round trip, and every kind of garbage rejected as InvalidReceiptHandle."""

from __future__ import annotations

import pytest

from broker.errors import InvalidReceiptHandle
from broker.receipt import ReceiptHandle


def _handle() -> ReceiptHandle:
    return ReceiptHandle("%RETRY%g|x", 3, 12345, 0xDEADBEEF, 1_700_000_000_000, 2)


def test_round_trip() -> None:
    h = _handle()
    assert ReceiptHandle.decode(h.encode()) == h


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "x",
        "1~t~0~0~1~1~1",
        "1~t~0~0~1~1~1~zzzzzzzz",
        "~" * 9,
        "\x00" * 40,
        "a" * 600,
    ],
)
def test_garbage_is_invalid(garbage: str) -> None:
    with pytest.raises(InvalidReceiptHandle):
        ReceiptHandle.decode(garbage)


def test_non_string_is_invalid() -> None:
    with pytest.raises(InvalidReceiptHandle):
        ReceiptHandle.decode(None)


def test_every_single_character_change_is_caught() -> None:
    encoded = _handle().encode()
    for i in range(len(encoded)):
        replacement = "0" if encoded[i] != "0" else "1"
        mangled = encoded[:i] + replacement + encoded[i + 1 :]
        with pytest.raises(InvalidReceiptHandle):
            ReceiptHandle.decode(mangled)


def test_forged_fields_with_a_recomputed_crc_still_parse_but_are_range_checked() -> None:
    forged = ReceiptHandle("t", 0, 0, 1, 1, 1).encode().replace("~1~1~1~", "~1~1~0~")
    with pytest.raises(InvalidReceiptHandle):
        ReceiptHandle.decode(forged)


def test_an_issued_handle_decodes_to_what_parsing_it_gives() -> None:
    from broker.receipt import _ISSUED, _decode, handle_prefix, issue_handle

    handle = issue_handle("orders", 3, handle_prefix("orders", 3), 41, 0xBEEF, 1_700_000, 2)
    assert _ISSUED[handle] == _decode.__wrapped__(handle)  # the remembered one, and right
    assert ReceiptHandle.decode(handle) is _ISSUED[handle]
    # a mangled copy is not the issued handle: it is parsed, and refused
    forged = handle.replace("~41~", "~42~")
    with pytest.raises(InvalidReceiptHandle):
        ReceiptHandle.decode(forged)
