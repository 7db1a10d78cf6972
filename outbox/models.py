"""The outbox's tables: message stubs, per-group confirmations, the consumption log.

Table names and the schema are configurable (`OutboxTables(prefix=..., schema=...)`), so the
tables are built by a factory over SQLAlchemy Core rather than declared once at import.

    message stub    one row per published message, written in the business transaction
    confirmation    one row per (message, consumer group) that processed it (unique key)
    consumption log one row per (message, consumer group) while it is being processed
    topic group     the consumer groups a topic expects to confirm each message
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)


class StubStatus(enum.Enum):
    """Lifecycle of a message stub."""

    UNCONFIRMED = "UNCONFIRMED"  # published (or about to be); not yet confirmed by every group
    CONFIRMED = "CONFIRMED"  # every expected consumer group confirmed it
    VOID = "VOID"  # cancelled by an operator; never resent, never counted as lost


class ConfirmationOutcome(enum.Enum):
    """How a consumer group finished a message (the confirmation row's `outcome`)."""

    SUCCESS = "SUCCESS"  # the handler returned normally
    DISCARDED = "DISCARDED"  # the handler raised `Discard`: done, never retried


# The partial indexes' predicates (`ix_stub_resend`, `ix_stub_claimed`): the queries they
# serve name the same condition, with the status as a literal (`outbox.claim.due_clause`),
# so that the planner can prove it from a prepared statement's generic plan too.
UNCONFIRMED = f"status = '{StubStatus.UNCONFIRMED.value}'"


def _only(predicate: str) -> dict[str, Any]:
    """A partial index's WHERE on the databases that have partial indexes (MariaDB and
    MySQL have none: there the index holds every row)."""
    return {"postgresql_where": text(predicate), "sqlite_where": text(predicate)}


# Column sizes shared by every table. 128 covers RocketMQ's topic/group limit (127).
ID_LEN = 64
NAME_LEN = 128


@dataclass
class OutboxTables:
    """The four tables, built on one `MetaData`; names and schema are configurable."""

    prefix: str = "reliable_"
    schema: str | None = None
    metadata: MetaData = field(default_factory=MetaData)

    def __post_init__(self) -> None:
        p, md, sch = self.prefix, self.metadata, self.schema
        self.stub = Table(
            f"{p}message_stub",
            md,
            Column(
                "id",
                BigInteger().with_variant(Integer, "sqlite"),
                primary_key=True,
                autoincrement=True,
            ),
            Column("message_id", String(ID_LEN), nullable=False),
            Column("topic", String(NAME_LEN), nullable=False),
            Column("tags", String(NAME_LEN), nullable=True),
            Column("keys", String(512), nullable=True),
            Column(
                "body",
                LargeBinary().with_variant(LargeBinary(2**32 - 1), "mysql", "mariadb"),
                nullable=False,
            ),
            Column("body_digest", String(64), nullable=False),
            Column("headers", Text, nullable=True),  # JSON object of user properties
            Column("expected_groups", Text, nullable=False, default=""),  # comma-separated
            Column("status", String(16), nullable=False, default=StubStatus.UNCONFIRMED.value),
            Column("send_count", Integer, nullable=False, default=0),
            Column("max_sends", Integer, nullable=False, default=16),
            Column("queue_id", Integer, nullable=True),
            Column("queue_offset", BigInteger, nullable=True),
            Column("broker_msg_id", String(ID_LEN), nullable=True),  # offset id of last send
            Column("next_resend_at", DateTime(timezone=False), nullable=True),
            Column("escalated_at", DateTime(timezone=False), nullable=True),
            Column("created_at", DateTime(timezone=False), nullable=False),
            Column("updated_at", DateTime(timezone=False), nullable=False),
            Column("last_error", Text, nullable=True),
            # Added by the resend worker: the claim of the worker currently handling the row,
            # and, per consumer group resent through its retry topic, where that copy landed
            # (JSON object: group -> [topic, queue_id, queue_offset]).
            Column("claimed_by", String(ID_LEN), nullable=True),
            Column("group_positions", Text, nullable=True),
            UniqueConstraint("message_id", name=f"{p}uq_stub_message_id"),
            # Every index costs each stub three entries (its INSERT, the send's record and
            # the CONFIRMED update rewrite the row). Where the database has partial indexes
            # (PostgreSQL, SQLite), the resend index holds only the UNCONFIRMED stubs it
            # serves and the claim index only the claimed ones (a handful at any time).
            Index(f"{p}ix_stub_resend", "status", "next_resend_at", **_only(UNCONFIRMED)),
            Index(f"{p}ix_stub_created", "created_at"),
            Index(f"{p}ix_stub_claimed", "claimed_by", **_only("claimed_by IS NOT NULL")),
            schema=sch,
        )
        self.confirmation = Table(
            f"{p}confirmation",
            md,
            Column("message_id", String(ID_LEN), nullable=False),
            Column("consumer_group", String(NAME_LEN), nullable=False),
            Column("topic", String(NAME_LEN), nullable=False),
            Column("fencing_token", String(64), nullable=True),
            Column("confirmed_at", DateTime(timezone=False), nullable=False),
            # Added by the idempotency guard: digest of the processed body (a later delivery of
            # the same id with another body is reported) and the outcome (SUCCESS / DISCARDED).
            Column("body_digest", String(64), nullable=True),
            Column("outcome", String(16), nullable=True),
            PrimaryKeyConstraint("message_id", "consumer_group", name=f"{p}pk_confirmation"),
            Index(f"{p}ix_confirmation_time", "confirmed_at"),
            schema=sch,
        )
        self.consumption_log = Table(
            f"{p}consumption_log",
            md,
            Column("message_id", String(ID_LEN), nullable=False),
            Column("consumer_group", String(NAME_LEN), nullable=False),
            Column("topic", String(NAME_LEN), nullable=False),
            Column("queue_id", Integer, nullable=False),
            Column("queue_offset", BigInteger, nullable=False),
            Column("created_at", DateTime(timezone=False), nullable=False),
            # Added by the idempotency guard: the database-side lease (fencing token of the
            # worker processing the message, and until when); the confirmation is written only
            # while this row still carries the confirming worker's token.
            Column("lease_token", String(ID_LEN), nullable=True),
            Column("lease_until", DateTime(timezone=False), nullable=True),
            # Dead-letter marker, written by the consumer side when the group gives up on the
            # message (it went to %DLQ%<group>); reconciliation counts such a message as
            # dead-lettered (accounted for, held for an operator) rather than in processing.
            Column("dead_lettered_at", DateTime(timezone=False), nullable=True),
            PrimaryKeyConstraint("message_id", "consumer_group", name=f"{p}pk_consumption_log"),
            Index(f"{p}ix_log_topic_queue", "topic", "queue_id", "queue_offset"),
            schema=sch,
        )
        self.topic_group = Table(
            f"{p}topic_group",
            md,
            Column("topic", String(NAME_LEN), nullable=False),
            Column("consumer_group", String(NAME_LEN), nullable=False),
            PrimaryKeyConstraint("topic", "consumer_group", name=f"{p}pk_topic_group"),
            schema=sch,
        )

    def create_all(self, bind: object) -> None:
        """Create the tables (and indexes) that do not exist yet."""
        self.metadata.create_all(bind)  # type: ignore[arg-type]

    def drop_all(self, bind: object) -> None:
        self.metadata.drop_all(bind)  # type: ignore[arg-type]
