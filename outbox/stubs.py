"""Turning a `reliable.Message` into a stub row and back, the body digest, and the one
statement that writes many stubs' values (`update_from_values`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Table, Update, cast, column, update, values
from sqlalchemy.engine import RowMapping

from outbox.errors import InvalidStub
from outbox.models import ID_LEN, NAME_LEN, StubStatus
from protocol.limits import DEFAULT_MAX_BODY_SIZE
from protocol.props import Prop
from reliable.errors import InvalidName
from reliable.message import Message
from reliable.naming import check_topic

# Message properties that travel on the broker but are not user headers (the message's
# id, keys and tags are fields of the message, and so columns of the stub).
_RESERVED_PROPERTIES = frozenset({Prop.UNIQ_KEY, Prop.KEYS, Prop.TAGS})


def body_digest(body: bytes) -> str:
    """SHA-256 of a body, hex (64 chars): compares bodies of the same id cheaply."""
    return hashlib.sha256(body).hexdigest()


def join_groups(groups: Iterable[str]) -> str:
    return ",".join(sorted(set(groups)))


def split_groups(value: str | None) -> list[str]:
    return [g for g in (value or "").split(",") if g]


def check_sendable(message: Message, max_body_size: int | None) -> None:
    """Refuse, with `InvalidStub`, what no broker would ever store: a bad id, a topic name
    breaking the naming rules, a body that is not bytes, empty, or above the limit."""
    mid = message.message_id
    if not isinstance(mid, str) or not mid or len(mid) > ID_LEN:
        raise InvalidStub(str(mid), f"message_id must be 1..{ID_LEN} characters")
    if not isinstance(message.topic, str) or not message.topic or len(message.topic) > NAME_LEN:
        raise InvalidStub(mid, f"topic must be 1..{NAME_LEN} characters")
    try:
        check_topic(message.topic)
    except InvalidName as exc:
        raise InvalidStub(mid, str(exc)) from exc
    if not isinstance(message.body, bytes | bytearray):
        raise InvalidStub(mid, f"body must be bytes, not {type(message.body).__name__}")
    if not message.body:
        raise InvalidStub(mid, "body is empty (the broker refuses empty bodies)")
    if max_body_size is not None and len(message.body) > max_body_size:
        raise InvalidStub(
            mid,
            f"body of {len(message.body):,} bytes exceeds the broker's "
            f"limit of {max_body_size:,} bytes",
        )


def stub_values(
    message: Message,
    *,
    expected_groups: Iterable[str],
    max_sends: int,
    now: datetime,
    next_resend_at: datetime,
    max_body_size: int | None = DEFAULT_MAX_BODY_SIZE,
) -> dict[str, Any]:
    """The row inserted for `message` (status UNCONFIRMED, never sent yet)."""
    check_sendable(message, max_body_size)
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


def update_from_values(
    stub: Table,
    by: str,
    keys: tuple[str, ...],
    batch: list[dict[str, Any]],
    *,
    also: Mapping[str, ColumnElement[Any]] | None = None,
) -> Update:
    """One `UPDATE stub SET k = v.k ... FROM (VALUES ...) AS v WHERE stub.<by> = v.b_<by>`
    for a whole batch (PostgreSQL): one round trip where an executemany makes one per row.

    Each row of `batch` holds `b_<by>` and a `v_<k>` per key; `also` adds expressions set on
    every row (`send_count + 1`). Each value is cast to its column's type (a VALUES column of
    NULLs alone is text)."""
    match = f"b_{by}"
    cols = [column(match, stub.c[by].type)] + [column(f"v_{k}", stub.c[k].type) for k in keys]
    rows = values(*cols, name="v").data([tuple(p[c.name] for c in cols) for p in batch])
    return (
        update(stub)
        .where(stub.c[by] == rows.c[match])
        # the keys again as a list: the planner sees how few rows of the stub table are
        # wanted and reads them by their index (joined to VALUES alone, a small table is
        # read whole)
        .where(stub.c[by].in_([p[match] for p in batch]))
        .values({**{k: cast(rows.c[f"v_{k}"], stub.c[k].type) for k in keys}, **(also or {})})
    )
