"""Which consumer groups a topic expects to confirm each message (the topic_group table).

A stub records the expected groups at publish time (`expected_groups`), so changing the
registry later never changes what an already-published message waits for.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Table,
    bindparam,
    collate,
    delete,
    func,
    insert,
    literal,
    select,
)
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.orm import Session

from outbox.errors import OutboxError
from outbox.models import NAME_LEN, OutboxTables


class InvalidGroup(OutboxError):
    """A consumer group or topic name is empty, too long or contains a comma."""

    def __init__(self, what: str, name: str) -> None:
        self.what = what  # "group" or "topic"
        self.name = name
        super().__init__(f"bad {what} name {name!r}: 1..{NAME_LEN} characters, no comma")


def _check(name: str, what: str) -> str:
    if not name or len(name) > NAME_LEN or "," in name:
        raise InvalidGroup(what, name)
    return name


def declare_groups(
    bind: Engine | Connection, tables: OutboxTables, topic: str, groups: Iterable[str]
) -> None:
    """Declare (replace) the consumer groups that must confirm messages of `topic`."""
    _check(topic, "topic")
    wanted = sorted({_check(g, "group") for g in groups})
    t = tables.topic_group
    rows = [{"topic": topic, "consumer_group": g} for g in wanted]
    if isinstance(bind, Engine):
        with bind.begin() as conn:
            _replace(conn, t, topic, rows)
    else:
        _replace(bind, t, topic, rows)


def _replace(conn: Connection, t: Table, topic: str, rows: list[dict[str, str]]) -> None:
    conn.execute(delete(t).where(t.c.topic == topic))
    if rows:
        conn.execute(insert(t), rows)


def expected_groups(bind: Connection | Session, tables: OutboxTables, topic: str) -> list[str]:
    """The groups declared for `topic` (empty: any one confirmation confirms the stub)."""
    t = tables.topic_group
    rows = bind.execute(select(t.c.consumer_group).where(t.c.topic == topic)).scalars()
    return sorted(rows)


def expected_groups_sql(tables: OutboxTables, dialect: str) -> Any:
    """`expected_groups` of a stub as SQL, read in the stub's own INSERT (bound parameter
    `eg_topic`): the sorted, comma-joined groups of the topic, '' for none. One statement
    instead of a SELECT and an INSERT. None where the database has no ordered string
    aggregate (then `expected_groups` is read first)."""
    if dialect != "postgresql":
        return None
    t = tables.topic_group
    group = collate(t.c.consumer_group, "C")  # byte order: Python's sorted() on str
    return func.coalesce(
        select(
            func.array_to_string(
                func.array_agg(aggregate_order_by(t.c.consumer_group, group)), literal(",")
            )
        )
        .where(t.c.topic == bindparam("eg_topic"))
        .scalar_subquery(),
        literal(""),
    )
