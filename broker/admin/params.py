"""Parameters of admin operations (JSON values checked one by one), their errors, and the
JSON shape of a stored message."""

from __future__ import annotations

from datetime import UTC, datetime

from broker.errors import BrokerError, InvalidArgument, ResponseCode
from broker.store.message import MessageExt
from protocol.admin import Params
from protocol.names import topic_name_problem

MAX_LIMIT = 1000  # results of one query, whatever the caller asks
DEFAULT_LIMIT = 32


class MessageNotFound(BrokerError):
    """No stored message matches what an operation names."""

    code = ResponseCode.QUERY_NOT_FOUND

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(f"no message {what}")


def text(params: Params, name: str, *, required: bool = False) -> str | None:
    """A non-empty string parameter, or None when absent (InvalidArgument if required)."""
    value = params.get(name)
    if value is None or value == "":
        if required:
            raise InvalidArgument(f"{name} is required")
        return None
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a string")
    return value


def integer(
    params: Params, name: str, default: int | None = None, *, minimum: int = 0
) -> int | None:
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an integer")
    if value < minimum:
        raise InvalidArgument(f"{name} must be at least {minimum}, got {value}")
    return value


def flag(params: Params, name: str) -> bool:
    value = params.get(name, False)
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name} must be true or false")
    return value


def topic(params: Params, name: str = "topic", *, required: bool = False) -> str | None:
    value = text(params, name, required=required)
    if value is not None:
        problem = topic_name_problem(value)
        if problem is not None:
            raise InvalidArgument(f"{name} {value!r} {problem}")
    return value


def limit(params: Params) -> int:
    value = integer(params, "limit", DEFAULT_LIMIT, minimum=1)
    assert value is not None
    if value > MAX_LIMIT:
        raise InvalidArgument(f"limit must be at most {MAX_LIMIT}, got {value}")
    return value


def iso_ms(ms: int) -> str:
    """Epoch milliseconds as ISO-8601 UTC with milliseconds (`2026-11-23T23:59:01.250Z`)."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def body_json(body: bytes) -> dict[str, str]:
    """The body as text when it decodes as UTF-8, else as hex."""
    try:
        return {"body": body.decode("utf-8"), "body_encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"body": body.hex(), "body_encoding": "hex"}


def message_json(msg: MessageExt, *, body: bool = False) -> dict[str, object]:
    """Everything a stored record says about its message."""
    out: dict[str, object] = {
        "topic": msg.topic,
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "commitlog_offset": msg.commitlog_offset,
        "offset_msg_id": msg.offset_msg_id,
        "msg_id": msg.msg_id,
        "unique_key": msg.unique_key,
        "tags": msg.tags,
        "keys": msg.keys,
        "properties": dict(sorted(msg.properties.items())),
        "store_time_ms": msg.store_timestamp,
        "store_time": iso_ms(msg.store_timestamp),
        "born_time_ms": msg.born_timestamp,
        "born_time": iso_ms(msg.born_timestamp),
        "born_host": f"{msg.born_host[0]}:{msg.born_host[1]}",
        "store_host": f"{msg.store_host[0]}:{msg.store_host[1]}",
        "reconsume_times": msg.reconsume_times,
        "size": msg.store_size,
        "body_size": len(msg.body),
        "body_crc": msg.body_crc,
    }
    if body:
        out.update(body_json(msg.body))
    return out
