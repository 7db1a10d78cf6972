"""Every database URL form the docs write works in every command that takes `--db`, on the
real PostgreSQL and MariaDB: `postgresql://` (which SQLAlchemy 2.1 would give psycopg 3,
not installed), `postgres://` (no such SQLAlchemy dialect), `postgresql+psycopg2://`,
`mysql://` and `mariadb://` (which SQLAlchemy would give mysqlclient), and both with
`+pymysql`. A URL naming a driver that is not installed fails in one line naming the
package, not with an ImportError."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from url_forms import MARIADB_FORMS, POSTGRES_FORMS

from idempotency.environment import guard_from_environment
from outbox import Outbox, OutboxTables
from outbox.database import DriverMissing, create_engine, database_url
from reliable import Message
from reliable_cli import main
from reliable_cli.admin_trace import outbox_trace
from reliable_cli.console.database import OutboxView
from reliable_cli.exit_codes import ExitCode

FORMS = [
    *(pytest.param(u, id=u.split(":")[0], marks=pytest.mark.postgres) for u in POSTGRES_FORMS),
    *(pytest.param(u, id=u.split(":")[0], marks=pytest.mark.mariadb) for u in MARIADB_FORMS),
]


class _Lost:
    def send(self, message: Message) -> object:
        raise ConnectionError("the first send was lost")


@pytest.mark.parametrize("url", FORMS)
def test_every_command_reads_the_url_as_written(
    url: str, table_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = create_engine(url)
    tables = OutboxTables(prefix=table_prefix)
    tables.create_all(engine)
    try:
        outbox = Outbox(tables, _Lost(), clock=lambda: datetime(2000, 1, 1))
        with Session(engine) as session, session.begin():
            mid = outbox.publish(session, Message("url-forms", b"x", keys=["url-42"]))
        db = ["--db", url, "--table-prefix", table_prefix]

        # reliable outbox list / show
        assert main(["outbox", "list", *db, "--json"]) == ExitCode.OK
        assert [s["message_id"] for s in json.loads(capsys.readouterr().out)["stubs"]] == [mid]
        assert main(["outbox", "show", mid, *db, "--json"]) == ExitCode.OK
        assert mid in capsys.readouterr().out

        # reliable worker resend --once
        sender = ["--sender", "url_forms:accepting"]
        assert main(["worker", "resend", *db, *sender, "--once", "--json"]) == ExitCode.OK
        done = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert (done["selected"], done["resent"], done["errors"]) == (1, 1, 0)

        # reliable admin message trace --db (the function the command and the console call)
        trace = outbox_trace(url, table_prefix, None, "url-42", [mid])
        assert [s["message_id"] for s in trace["stubs"]] == [mid]

        # reliable console --db
        view = OutboxView(url, prefix=table_prefix)
        try:
            assert view.backlog().by_status.get("UNCONFIRMED") == 1
        finally:
            view.close()

        # the default guard (`idempotent=True`): RELIABLE_DATABASE_URL
        guard = guard_from_environment(
            {"RELIABLE_DATABASE_URL": url, "RELIABLE_TABLE_PREFIX": table_prefix}
        )
        with guard.engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(tables.stub)).scalar() == 1
        guard.engine.dispose()
    finally:
        tables.drop_all(engine)
        engine.dispose()


@pytest.mark.parametrize(
    ("url", "used"),
    [
        ("postgres://u@h/db", "postgresql+psycopg2://u@h/db"),
        ("postgresql://u:pw@h:5432/db", "postgresql+psycopg2://u:***@h:5432/db"),
        ("postgresql+psycopg2://u@h/db", "postgresql+psycopg2://u@h/db"),
        ("mysql://u@h/db", "mysql+pymysql://u@h/db"),
        ("mariadb://u@h/db", "mariadb+pymysql://u@h/db"),
        ("mariadb+pymysql://u@h/db", "mariadb+pymysql://u@h/db"),
        ("sqlite:///app.db", "sqlite:///app.db"),
    ],
)
def test_the_driver_each_form_gets(url: str, used: str) -> None:
    assert database_url(url).render_as_string(hide_password=True) == used


def test_a_named_driver_that_is_not_installed_is_one_line_naming_the_package(
    capsys: pytest.CaptureFixture[str], table_prefix: str
) -> None:
    with pytest.raises(DriverMissing) as caught:
        database_url("mysql+mysqldb://u:secret@h/db")
    assert caught.value.requirement == "mysqlclient" and "secret" not in str(caught.value)
    code = main(["outbox", "list", "--db", "mysql+mysqldb://u:secret@h/db", "--json"])
    assert code == ExitCode.USAGE
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "pip install 'mysqlclient'" in line and "secret" not in line
    code = main(
        ["worker", "resend", "--db", "nonsense", "--sender", "url_forms:accepting", "--once"]
    )
    assert code == ExitCode.USAGE
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("reliable worker resend: --db 'nonsense': not a database URL")
