"""Atomic JSON configuration files (`topics.json`, `consumerOffset.json`, ...).

A save never leaves a half-written file where a reader (or the next start) looks:

1. the previous valid content is copied to `<name>.bak` (itself written atomically);
2. the new content replaces `<name>` atomically (`durable_write.write_atomically`: temp
   file, fsync, rename, fsync of the directory).

A load reads `<name>`; when it is corrupt (truncated, not JSON, not an object, or an object
of the wrong shape for its loader's `parse`) it falls back to `<name>.bak`; when both are
unusable it raises `ConfigFileError` (one line: the file and what is wrong) rather than
silently starting from nothing, because an empty `consumerOffset.json` would make every
consumer group re-read its queues from the start.

Loaders check shapes with the small helpers below (`obj`, `arr`, `integer`, `text`,
`flag`), which raise `ConfigShapeError` naming the path inside the document
(`offsetTable.TopicA@g: expected an object, got a list`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, overload

from broker.store.durable_write import remove_stale_temp_files, write_atomically
from broker.store.errors import ConfigFileError, ConfigShapeError, StoreError

log = logging.getLogger(__name__)

BACKUP_SUFFIX = ".bak"


class _Unreadable(StoreError):
    """Internal: a file exists but does not hold a JSON object (`reason` says why)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


T = TypeVar("T")
_KINDS = {
    dict: "an object",
    list: "a list",
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    type(None): "null",
}


def _kind(value: object) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def obj(value: object, where: str) -> dict[str, Any]:
    """`value` as a JSON object, else ConfigShapeError."""
    if not isinstance(value, dict):
        raise ConfigShapeError(f"{where}: expected an object, got {_kind(value)}")
    return value


def arr(value: object, where: str) -> list[Any]:
    """`value` as a JSON list, else ConfigShapeError."""
    if not isinstance(value, list):
        raise ConfigShapeError(f"{where}: expected a list, got {_kind(value)}")
    return value


def integer(value: object, where: str, *, minimum: int | None = None) -> int:
    """An integer, or a string of one (object keys are strings); else ConfigShapeError."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigShapeError(f"{where}: expected an integer, got {_kind(value)}")
    if isinstance(value, str):
        text_value = value.strip()
        if not text_value.lstrip("-").isdigit() or len(text_value) > 20:
            raise ConfigShapeError(f"{where}: expected an integer, got {value[:40]!r}")
        value = int(text_value)
    if not -(1 << 63) <= value < (1 << 63):
        raise ConfigShapeError(f"{where}: {value} is out of range")
    if minimum is not None and value < minimum:
        raise ConfigShapeError(f"{where}: {value} is below {minimum}")
    return value


def text(value: object, where: str) -> str:
    """`value` as a string, else ConfigShapeError."""
    if not isinstance(value, str):
        raise ConfigShapeError(f"{where}: expected a string, got {_kind(value)}")
    return value


def flag(value: object, where: str) -> bool:
    """`value` as a boolean, else ConfigShapeError."""
    if not isinstance(value, bool):
        raise ConfigShapeError(f"{where}: expected true or false, got {_kind(value)}")
    return value


def _apply(parse: Callable[[dict[str, Any]], T], data: dict[str, Any]) -> T:
    try:
        return parse(data)
    except ConfigShapeError as exc:
        raise _Unreadable(f"wrong shape: {exc}") from exc
    except Exception as exc:  # parse is pure: whatever it raises means a bad shape
        raise _Unreadable(f"wrong shape: {type(exc).__name__}: {str(exc)[:200]}") from exc


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _Unreadable(f"not JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise _Unreadable(f"top level is {type(value).__name__}, not an object")
    return value


class JsonConfigFile:
    """One JSON object persisted atomically at `path`, with a `.bak` of the previous version."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.backup_path = self.path.with_name(self.path.name + BACKUP_SUFFIX)
        self._lock = threading.Lock()

    def _read(self, path: Path) -> dict[str, Any] | None:
        """None when the file does not exist; `_Unreadable` when it is not a JSON object."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _Unreadable(f"cannot read: {exc}") from exc
        return _parse(raw)

    @overload
    def load(self) -> dict[str, Any] | None: ...

    @overload
    def load(self, parse: Callable[[dict[str, Any]], T]) -> T | None: ...

    def load(self, parse: Callable[[dict[str, Any]], Any] | None = None) -> Any:
        """The stored object (passed through `parse`); None when neither the file nor its
        backup exists.

        `parse` turns the document into what the loader keeps and raises ConfigShapeError
        (or a ValueError, TypeError, KeyError...) for a document of the wrong shape: such a
        file counts as corrupt, like one that is not JSON. Raises `ConfigFileError` when
        something exists but neither copy is usable.
        """
        with self._lock:
            main_problem: str | None = None
            try:
                data = self._read(self.path)
                if data is not None and parse is not None:
                    data = _apply(parse, data)
            except _Unreadable as exc:
                main_problem = str(exc)
            else:
                if data is not None:
                    return data
            try:
                backup = self._read(self.backup_path)
                if backup is not None and parse is not None:
                    backup = _apply(parse, backup)
            except _Unreadable as exc:
                raise ConfigFileError(
                    self.path,
                    f"{main_problem or 'missing'}, and so is its backup "
                    f"{self.backup_path.name} ({exc})",
                ) from None
            if backup is None:
                if main_problem is None:
                    return None  # nothing was ever saved
                raise ConfigFileError(self.path, f"{main_problem}, and no backup")
            log.warning(
                "%s is %s; using its backup %s",
                self.path,
                main_problem or "missing",
                self.backup_path.name,
            )
            return backup

    def save(self, data: Mapping[str, object]) -> None:
        """Write `data` atomically, keeping the previous valid version as `.bak`."""
        try:
            encoded = json.dumps(dict(data), indent=2, sort_keys=True).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise ConfigFileError(self.path, f"cannot encode as JSON: {exc}") from exc
        with self._lock:
            self._remove_stale_temp_files()
            try:
                previous = self.path.read_bytes()
            except FileNotFoundError:
                previous = None
            if previous is not None:
                try:
                    _parse(previous)
                except _Unreadable:
                    # never replace a good backup with a corrupt file
                    log.warning("%s is corrupt; keeping the existing backup", self.path)
                else:
                    write_atomically(self.backup_path, previous)
            write_atomically(self.path, encoded)

    def _remove_stale_temp_files(self) -> None:
        """Temp files left behind by a writer process that no longer exists."""
        for path in (self.path, self.backup_path):
            remove_stale_temp_files(path)

    def __repr__(self) -> str:
        return f"JsonConfigFile({str(self.path)!r})"
