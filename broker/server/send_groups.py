"""Sends of a busy loop's turn stored together: one record batch for many SendMessage calls.

A client that keeps many single-message sends in flight over gRPC (the official client's
`send_async`) makes the server store one message per call: one broker call, one record
batch, and a dispatch round for every few records. Each of those has a fixed cost that
a batch pays once (measured on the twelfth machine of docs/performance-log.md: 65-75 µs of
server CPU a message for a lone append and its dispatch, 30-40 µs less stored with the
others of the turn). So while the event loop is busy (`broker.server.answers`: it has not
waited for I/O since the last answer left), a checked send whose messages can share a
record batch joins a group instead of being stored at once:

- a group is keyed by what the records of a batch share: topic, tag, keys or not, born
  host and born time (to the millisecond), so every record is stored exactly as the
  send's own batch would have been; it goes to the queue its first send chose;
- the groups are stored (`append`, one broker call each, in the order they were opened)
  once `batch` messages have joined, when the loop is about to wait (the calls ready are
  served), or when the first has waited `linger_ms`; the loop's selector calls
  `before_select` and does not block in a turn that stored some;
- the groups' records stay under `max_bytes` (1 MiB, at most half the store's limit for a
  record batch): a send that would take them past it stores the others first, and a send
  of more than an eighth of it (large bodies gain nothing from a group) is stored alone;
- each send then gets its messages' offsets, the put status and the batch's end, and is
  answered exactly as if it had been stored alone (the durable wait under `--flush sync`,
  the replication wait, the dedupe cache); a group the broker refuses as a whole stores
  nothing, and each of its sends is stored on its own, as before.

A send made while the loop is idle (a client sending one at a time) is stored at once.
Groups form only once `install` is called by the loop's thread with that selector; a
send still waiting in a group when the loop stops is cancelled, not stored (its client
retries it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from broker.server.answers import check_batch, check_linger_ms
from broker.store.message import PutMessageStatus

MAX_GROUP_BYTES = 1 << 20  # a group's records at most (and half the store's batch limit)
RECORD_OVERHEAD = 192  # a record's bytes beyond its body, id and keys, about (header, topic, tag)
# what a joined send learns once its group is stored: (its first message's queue offset,
# the put status, the end of the batch in the commitlog, the group's queue id), or None:
# store it on its own
Stored = tuple[int, PutMessageStatus, int, int] | None


@dataclass(slots=True)
class Joined:
    """One send's messages in a group; `future` gets its `Stored`."""

    bodies: list[bytes]
    ids: list[str]
    keys: list[str] | None
    future: asyncio.Future[Stored]


@dataclass(slots=True)
class Group:
    """The sends of one key, stored as one record batch in `queue_id`."""

    queue_id: int
    sends: list[Joined] = field(default_factory=list)


# stores one group: (key, group) -> a `Stored` for each of its sends, in order
Append = Callable[[Any, Group], list[Stored]]


class SendGroups:
    """The groups of one event loop; `append` is the producer handlers' store call."""

    __slots__ = (
        "_bytes",
        "_clock",
        "_groups",
        "_installed",
        "_messages",
        "_since",
        "append",
        "batch",
        "groups_stored",
        "linger_ns",
        "max_bytes",
        "sends_joined",
    )

    def __init__(
        self,
        batch: int,
        linger_ms: float,
        clock: Callable[[], int] = time.perf_counter_ns,
        *,
        max_bytes: int = MAX_GROUP_BYTES,
    ) -> None:
        self.batch = check_batch(batch)
        self.linger_ns = int(check_linger_ms(linger_ms) * 1_000_000)
        self._clock = clock
        self._groups: dict[Hashable, Group] = {}
        self._messages = 0  # messages waiting in the groups
        self._bytes = 0  # about the bytes of their records
        # a group's records stay under this (the store refuses a batch above its record
        # limit); a send of more than an eighth of it is stored on its own
        self.max_bytes = max_bytes
        self._since = 0  # clock() when the oldest waiting send joined
        self._installed = False
        self.append: Append | None = None
        self.sends_joined = 0  # sends ever stored in a group (observability, tests)
        self.groups_stored = 0  # groups stored (one broker call each)

    def install(self) -> None:
        """The loop's selector calls `before_select` from now on: groups may form."""
        self._installed = True

    def uninstall(self) -> None:
        """No selector stores them any more: the waiting sends are cancelled, unstored."""
        self._installed = False
        groups, self._groups, self._messages, self._bytes = self._groups, {}, 0, 0
        for group in groups.values():
            for joined in group.sends:
                joined.future.cancel()

    @property
    def open(self) -> bool:
        """Whether a send may join a group (the selector stores them, and a store call is
        set); the caller also checks that the loop is busy."""
        return self._installed and self.batch > 0 and self.append is not None

    def join(
        self,
        key: Hashable,
        queue_id: int,
        bodies: list[bytes],
        ids: list[str],
        keys: list[str] | None,
    ) -> asyncio.Future[Stored] | None:
        """Add one send's messages to the group of `key` (opened in `queue_id`); the future
        gets its `Stored` once the group is stored. A send that fills the batch stores every
        group at once, on its caller's turn; one whose records would take the groups past
        `max_bytes` stores the others first. None: a send too large to gain from a group,
        to be stored on its own."""
        size = RECORD_OVERHEAD * len(bodies) + sum(map(len, bodies)) + sum(map(len, ids))
        if keys is not None:
            size += sum(map(len, keys))
        if size > self.max_bytes // 8:
            return None
        if self._bytes + size > self.max_bytes:
            self.store()
        future: asyncio.Future[Stored] = asyncio.get_running_loop().create_future()
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = Group(queue_id)
        if not self._messages:
            self._since = self._clock()
        group.sends.append(Joined(bodies, ids, keys, future))
        self._messages += len(bodies)
        self._bytes += size
        self.sends_joined += 1
        if self._messages >= self.batch:
            self.store()
        return future

    def before_select(self, timeout: float | None) -> bool:
        """Called by the loop's selector before each select with its timeout (0: calls are
        ready). True when groups were stored: that select must not block."""
        if not self._messages:
            return False
        if timeout is None or timeout > 0 or self._clock() - self._since >= self.linger_ns:
            self.store()
            return True
        return False

    def store(self) -> None:
        """Store every waiting group, one `append` each, in the order they were opened."""
        groups, self._groups, self._messages, self._bytes = self._groups, {}, 0, 0
        append = self.append
        assert append is not None
        for key, group in groups.items():
            group.sends = [j for j in group.sends if not j.future.done()]  # calls gone: not stored
            if not group.sends:
                continue
            try:
                results = append(key, group)
            except Exception:  # each send is then stored on its own, with its own verdict
                results = [None] * len(group.sends)
            self.groups_stored += 1
            for joined, result in zip(group.sends, results, strict=True):
                joined.future.set_result(result)
