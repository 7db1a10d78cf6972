"""Queue allocation among a group's live consumers: pure functions of (me, queues, consumers).

Every consumer computes the same answer from the same sorted inputs, so the group agrees
without talking: each queue goes to exactly one live consumer.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Sequence
from typing import TypeVar

Q = TypeVar("Q")

AllocateStrategy = Callable[[str, Sequence[Q], Sequence[str]], list[Q]]


def allocate_averagely(me: str, queues: Sequence[Q], consumers: Sequence[str]) -> list[Q]:
    """Contiguous blocks: with 8 queues and 3 consumers, 3 + 3 + 2 (RocketMQ's default)."""
    cids = sorted(set(consumers))
    if me not in cids or not queues:
        return []
    qs = sorted(queues)  # type: ignore[type-var]
    index = cids.index(me)
    n, m = len(qs), len(cids)
    mod = n % m
    if n <= m:
        size = 1
    elif mod > 0 and index < mod:
        size = n // m + 1
    else:
        size = n // m
    start = index * size if mod > 0 and index < mod else index * size + mod
    span = min(size, n - start)
    return [qs[(start + i) % n] for i in range(max(0, span))]


def allocate_by_circle(me: str, queues: Sequence[Q], consumers: Sequence[str]) -> list[Q]:
    """Round-robin: queue i goes to consumer i mod m."""
    cids = sorted(set(consumers))
    if me not in cids:
        return []
    index = cids.index(me)
    qs = sorted(queues)  # type: ignore[type-var]
    return [q for i, q in enumerate(qs) if i % len(cids) == index]


def _hash(key: str) -> int:
    return int.from_bytes(hashlib.md5(key.encode(), usedforsecurity=False).digest()[:8], "big")


class ConsistentHashAllocator:
    """A hash ring with `virtual_nodes` points per consumer: a consumer joining or leaving
    moves only the queues that hashed next to it."""

    def __init__(self, virtual_nodes: int = 10) -> None:
        if virtual_nodes < 1:
            raise ValueError("virtual_nodes must be >= 1")
        self.virtual_nodes = virtual_nodes

    def __call__(self, me: str, queues: Sequence[Q], consumers: Sequence[str]) -> list[Q]:
        cids = sorted(set(consumers))
        if me not in cids:
            return []
        ring = sorted((_hash(f"{cid}-{i}"), cid) for cid in cids for i in range(self.virtual_nodes))
        points = [p for p, _ in ring]
        mine = []
        for q in sorted(queues):  # type: ignore[type-var]
            i = bisect.bisect_left(points, _hash(str(q)))
            owner = ring[i % len(ring)][1]
            if owner == me:
                mine.append(q)
        return mine


allocate_consistent_hash = ConsistentHashAllocator()
