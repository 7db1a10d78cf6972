"""The guard's PostgreSQL statements (`GuardStore` uses them there): each does in one round
trip what takes several statements elsewhere. Built once per store; parameters bound by
name at each call.

- `receive_one`: a message's receipt (its consumption-log row, born with the lease) and
  what the database knows of it.
- `receive_many`: the same for a received batch, from arrays.
- `confirm`: step 5's writes (fencing, the stub settled, the confirmation).

Receipts commit without waiting for the WAL flush (asked for inside the statement:
`set_config(..., is_local)` lasts until its own commit): the handler's commit flushes it,
and a receipt lost with the server only loses a lease.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    and_,
    any_,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal,
    null,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.expression import BindParameter, CompoundSelect

from outbox.models import OutboxTables, StubStatus


def _keys() -> tuple[BindParameter[str], BindParameter[str], BindParameter[str]]:
    return bindparam("mid"), bindparam("grp"), bindparam("tok")


def _unflushed() -> Any:
    return func.set_config("synchronous_commit", "off", True)


def receive_one(tables: OutboxTables, known: CompoundSelect[Any]) -> Any:
    """Rows (src, digest): 1 the confirmation's, 2 the stub's (`known`'s own), 3 when the
    log row was inserted now, 4 the commit's setting (ignored)."""
    log = tables.consumption_log
    mid, grp, _ = _keys()
    # the log row's INSERT and the reads of `known` in one statement (a data-modifying
    # CTE; its SELECTs read the confirmation and the stub, not the log)
    born = (
        pg_insert(log)
        .values(
            message_id=mid,
            consumer_group=grp,
            topic=bindparam("topic"),
            queue_id=bindparam("qid"),
            queue_offset=bindparam("qoff"),
            created_at=bindparam("now"),
            lease_token=bindparam("ltok"),
            lease_until=bindparam("luntil"),
        )
        .on_conflict_do_nothing()
        .returning(literal(3).label("src"), null().label("body_digest"))
        .cte("born")
    )
    unflushed = select(literal(4).label("src"), _unflushed())
    return union_all(*known.selects, select(born.c.src, born.c.body_digest), unflushed)


def receive_many(tables: OutboxTables) -> Any:
    """Rows (src, message id, digest) for a batch (`mids`, `topics`, `qids`, `qoffs` and
    `ltoks`, the lease token of each or None): as `receive_one`'s, per message."""
    log, conf, stub = tables.consumption_log, tables.confirmation, tables.stub
    _, grp, _ = _keys()
    # the log rows from arrays (`unnest`), each born with its lease when it has a token
    rows = (
        func.unnest(
            bindparam("mids", type_=ARRAY(log.c.message_id.type)),
            bindparam("topics", type_=ARRAY(log.c.topic.type)),
            bindparam("qids", type_=ARRAY(log.c.queue_id.type)),
            bindparam("qoffs", type_=ARRAY(log.c.queue_offset.type)),
            bindparam("ltoks", type_=ARRAY(log.c.lease_token.type)),
        )
        .table_valued("mid", "topic", "qid", "qoff", "ltok")
        .render_derived(name="batch")
    )
    born_many = (
        pg_insert(log)
        .from_select(
            [
                "message_id",
                "consumer_group",
                "topic",
                "queue_id",
                "queue_offset",
                "created_at",
                "lease_token",
                "lease_until",
            ],
            select(
                rows.c.mid,
                grp,
                rows.c.topic,
                rows.c.qid,
                rows.c.qoff,
                bindparam("now", type_=log.c.created_at.type),
                rows.c.ltok,
                case(
                    (rows.c.ltok.is_(None), null()),
                    else_=bindparam("luntil", type_=log.c.lease_until.type),
                ),
            ),
        )
        .on_conflict_do_nothing()
        .returning(log.c.message_id)
        .cte("born")
    )
    in_batch = any_(bindparam("mids", type_=ARRAY(log.c.message_id.type)))
    return union_all(
        select(literal(1).label("src"), conf.c.message_id, conf.c.body_digest).where(
            conf.c.consumer_group == grp, conf.c.message_id == in_batch
        ),
        select(literal(2), stub.c.message_id, stub.c.body_digest).where(
            stub.c.message_id == in_batch
        ),
        select(literal(3), born_many.c.message_id, null()),
        select(literal(4), null(), _unflushed()),
    )


def expects_only(tables: OutboxTables, grp: BindParameter[str]) -> Any:
    """The stub expects no group but `grp` (its constant a named parameter: an anonymous
    one does not survive the copy into a CTE)."""
    stub = tables.stub
    return or_(stub.c.expected_groups == bindparam("no_groups", ""), stub.c.expected_groups == grp)


def confirm(tables: OutboxTables) -> Any:
    """One row (message id, the stub's expected groups and status, or NULLs without a
    stub) when fenced by the token and written; none when the lease was taken over."""
    log, conf, stub = tables.consumption_log, tables.confirmation, tables.stub
    mid, grp, tok = _keys()
    on_log = and_(log.c.message_id == mid, log.c.consumer_group == grp)
    # the stub's lock and, when this group is the only one it expects, its
    # CONFIRMED, in one statement (UPDATE ... RETURNING) instead of SELECT ... FOR UPDATE
    # then UPDATE; a stub expecting other groups is only locked (its row rewritten as
    # it was) and returned, for the count of confirmations. Its constants are named
    # parameters: an anonymous one does not survive the copy into a CTE below.
    confirmed: BindParameter[str] = bindparam("confirmed", StubStatus.CONFIRMED.value)
    alone = expects_only(tables, grp)
    settle = (
        update(stub)
        .where(
            stub.c.message_id == mid,
            # the status through an expression no index covers: the statement is prepared
            # (`Prepared`), and a plan made while the table was empty took the resend
            # index on (status, next_resend_at) for it, reading every unconfirmed stub to
            # find one; so only the message id's unique index can find the row
            func.coalesce(stub.c.status, stub.c.status)
            == bindparam("unconfirmed", StubStatus.UNCONFIRMED.value),
        )
        .values(
            status=case((alone, confirmed), else_=stub.c.status),
            updated_at=case((alone, bindparam("now")), else_=stub.c.updated_at),
        )
        .returning(stub.c.expected_groups, stub.c.status)
    )
    # step 5's three writes in one statement, in the same lock order (the
    # log row's fencing DELETE, the stub's settling UPDATE, then the confirmation's
    # INSERT, which runs after the statement's query as every unread data-modifying
    # CTE does). Not fenced: nothing is written and no row comes back. An existing
    # confirmation fails the INSERT (IntegrityError) as the plain one does. No
    # parameter is named after a column of the tables it writes: SQLAlchemy would take
    # it for a value of that column.
    fenced = delete(log).where(on_log, log.c.lease_token == tok).returning(log.c.message_id)
    fenced_cte = fenced.cte("fenced")
    settled_cte = settle.where(select(fenced_cte.c.message_id).exists()).cte("settled")
    conf_values = select(
        fenced_cte.c.message_id,
        grp,
        bindparam("conf_topic", type_=conf.c.topic.type),
        tok,
        bindparam("now", type_=conf.c.confirmed_at.type),
        bindparam("digest", type_=conf.c.body_digest.type),
        bindparam("conf_outcome", type_=conf.c.outcome.type),
    )
    confirmed_cte = (
        insert(conf)
        .from_select(
            [
                "message_id",
                "consumer_group",
                "topic",
                "fencing_token",
                "confirmed_at",
                "body_digest",
                "outcome",
            ],
            conf_values,
        )
        .cte("confirmed")
    )
    return (
        select(fenced_cte.c.message_id, settled_cte.c.expected_groups, settled_cte.c.status)
        .select_from(fenced_cte.outerjoin(settled_cte, true()))
        .add_cte(confirmed_cte)
    )
