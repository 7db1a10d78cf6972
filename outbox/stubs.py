"""Turning a `reliable.Message` into a stub row and back, and the body digest."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy.engine import RowMapping

from outbox.errors import InvalidStub
from outbox.models import ID_LEN, NAME_LEN, StubStatus
from reliable.message import Message

# Message properties that travel on the broker but are not user headers.
_RESERVED_PROPERTIES = frozenset({"UNIQ_KEY", "KEYS", "TAGS"})


def body_digest(body: bytes) -> str:
    """SHA-256 of a body, hex (64 chars): compares bodies of the same id cheaply."""
    return hashlib.sha256(body).hexdigest()


def join_groups(groups: Iterable[str]) -> str:
    return ",".join(sorted(set(groups)))


def split_groups(value: str | None) -> list[str]:
    return [g for g in (value or "").split(",") if g]


def stub_values(message: Message, *, expected_groups: Iterable[str], max_sends: int,
                now: datetime, next_resend_at: datetime) -> dict[str, Any]:
    """The row inserted for `message` (status UNCONFIRMED, never sent yet)."""
    if not message.message_id or len(message.message_id) > ID_LEN:
        raise InvalidStub(message.message_id, f"message_id must be 1..{ID_LEN} characters")
    if not message.topic or len(message.topic) > NAME_LEN:
        raise InvalidStub(message.message_id, f"topic must be 1..{NAME_LEN} characters")
    if not isinstance(message.body, bytes | bytearray):
        raise InvalidStub(message.message_id, "body must be bytes")
    if max_sends < 1:
        raise InvalidStub(message.message_id, "max_sends must be at least 1")
    headers = {k: v for k, v in message.properties.items() if k not in _RESERVED_PROPERTIES}
    if message.message_group:
        headers["__message_group"] = message.message_group
    return {
        "message_id": message.message_id,
        "topic": message.topic,
        "tags": message.tags,
        "keys": " ".join(message.keys) or None,
        "body": bytes(message.body),
        "body_digest": body_digest(bytes(message.body)),
        "headers": json.dumps(headers, sort_keys=True) if headers else None,
        "expected_groups": join_groups(expected_groups),
        "status": StubStatus.UNCONFIRMED.value,
        "send_count": 0,
        "max_sends": max_sends,
        "next_resend_at": next_resend_at,
        "created_at": now,
        "updated_at": now,
    }


def message_from_stub(row: Mapping[str, Any] | RowMapping) -> Message:
    """Rebuild the message of a stub row (same id, topic, body, tags, keys, headers)."""
    headers: dict[str, str] = json.loads(row["headers"]) if row["headers"] else {}
    group = headers.pop("__message_group", None)
    return Message(
        topic=row["topic"],
        body=bytes(row["body"]),
        tags=row["tags"],
        keys=(row["keys"] or "").split(),
        properties=headers,
        message_group=group,
        message_id=row["message_id"],
    )
