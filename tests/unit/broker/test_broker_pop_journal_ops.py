"""The revive log's packed lease op: `pack_leases` folds only runs that mean the same as
their "L" ops, and `unpack_leases` gives those ops back."""

from __future__ import annotations

from typing import Any

from broker.pop_journal import pack_leases, unpack_leases


def lease(qid: int, offset: int, nonce: int, *, attempt: int = 1, until: int = 500) -> list[Any]:
    return ["L", qid, offset, attempt, until, nonce, None]


def test_a_run_becomes_one_op_and_comes_back() -> None:
    ops = [["I", 0, 4], *(lease(0, 4 + i, 100 + i) for i in range(5))]
    packed = pack_leases(ops)
    assert packed == [["I", 0, 4], ["M", 0, 4, 5, 1, 500, 100, None]]
    assert unpack_leases(packed) == ops


def test_anything_that_differs_breaks_the_run() -> None:
    ops = [
        lease(0, 1, 10),
        lease(0, 2, 11),
        lease(0, 4, 12),  # offset gap
        lease(0, 5, 14),  # nonce gap
        lease(1, 6, 15),  # another queue
        lease(1, 7, 16, attempt=2),  # another attempt
        lease(1, 8, 17, attempt=2, until=900),  # another deadline
        ["L", 1, 9, 2, 900, 18, "grp"],  # another message group
        ["D", 1, 0, 3],
        lease(1, 10, 19),
        lease(1, 11, 20),
        lease(1, 12, 21),
    ]
    packed = pack_leases(ops)
    assert [op[0] for op in packed] == ["M", "L", "L", "L", "L", "L", "L", "D", "M"]
    assert packed[0] == ["M", 0, 1, 2, 1, 500, 10, None]
    assert packed[-1] == ["M", 1, 10, 3, 1, 500, 19, None]
    assert unpack_leases(packed) == ops
