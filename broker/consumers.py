"""Live consumers per group, kept by heartbeats, for rebalancing.

A consumer is live while its last heartbeat is younger than `consumer_expiry_ms` (120 s,
RocketMQ's channel expiry). Clients rebalance by sorting `consumer_ids(group)` and the
queues the same way everywhere, so every live consumer computes the same allocation.
Kept in memory only: after a broker restart the clients' next heartbeats rebuild it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field


def tag_set(tags: Collection[str] | str | None) -> frozenset[str] | None:
    """None for every tag; accepts a collection or a `"a || b"` expression."""
    if tags is None:
        return None
    parts = tags.split("||") if isinstance(tags, str) else list(tags)
    cleaned = frozenset(p.strip() for p in parts if p.strip())
    return None if not cleaned or "*" in cleaned else cleaned


@dataclass(slots=True)
class ConsumerInfo:
    client_id: str
    group: str
    last_heartbeat_ms: int
    # topic -> tag set (None: every tag)
    subscriptions: dict[str, frozenset[str] | None] = field(default_factory=dict)


class ConsumerRegistry:
    def __init__(self, clock: Callable[[], int], expiry_ms: int) -> None:
        self._clock = clock
        self._expiry_ms = expiry_ms
        self._lock = threading.Lock()
        self._groups: dict[str, dict[str, ConsumerInfo]] = {}

    def heartbeat(
        self, client_id: str, group: str, subscriptions: Mapping[str, Collection[str] | None]
    ) -> bool:
        """Record a heartbeat; True when the client is new to the group."""
        subs = {t: tag_set(tags) for t, tags in subscriptions.items()}
        now = self._clock()
        with self._lock:
            members = self._groups.setdefault(group, {})
            info = members.get(client_id)
            is_new = info is None or now - info.last_heartbeat_ms > self._expiry_ms
            members[client_id] = ConsumerInfo(client_id, group, now, subs)
        return is_new

    def unregister(self, client_id: str, group: str) -> bool:
        with self._lock:
            members = self._groups.get(group, {})
            removed = members.pop(client_id, None) is not None
            if not members:
                self._groups.pop(group, None)
        return removed

    def consumer_ids(self, group: str) -> list[str]:
        """Live consumers of a group, sorted (the rebalance order)."""
        now = self._clock()
        with self._lock:
            members = self._groups.get(group, {})
            return sorted(
                c for c, info in members.items() if now - info.last_heartbeat_ms <= self._expiry_ms
            )

    def consumers(self, group: str) -> list[ConsumerInfo]:
        now = self._clock()
        with self._lock:
            return sorted(
                (
                    info
                    for info in self._groups.get(group, {}).values()
                    if now - info.last_heartbeat_ms <= self._expiry_ms
                ),
                key=lambda i: i.client_id,
            )

    def groups(self) -> list[str]:
        with self._lock:
            return sorted(self._groups)

    def scan_expired(self) -> list[tuple[str, str]]:
        """Forget consumers past the expiry; returns the (group, client_id) pairs removed."""
        now = self._clock()
        removed: list[tuple[str, str]] = []
        with self._lock:
            for group, members in list(self._groups.items()):
                for cid, info in list(members.items()):
                    if now - info.last_heartbeat_ms > self._expiry_ms:
                        del members[cid]
                        removed.append((group, cid))
                if not members:
                    del self._groups[group]
        return removed
