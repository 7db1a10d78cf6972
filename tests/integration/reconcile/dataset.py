"""A seeded outbox with a known number of stubs and log rows in every class.

Topic `orders` (groups from topic_group: billing), queues 0 and 1; topic `audit`
(stub.expected_groups = "g1,g2", two groups), queue 0. `NOW` is the job's clock.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import sqlalchemy as sa

from outbox.models import OutboxTables
from outbox.reconcile import LogClass, StubClass

NOW = datetime(2026, 1, 1, 12, 0, 0)
BASE = datetime(2026, 1, 1, 8, 0, 0)  # stubs are created from here, one minute apart


@dataclass
class Seeded:
    tables: OutboxTables
    stubs: dict[StubClass, set[str]] = field(default_factory=lambda: {c: set() for c in StubClass})
    logs: dict[LogClass, set[tuple[str, str]]] = field(
        default_factory=lambda: {c: set() for c in LogClass}
    )
    created: dict[str, datetime] = field(default_factory=dict)
    stub_rows: list[dict[str, object]] = field(default_factory=list)
    log_rows: list[dict[str, object]] = field(default_factory=list)
    conf_rows: list[dict[str, object]] = field(default_factory=list)
    tg_rows: list[dict[str, object]] = field(default_factory=list)

    def stub(
        self,
        cls: StubClass,
        topic: str,
        queue_id: int | None,
        offset: int | None,
        *,
        status: str = "UNCONFIRMED",
        groups: str = "",
        send_count: int = 1,
        max_sends: int = 16,
        created: datetime | None = None,
    ) -> str:
        mid = f"{topic}-{cls.value.lower()}-{len(self.stub_rows):04d}"
        at = created or BASE + timedelta(minutes=len(self.stub_rows))
        self.stubs[cls].add(mid)
        self.created[mid] = at
        self.stub_rows.append(
            {
                "message_id": mid,
                "topic": topic,
                "tags": None,
                "keys": None,
                "body": mid.encode(),
                "body_digest": hashlib.sha256(mid.encode()).hexdigest(),
                "headers": None,
                "expected_groups": groups,
                "status": status,
                "send_count": send_count if offset is not None else 0,
                "max_sends": max_sends,
                "queue_id": queue_id,
                "queue_offset": offset,
                "next_resend_at": None,
                "created_at": at,
                "updated_at": at,
                "last_error": None,
            }
        )
        return mid

    def confirm(self, mid: str, group: str, topic: str) -> None:
        at = NOW - timedelta(minutes=30) + timedelta(seconds=len(self.conf_rows))
        self.conf_rows.append(
            {"message_id": mid, "consumer_group": group, "topic": topic, "confirmed_at": at}
        )

    def log(
        self,
        cls: LogClass,
        mid: str,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        dead: bool = False,
    ) -> None:
        self.logs[cls].add((mid, group))
        self.log_rows.append(
            {
                "message_id": mid,
                "consumer_group": group,
                "topic": topic,
                "queue_id": queue_id,
                "queue_offset": offset,
                "created_at": NOW - timedelta(minutes=20),
                "dead_lettered_at": NOW - timedelta(minutes=10) if dead else None,
            }
        )

    def insert(self, engine: sa.Engine) -> None:
        self.tables.create_all(engine)
        t = self.tables
        with engine.begin() as conn:
            for table, rows in (
                (t.stub, self.stub_rows),
                (t.confirmation, self.conf_rows),
                (t.consumption_log, self.log_rows),
                (t.topic_group, self.tg_rows),
            ):
                if rows:
                    conn.execute(sa.insert(table), rows)


def build(prefix: str, *, stubs: bool = True, logs: bool = True, orders_groups: str = "") -> Seeded:
    """The data set; `stubs=False` / `logs=False` leave out the stub side / consumer side
    (the expected classes are then recomputed by the caller). `orders_groups` also writes
    the orders topic's groups on each stub, as the outbox's publish does."""
    s = Seeded(OutboxTables(prefix=prefix))
    s.tg_rows.append({"topic": "orders", "consumer_group": "billing"})
    C, L = StubClass, LogClass
    o = "orders"
    _stub = s.stub

    def stub_with_groups(
        cls: StubClass, topic: str, queue_id: int | None, offset: int | None, **kw: object
    ) -> str:
        if topic == o and orders_groups:
            kw.setdefault("groups", orders_groups)
        return _stub(cls, topic, queue_id, offset, **kw)  # type: ignore[arg-type]

    s.stub = stub_with_groups  # type: ignore[method-assign]
    # orders / queue 0, group billing
    for off in range(10):
        mid = s.stub(C.CONFIRMED, o, 0, off, status="CONFIRMED")
        s.confirm(mid, "billing", o)
        if off < 2:  # processed, but the log row was left behind
            s.log(L.STALE, mid, "billing", o, 0, off)
    for off in (10, 11):  # every group confirmed; the status column lags
        s.confirm(s.stub(C.CONFIRMED, o, 0, off), "billing", o)
    for off in (12, 13, 14):
        s.stub(C.LOST, o, 0, off)
    for off in (15, 16):
        s.stub(C.EXHAUSTED, o, 0, off, send_count=16)
    for off in (17, 18, 19):
        s.log(L.MATCHED, s.stub(C.IN_PROCESSING, o, 0, off), "billing", o, 0, off)
    s.log(L.MATCHED, s.stub(C.DEAD_LETTERED, o, 0, 20), "billing", o, 0, 20, dead=True)
    for off in (21, 22, 23, 24):  # above the group's watermark (20)
        s.stub(C.BACKLOGGED, o, 0, off)
    s.stub(C.BACKLOGGED, o, None, None, created=NOW - timedelta(minutes=1))  # unsent, new
    s.stub(C.LOST, o, None, None, created=NOW - timedelta(hours=1))  # unsent, old
    # the send result was never recorded, but the group received it: in processing
    mid = s.stub(C.IN_PROCESSING, o, None, None, created=NOW - timedelta(hours=2))
    s.log(L.MATCHED, mid, "billing", o, 1, 45)
    s.stub(C.VOID, o, 0, 25, status="VOID")
    s.stub(C.VOID, o, 0, 26, status="VOID")
    # orders / queue 1: orphan log rows (no stub) carry the watermark to 50
    for off in range(5):
        s.confirm(s.stub(C.CONFIRMED, o, 1, off, status="CONFIRMED"), "billing", o)
    s.stub(C.LOST, o, 1, 30)
    s.log(L.ORPHAN, "orders-orphan-a", "billing", o, 1, 40)
    s.log(L.ORPHAN, "orders-orphan-b", "billing", o, 1, 50)
    # audit / queue 0, groups g1 and g2 declared on the stub
    a, g = "audit", "g1,g2"
    mid = s.stub(C.CONFIRMED, a, 0, 0, groups=g, status="CONFIRMED")
    s.confirm(mid, "g1", a)
    s.confirm(mid, "g2", a)
    mid = s.stub(C.IN_PROCESSING, a, 0, 1, groups=g)
    s.confirm(mid, "g1", a)
    s.log(L.MATCHED, mid, "g2", a, 0, 1)
    mid = s.stub(C.LOST, a, 0, 2, groups=g)  # g1 confirmed; g2 passed offset 5
    s.confirm(mid, "g1", a)
    mid = s.stub(C.IN_PROCESSING, a, 0, 5, groups=g)
    s.confirm(mid, "g1", a)
    s.log(L.MATCHED, mid, "g2", a, 0, 5)
    mid = s.stub(C.BACKLOGGED, a, 0, 7, groups=g)  # g2 has not reached 7
    s.confirm(mid, "g1", a)
    if not stubs:
        s.stub_rows.clear()
        s.stubs = {c: set() for c in StubClass}
        s.logs = {c: set() for c in LogClass}
        for row in s.log_rows:
            s.logs[LogClass.ORPHAN].add((str(row["message_id"]), str(row["consumer_group"])))
    if not logs:
        s.log_rows.clear()
        s.conf_rows.clear()
        s.logs = {c: set() for c in LogClass}
    return s
