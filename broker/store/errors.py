"""The store's exceptions: one root, narrow subclasses carrying what is needed to act.

Hot paths (put, get) return status values; these are raised at the edges: opening files,
decoding records, validating input. `StoreError` is a `broker.errors.BrokerError` (the
broker has one root), so each class names the `ResponseCode` a wire protocol reports for
it in `code`: the broker's default, SYSTEM_ERROR, unless the class says otherwise.
"""

from __future__ import annotations

from pathlib import Path

from broker.errors import BrokerError, ResponseCode


class StoreError(BrokerError):
    """Root of every error the store raises."""


class StoreCorrupted(StoreError):
    """A store file holds bytes that are not a valid record where one must be."""

    def __init__(self, path: Path | str, offset: int, reason: str) -> None:
        self.path = Path(path)
        self.offset = offset
        self.reason = reason
        super().__init__(f"{path}: corrupt at offset {offset}: {reason}")


class ForeignFile(StoreError):
    """A file in a store directory is not one of ours (bad name, size or header)."""

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{path}: not a store file: {reason}")


class MessageTooLarge(StoreError):
    """A message exceeds the configured maximum size."""

    code = ResponseCode.MESSAGE_ILLEGAL

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"message of {size} bytes exceeds the limit of {limit} bytes")


class InvalidMessage(StoreError):
    """A message cannot be stored as given (topic too long, properties too large, ...)."""

    code = ResponseCode.MESSAGE_ILLEGAL

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class StoreLocked(StoreError):
    """Another process has this store directory open."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        super().__init__(f"{path}: the store is open in another process")


class StoreNotRunning(StoreError):
    """The store is not started, or is shutting down."""

    code = ResponseCode.SERVICE_NOT_AVAILABLE

    def __init__(self, path: Path | str, what: str = "store", state: str = "not running") -> None:
        self.path = Path(path)
        self.state = state
        super().__init__(f"{what} {path} is {state}")


class ConfigFileError(StoreError):
    """A JSON configuration file and its backup are both unreadable."""

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class DispatchStuck(StoreError):
    """At start, a recovered record cannot be dispatched to the consume queues and index.

    The store refuses to start rather than hand out queue offsets twice.
    """

    def __init__(self, offset: int, reason: str) -> None:
        self.offset = offset
        self.reason = reason
        super().__init__(f"commitlog record at {offset} cannot be dispatched: {reason}")


# a ValueError too, for parse functions that catch those; the message names the place
# inside the document (`offsetTable.TopicA@g: expected an object, got a list`)
class ConfigShapeError(StoreError, ValueError):
    """A configuration document is valid JSON but not the shape its loader expects."""


class InvalidQuery(StoreError):
    """A query's arguments cannot name any message (empty key, malformed message id)."""

    code = ResponseCode.INVALID_PARAMETER

    def __init__(self, argument: str, reason: str) -> None:
        self.argument = argument  # which argument: "key", "time range", "message id"
        self.reason = reason
        super().__init__(reason)


class ReplicaRejected(StoreError):
    """Bytes replicated from a master are not whole, valid records at this log's end."""

    def __init__(self, offset: int, reason: str) -> None:
        self.offset = offset
        self.reason = reason
        super().__init__(f"replicated bytes at commitlog offset {offset} rejected: {reason}")
