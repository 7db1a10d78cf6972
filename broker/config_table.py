"""A named-config table persisted as versioned JSON: the base of the topic and group tables.

One file per table in the store's `config/` directory (atomic write, `.bak` fallback, see
`broker.store.json_config`), RocketMQ's layout:

    {"<TABLE_KEY>": {"<name>": {...one entry...}}, "dataVersion": {"counter": n}}

Every change is written at once and bumps the counter. A subclass says what its table key
is, how an entry is checked and read (`_entry`), and what names an entry (`_name`).
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from broker.store.json_config import JsonConfigFile, integer, obj


class _Entry(Protocol):
    def to_json(self) -> dict[str, Any]: ...


C = TypeVar("C", bound=_Entry)


class VersionedConfigTable(Generic[C]):
    """Entries by name, loaded from and saved to one JSON file; thread-safe."""

    TABLE_KEY: ClassVar[str]

    def __init__(self, file: JsonConfigFile) -> None:
        self._file = file
        self._lock = threading.RLock()
        self._table: dict[str, C] = {}
        self._version = 0

    # --- what a subclass says

    @classmethod
    def _entry(cls, where: str, data: dict[str, Any]) -> C:
        """One entry of the document, checked (ConfigShapeError) and read."""
        raise NotImplementedError

    @staticmethod
    def _name(config: C) -> str:
        raise NotImplementedError

    # --- the file

    @classmethod
    def parse(cls, data: dict[str, Any]) -> tuple[dict[str, C], int]:
        """(table, version) of the file's document (ConfigShapeError)."""
        table: dict[str, C] = {}
        for name, entry in obj(data.get(cls.TABLE_KEY, {}), cls.TABLE_KEY).items():
            where = f"{cls.TABLE_KEY}.{name}"
            table[name] = cls._entry(where, obj(entry, where))
        version = obj(data.get("dataVersion", {}), "dataVersion").get("counter", 0)
        return table, integer(version, "dataVersion.counter")

    def load(self) -> None:
        table, version = self._file.load(self.parse) or ({}, 0)
        with self._lock:
            self._table = table
            self._version = version

    def _persist(self) -> None:
        self._version += 1
        self._file.save(
            {
                self.TABLE_KEY: {n: c.to_json() for n, c in sorted(self._table.items())},
                "dataVersion": {"counter": self._version},
            }
        )

    # --- the table

    def get(self, name: str) -> C | None:
        return self._table.get(name)

    def all(self) -> list[C]:
        with self._lock:
            return sorted(self._table.values(), key=self._name)

    def put(self, config: C) -> C:
        """Create or update (RocketMQ's updateTopic and updateSubGroup are upserts)."""
        with self._lock:
            name = self._name(config)
            if self._table.get(name) != config:
                self._table[name] = config
                self._persist()
            return config

    def get_or_create(self, config: C) -> C:
        """The existing config, or `config` stored as new (never overwrites)."""
        with self._lock:
            existing = self._table.get(self._name(config))
            if existing is not None:
                return existing
            self._table[self._name(config)] = config
            self._persist()
            return config

    def delete(self, name: str) -> bool:
        with self._lock:
            if self._table.pop(name, None) is None:
                return False
            self._persist()
            return True
