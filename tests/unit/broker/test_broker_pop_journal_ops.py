"""The revive log's packed lease op: `pack_leases` folds only runs that mean the same as
their "L" ops, and `unpack_leases` gives those ops back. The pop state's acked offsets
are written as runs and read back exactly."""

from __future__ import annotations

from typing import Any

import pytest

from broker.pop_journal import done_runs, pack_leases, parse_done, parse_snapshot, unpack_leases
from broker.store.errors import ConfigShapeError


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


def test_acked_offsets_are_written_as_runs_and_read_back_exactly() -> None:
    done = {3, *range(5, 100_005), 100_007, 100_008, 100_010}
    runs = done_runs(done)
    assert runs == [3, [5, 100_005], [100_007, 100_009], 100_010]
    assert parse_done(runs, "done", 1, 200_000) == done
    assert done_runs(set()) == []


def test_a_snapshot_of_plain_offsets_from_an_older_release_still_reads() -> None:
    doc = {"groups": {"g": {"T": {"0": {"low": 2, "next": 9, "done": [4, 6, 7]}}}}}
    windows, _ = parse_snapshot(doc)
    assert windows[("g", "T")][0].done == {4, 6, 7}


@pytest.mark.parametrize(
    "done",
    [[[5, 99]], [[1, 4]], [[6, 6]], [[5, 6, 7]], [["a", 6]]],
)
def test_a_run_outside_its_window_or_malformed_is_a_shape_error(done: list[object]) -> None:
    with pytest.raises(ConfigShapeError):
        parse_done(done, "done", 2, 10)
