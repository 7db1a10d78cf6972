"""Parked message groups: an ordered consumer group gave up on one message of a message group,
so every later message of that message group waits in the dead-letter queue for an operator.

A message group `P` of topic `T` is parked for consumer group `G` when a message of `P` is
dead-lettered on purpose by an ordered consumer (a FIFO group's ForwardMessageToDeadLetter-
Queue, or a send-back / forward that carries the `PARKED_MESSAGE_GROUP` property). From then
on the broker hands no message of `P` to `G` again: each one is moved to `%DLQ%G`, in order,
with `PARKED_MESSAGE_GROUP=P`, while every other message group keeps its order and progress.
Only an operator ends it (`Broker.unpark_message_group`, the admin service's
`UnparkMessageGroup`), typically after replaying the parked messages from the DLQ.

The set is small and changes rarely: it is kept in `config/parkedGroups.json` (atomic, with a
backup), written before the dead letter that parks the group, so a crash in between still
finds the group parked (the message then reaches the DLQ on its redelivery).
"""

from __future__ import annotations

import threading
from typing import Any

from broker.store.json_config import JsonConfigFile

PARKED_FILE = "parkedGroups.json"


class ParkedGroups:
    """(consumer group, topic) -> parked message groups, persisted on every change."""

    def __init__(self, file: JsonConfigFile) -> None:
        self._file = file
        self._lock = threading.Lock()
        self._parked: dict[tuple[str, str], set[str]] = {}
        self._load()

    def _load(self) -> None:
        data = self._file.load() or {}
        for entry in data.get("parked", []):
            key = (str(entry["group"]), str(entry["topic"]))
            self._parked.setdefault(key, set()).add(str(entry["message_group"]))

    def _save_locked(self) -> None:
        rows = [
            {"group": g, "topic": t, "message_group": p}
            for (g, t), groups in sorted(self._parked.items())
            for p in sorted(groups)
        ]
        self._file.save({"parked": rows})

    def park(self, group: str, topic: str, message_group: str) -> bool:
        """Park `message_group`; True when it was not parked yet (the file is then written)."""
        with self._lock:
            groups = self._parked.setdefault((group, topic), set())
            if message_group in groups:
                return False
            groups.add(message_group)
            self._save_locked()
            return True

    def unpark(self, group: str, topic: str, message_group: str) -> bool:
        with self._lock:
            groups = self._parked.get((group, topic))
            if not groups or message_group not in groups:
                return False
            groups.discard(message_group)
            if not groups:
                del self._parked[(group, topic)]
            self._save_locked()
            return True

    def of(self, group: str, topic: str) -> frozenset[str]:
        """The parked message groups of `group` on `topic` (empty: nothing parked)."""
        with self._lock:
            return frozenset(self._parked.get((group, topic), ()))

    def listing(self, group: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {"group": g, "topic": t, "message_group": p}
                for (g, t), groups in sorted(self._parked.items())
                if group is None or g == group
                for p in sorted(groups)
            ]

    def forget_topic(self, topic: str) -> None:
        with self._lock:
            keys = [k for k in self._parked if k[1] == topic]
            if keys:
                for k in keys:
                    del self._parked[k]
                self._save_locked()
