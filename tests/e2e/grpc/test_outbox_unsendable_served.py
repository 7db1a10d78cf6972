"""Messages that can never be sent, over the served topology: a real `reliable broker start`
process and the outbox on the grpc transport.

What the outbox can tell (a bad topic name, a body over the limit) is refused at `publish`
and nothing commits; what only the server can tell (a body over a lower `--max-body-size`)
is refused after commit and escalated once, at once, by the resend worker: never retried
as if it were backlogged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from outbox import Escalation, InvalidStub, Outbox, OutboxConfig, OutboxTables, ResendWorker
from outbox.errors import REFUSED_PREFIX
from reliable import Message, Producer
from tests.e2e.grpc.server_process import ServerProcess


class Recorder:
    def __init__(self) -> None:
        self.escalations: list[Escalation] = []

    def notify(self, escalation: Escalation) -> None:
        self.escalations.append(escalation)


def _stubs(engine: sa.Engine, tables: OutboxTables) -> list[sa.RowMapping]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(tables.stub)).mappings())


def test_unsendable_over_grpc_is_refused_or_escalated_at_once(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = make_server("--max-body-size", "1024")
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'shop.db'}")
    tables = OutboxTables()
    tables.create_all(engine)
    with Producer("grpc", endpoint=server.endpoint) as producer:
        outbox = Outbox(tables, producer)
        for message, why in (
            (Message("bad topic!", b"x"), "invalid topic name"),
            (Message("Orders", b"x" * (4 * 1024 * 1024 + 1)), "exceeds the broker's limit"),
        ):
            with pytest.raises(InvalidStub, match=why), Session(engine) as session, session.begin():
                outbox.publish(session, message)
        assert _stubs(engine, tables) == []  # the business transaction rolled back

        # the server's limit is lower than the outbox's check: only the server can refuse
        unchecked = Outbox(tables, producer, config=OutboxConfig(max_body_size=0))
        with Session(engine) as session, session.begin():
            mid = unchecked.publish(session, Message("Orders", b"x" * 2048))
        [stub] = _stubs(engine, tables)
        assert "MESSAGE_BODY_TOO_LARGE" in stub["last_error"], stub

        notifier = Recorder()
        worker = ResendWorker(engine, tables, producer, notifier=notifier)
        first = worker.run_once()
        assert (first.refused, first.escalated, first.resent, first.backlogged) == (1, 1, 0, 0)
        [escalation] = notifier.escalations
        assert escalation.message_id == mid and escalation.refused
        [stub] = _stubs(engine, tables)
        assert stub["escalated_at"] is not None
        assert stub["last_error"].startswith(REFUSED_PREFIX)
        again = worker.run_once()
        assert again.selected == 0 and len(notifier.escalations) == 1
    engine.dispose()
