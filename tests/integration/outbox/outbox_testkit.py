"""Test doubles shared by the outbox suites and the CLI tests' child processes.

`RecordingSender` is not a broker: it records every send in a real table so tests count
sends per message id; the CLI tests load it with `--sender outbox_testkit:sender_from_env`.
"""

from __future__ import annotations

import os

import sqlalchemy as sa

from reliable import Message, SendReceipt


class RecordingSender:
    """A `Sender` that appends every send to a real table (`<prefix>sent`).

    The table's autoincrement key is the queue offset, so the receipt carries a real,
    increasing position; counting rows per message id checks "sent exactly once".
    `fail_ids` makes sends of those ids raise, as an unreachable broker would.
    """

    def __init__(self, engine: sa.Engine, prefix: str) -> None:
        self.engine = engine
        md = sa.MetaData()
        self.table = sa.Table(
            f"{prefix}sent",
            md,
            sa.Column(
                "seq",
                sa.BigInteger().with_variant(sa.Integer, "sqlite"),
                primary_key=True,
                autoincrement=True,
            ),
            sa.Column("message_id", sa.String(64), nullable=False),
            sa.Column("topic", sa.String(255), nullable=False),
            sa.Column("retry_topic", sa.String(255), nullable=True),
        )
        md.create_all(engine)
        self.fail_ids: set[str] = set()
        self.fail_all = False

    def send(self, message: Message) -> SendReceipt:
        if self.fail_all or message.message_id in self.fail_ids:
            raise ConnectionError("broker unreachable")
        with self.engine.begin() as conn:
            seq = conn.execute(
                sa.insert(self.table).values(
                    message_id=message.message_id,
                    topic=message.topic,
                    retry_topic=message.properties.get("RETRY_TOPIC"),
                )
            ).inserted_primary_key[0]
        return SendReceipt(
            message_id=message.message_id,
            topic=message.topic,
            queue_id=0,
            queue_offset=int(seq),
            offset_msg_id=f"{int(seq):032X}",
        )

    def counts(self) -> dict[str, int]:
        t = self.table
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(t.c.message_id, sa.func.count()).group_by(t.c.message_id)
            ).all()
        return {mid: int(n) for mid, n in rows}

    def sends(self) -> list[tuple[str, str]]:
        t = self.table
        with self.engine.connect() as conn:
            return [
                (r.message_id, r.topic)
                for r in conn.execute(sa.select(t.c.message_id, t.c.topic).order_by(t.c.seq))
            ]


def sender_from_env() -> RecordingSender:
    """Factory for the CLI: the database URL and prefix come from the environment."""
    engine = sa.create_engine(os.environ["OUTBOX_TEST_DB"])
    return RecordingSender(engine, os.environ["OUTBOX_TEST_PREFIX"])


class FixedOffsets:
    """Every group has consumed past every offset (for CLI runs)."""

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        return 10**12


class StallingSender(RecordingSender):
    """Records sends, then stalls forever after `stall_after` of them (to be SIGKILLed)."""

    def __init__(self, engine: sa.Engine, prefix: str, stall_after: int, marker: str) -> None:
        super().__init__(engine, prefix)
        self.stall_after = stall_after
        self.marker = marker
        self.sent = 0

    def send(self, message: Message) -> SendReceipt:
        if self.sent >= self.stall_after:
            with open(self.marker, "w") as f:
                f.write(str(os.getpid()))
            import time

            time.sleep(600)
        self.sent += 1
        return super().send(message)


def stalling_sender_from_env() -> StallingSender:
    engine = sa.create_engine(os.environ["OUTBOX_TEST_DB"])
    return StallingSender(
        engine,
        os.environ["OUTBOX_TEST_PREFIX"],
        int(os.environ["OUTBOX_TEST_STALL_AFTER"]),
        os.environ["OUTBOX_TEST_MARKER"],
    )
