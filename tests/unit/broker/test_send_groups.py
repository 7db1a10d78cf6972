"""Sends of a busy loop's turn stored together (`broker.server.send_groups`): when groups are
stored (a full batch, the loop about to wait, the linger), in which order, with what each
send learns, and what happens to a send whose call went away, a group the broker refuses
and a loop that stops. A recording `append` stands for the producer handlers' store call
(the served path: tests/e2e/grpc/test_held_answers.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from broker.server.send_groups import Group, SendGroups, Stored

WAITING = None
READY = 0.0


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


class Store:
    """Records each group stored; its sends get consecutive offsets from 100."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls: list[tuple[Any, int, list[bytes]]] = []

    def __call__(self, key: Any, group: Group) -> list[Stored]:
        if self.fail:
            raise RuntimeError("the store refused the batch")
        bodies = [b for s in group.sends for b in s.bodies]
        self.calls.append((key, group.queue_id, bodies))
        out: list[Stored] = []
        offset = 100
        for s in group.sends:
            out.append((offset, "PUT_OK", 999))
            offset += len(s.bodies)
        return out


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def make(store: Store, batch: int = 8, linger_ms: float = 5, clock: Any = None) -> SendGroups:
    groups = SendGroups(batch, linger_ms, **({"clock": clock} if clock else {}))
    groups.append = store
    groups.install()
    return groups


def test_a_full_batch_is_stored_by_the_send_that_fills_it_one_call_per_group(
    loop: asyncio.AbstractEventLoop,
) -> None:
    store = Store()
    groups = make(store, batch=5)

    async def main() -> None:
        a = groups.join("k1", 2, [b"a1", b"a2"], ["A1", "A2"], None)
        b = groups.join("k2", 0, [b"b1"], ["B1"], None)
        c = groups.join("k1", 3, [b"c1"], ["C1"], None)  # k1's queue stays its first's
        assert not a.done() and store.calls == []
        d = groups.join("k2", 1, [b"d1"], ["D1"], None)  # the fifth message: all stored
        assert store.calls == [("k1", 2, [b"a1", b"a2", b"c1"]), ("k2", 0, [b"b1", b"d1"])]
        assert [f.result() for f in (a, c)] == [(100, "PUT_OK", 999), (102, "PUT_OK", 999)]
        assert [f.result() for f in (b, d)] == [(100, "PUT_OK", 999), (101, "PUT_OK", 999)]
        assert groups.sends_joined == 4 and groups.groups_stored == 2

    loop.run_until_complete(main())


def test_groups_are_stored_when_the_loop_is_about_to_wait(loop: asyncio.AbstractEventLoop) -> None:
    store = Store()
    groups = make(store, batch=64)

    async def main() -> None:
        assert groups.before_select(WAITING) is False  # nothing waits: nothing to do
        future = groups.join("k", 0, [b"x"], ["X"], None)
        assert groups.before_select(READY) is False  # calls are ready: it waits for them
        assert not future.done()
        assert groups.before_select(WAITING) is True  # the select must not block
        assert future.result() == (100, "PUT_OK", 999)

    loop.run_until_complete(main())


def test_no_send_waits_past_the_linger_on_a_loop_that_never_waits(
    loop: asyncio.AbstractEventLoop,
) -> None:
    clock = Clock()
    store = Store()
    groups = make(store, batch=64, linger_ms=2, clock=clock)

    async def main() -> None:
        first = groups.join("k", 0, [b"1"], ["1"], None)
        clock.now += 1_900_000
        second = groups.join("k", 0, [b"2"], ["2"], None)
        assert groups.before_select(READY) is False
        clock.now += 100_000  # the first has waited 2 ms
        assert groups.before_select(READY) is True
        assert first.done() and second.done()

    loop.run_until_complete(main())


def test_a_send_whose_call_went_away_is_not_stored(loop: asyncio.AbstractEventLoop) -> None:
    store = Store()
    groups = make(store, batch=64)

    async def main() -> None:
        gone = groups.join("k", 0, [b"gone"], ["G"], None)
        kept = groups.join("k", 0, [b"kept"], ["K"], None)
        alone = groups.join("other", 0, [b"alone"], ["A"], None)
        gone.cancel()
        alone.cancel()
        groups.store()
        assert store.calls == [("k", 0, [b"kept"])]  # the other group had no send left
        assert kept.result() == (100, "PUT_OK", 999)

    loop.run_until_complete(main())


def test_a_group_the_store_refuses_leaves_each_send_to_be_stored_alone(
    loop: asyncio.AbstractEventLoop,
) -> None:
    groups = make(Store(fail=True), batch=2)

    async def main() -> None:
        a = groups.join("k", 0, [b"a"], ["A"], None)
        b = groups.join("k", 0, [b"b"], ["B"], None)
        assert a.result() is None and b.result() is None

    loop.run_until_complete(main())


def test_a_stopping_loop_cancels_what_waits_and_groups_no_more(
    loop: asyncio.AbstractEventLoop,
) -> None:
    store = Store()
    groups = make(store, batch=64)

    async def main() -> None:
        waiting = groups.join("k", 0, [b"w"], ["W"], None)
        groups.uninstall()
        assert waiting.cancelled() and store.calls == []
        assert not groups.open

    loop.run_until_complete(main())


def test_groups_are_closed_without_a_selector_a_store_call_or_a_batch() -> None:
    assert not SendGroups(8, 5).open  # not installed
    no_append = SendGroups(8, 5)
    no_append.install()
    assert not no_append.open
    off = SendGroups(0, 5)
    off.append = Store()
    off.install()
    assert not off.open
    with pytest.raises(ValueError, match="answer batch"):
        SendGroups(-1, 5)


def test_groups_stay_under_their_byte_bound_and_a_large_send_is_stored_alone(
    loop: asyncio.AbstractEventLoop,
) -> None:
    store = Store()
    groups = make(store, batch=64)
    groups.max_bytes = 8 * 1024  # a send of more than 1 KiB of records is not grouped

    async def main() -> None:
        assert groups.join("k", 0, [b"x" * 1024], ["BIG"], None) is None
        first = groups.join("k", 0, [b"a" * 500], ["A"], None)
        assert first is not None and not first.done()
        for i in range(11):  # about 700 bytes a send: the twelfth would pass 8 KiB
            more = groups.join("k", 0, [b"b" * 500], [f"B{i}"], None)
            assert more is not None
        assert first.done()  # stored before the send that would have passed the bound
        assert [len(bodies) for _, _, bodies in store.calls] == [11]
        assert groups.before_select(WAITING) is True
        assert [len(bodies) for _, _, bodies in store.calls] == [11, 1]

    loop.run_until_complete(main())
