"""Messages that can never be sent: refused at `publish` when the outbox can tell, and
escalated at once (never retried as if backlogged) when only the broker can.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import reliable
from outbox import (
    Escalation,
    InvalidStub,
    Outbox,
    OutboxConfig,
    OutboxTables,
    ResendWorker,
    utcnow,
)
from outbox.errors import REFUSED_PREFIX
from reliable import Message, Producer
from tests.e2e.helpers import broker_config, store_config

ALL = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mariadb", marks=pytest.mark.mariadb),
]


def _stubs(engine: sa.Engine, tables: OutboxTables) -> list[sa.RowMapping]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(tables.stub)).mappings())


@pytest.mark.parametrize("db_url", ALL, indirect=True)
def test_publish_refuses_what_no_broker_would_store(engine, tables, sender) -> None:
    outbox = Outbox(tables, sender, config=OutboxConfig(max_body_size=16))
    bad = [
        (Message("bad topic!", b"x"), "only letters, digits"),
        (Message("T", "text, not bytes"), "body must be bytes, not str"),  # type: ignore[arg-type]
        (Message("T", b""), "body is empty"),
        (Message("T", b"x" * 17), "body of 17 bytes exceeds the broker's limit of 16"),
        (Message("SCHEDULE_TOPIC_XXXX", b"x"), "reserved for the broker"),
    ]
    with Session(engine) as session, session.begin():
        for message, reason in bad:
            with pytest.raises(InvalidStub) as info:
                outbox.publish(session, message)
            assert reason in info.value.reason
            assert info.value.message_id == message.message_id
        # the business transaction goes on: the limit itself is a valid body
        ok = outbox.publish(session, Message("T", b"x" * 16))
    assert [s["message_id"] for s in _stubs(engine, tables)] == [ok]
    assert sender.counts() == {ok: 1}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_limit_is_the_senders_own_when_it_has_one(engine, tables, sender) -> None:
    sender.max_body_size = 8  # e.g. what the broker advertised
    outbox = Outbox(tables, sender)
    with (
        Session(engine) as session,
        session.begin(),
        pytest.raises(InvalidStub, match="limit of 8 bytes"),
    ):
        outbox.publish(session, Message("T", b"x" * 9))
    default = Outbox(tables, object())  # type: ignore[arg-type]
    assert default.max_body_size == 4 * 1024 * 1024
    assert Outbox(tables, sender, config=OutboxConfig(max_body_size=0)).max_body_size is None


class Recorder:
    """Collects escalations (the people the notifier would reach)."""

    def __init__(self) -> None:
        self.escalations: list[Escalation] = []

    def notify(self, escalation: Escalation) -> None:
        self.escalations.append(escalation)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_send_the_broker_refuses_is_escalated_once_at_once(
    engine, tables, tmp_path: Path
) -> None:
    # the broker's limit is lower than the outbox knows (its check is off): only the
    # broker can refuse this body, and it always will
    transport = reliable.connect(
        "embedded",
        store_config=store_config(tmp_path / "store"),
        broker_config=broker_config(max_message_size=1024),
    )
    transport.start()
    with Producer(transport) as producer:
        outbox = Outbox(tables, producer, config=OutboxConfig(max_body_size=0))
        with Session(engine) as session, session.begin():
            mid = outbox.publish(session, Message("Orders", b"x" * 2048))
        [stub] = _stubs(engine, tables)
        assert stub["queue_offset"] is None and "BadRequest" in stub["last_error"]
        assert stub["next_resend_at"] <= utcnow()  # due now: no retry can succeed

        notifier = Recorder()
        worker = ResendWorker(engine, tables, producer, notifier=notifier)
        first = worker.run_once()
        assert (first.selected, first.refused, first.escalated, first.resent, first.backlogged) == (
            1,
            1,
            1,
            0,
            0,
        )
        [escalation] = notifier.escalations
        assert escalation.message_id == mid and escalation.refused
        assert "can never be sent" in escalation.summary()
        [stub] = _stubs(engine, tables)
        assert stub["escalated_at"] is not None
        assert stub["last_error"].startswith(REFUSED_PREFIX)
        again = worker.run_once()  # escalated: never selected again, never notified twice
        assert again.selected == 0 and len(notifier.escalations) == 1
    transport.close()
