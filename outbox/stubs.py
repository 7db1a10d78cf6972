"""Turning a `reliable.Message` into a stub row and back, the body digest, and the one
statement that writes many stubs' values (`ArrayUpdate`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Table,
    Update,
    bindparam,
    cast,
    column,
    func,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
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


class ArrayUpdate:
    """One `UPDATE stub SET k = v.v_k ... FROM unnest(<one array per column>) AS v WHERE
    stub.<by> = v.b_<by>` for a whole batch (PostgreSQL): one round trip where an
    executemany makes one per row.

    The statement's text is the same whatever the batch's size (the rows travel as one
    array parameter per column), so SQLAlchemy compiles it once and reuses it: a
    `VALUES` list of the batch's rows was a new statement to compile at every batch, a
    fifth of the outbox's background thread's CPU in its profile. Build one per shape
    and keep it. `also` adds expressions set on every row (`send_count + 1`)."""

    def __init__(
        self,
        stub: Table,
        by: str,
        keys: tuple[str, ...],
        *,
        also: Mapping[str, ColumnElement[Any]] | None = None,
        where: ColumnElement[bool] | None = None,
    ) -> None:
        self.names = (f"b_{by}", *(f"v_{k}" for k in keys))
        columns = [stub.c[by], *(stub.c[k] for k in keys)]
        arrays = {
            n: cast(bindparam(f"a_{n}"), ARRAY(c.type))
            for n, c in zip(self.names, columns, strict=True)
        }
        rows = (
            func.unnest(*arrays.values())
            .table_valued(*(column(n, c.type) for n, c in zip(self.names, columns, strict=True)))
            .render_derived(name="v")
        )
        self.statement: Update = (
            update(stub)
            .where(stub.c[by] == rows.c[f"b_{by}"])
            # the keys again as an array: the planner reads the few rows wanted by their
            # index (joined to the unnest alone, a small table is read whole)
            .where(stub.c[by] == func.any(arrays[f"b_{by}"]))
            .values({**{k: rows.c[f"v_{k}"] for k in keys}, **(also or {})})
        )
        if where is not None:
            self.statement = self.statement.where(where)

    def params(self, batch: list[dict[str, Any]]) -> dict[str, list[Any]]:
        """The parameters of `statement` for `batch`, rows holding `b_<by>` and a `v_<k>`
        per key."""
        return {f"a_{n}": [row[n] for row in batch] for n in self.names}


class ArrayUpdates:
    """The `ArrayUpdate`s of one table and key column, one per set of keys written,
    built at first use and kept (each compiled once)."""

    def __init__(
        self,
        stub: Table,
        by: str,
        *,
        also: Mapping[str, ColumnElement[Any]] | None = None,
        where: ColumnElement[bool] | None = None,
    ) -> None:
        self._stub, self._by, self._also, self._where = stub, by, also, where
        self._built: dict[tuple[str, ...], ArrayUpdate] = {}

    def execute(self, conn: Connection, keys: tuple[str, ...], batch: list[dict[str, Any]]) -> None:
        """Write `batch` (rows of `b_<by>` and a `v_<k>` per key) in one statement."""
        update_many = self._built.get(keys)
        if update_many is None:
            update_many = self._built[keys] = ArrayUpdate(
                self._stub, self._by, keys, also=self._also, where=self._where
            )
        conn.execute(update_many.statement, update_many.params(batch))
