"""`reliable reconcile --db` takes every URL form the docs write, on the real PostgreSQL and
MariaDB: the JDBC URL, the preflight check and the repair all read it the same way."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from outbox.database import create_engine
from reliable_cli import main
from reliable_cli.exit_codes import ExitCode
from tests.conftest import MARIADB_URL, POSTGRES_URL

from .dataset import build

pytestmark = pytest.mark.spark


def _form(url: str, scheme: str) -> str:
    return sa.make_url(url).set(drivername=scheme).render_as_string(hide_password=False)


FORMS = [
    *(
        pytest.param(_form(POSTGRES_URL, s), id=s, marks=pytest.mark.postgres)
        for s in ("postgresql", "postgres", "postgresql+psycopg2")
    ),
    *(
        pytest.param(_form(MARIADB_URL, s), id=s, marks=pytest.mark.mariadb)
        for s in ("mysql", "mysql+pymysql", "mariadb", "mariadb+pymysql")
    ),
]


@pytest.mark.parametrize("url", FORMS)
def test_reconcile_reads_every_url_form(spark, url, table_prefix, capsys):
    seeded = build(table_prefix)
    engine = create_engine(url)
    seeded.insert(engine)
    try:
        rc = main(["reconcile", "--db", url, "--prefix", table_prefix, "--json", "--repair"])
        doc = json.loads(capsys.readouterr().out)
        # the data set has lost stubs: the job read every table through JDBC and repaired
        assert rc == ExitCode.UNACCOUNTED == doc["exit_code"], doc
        assert doc["stubs"]["total"] == 41
        assert doc["repair"]["marked_due"] == doc["stubs"]["lost"]
    finally:
        seeded.tables.drop_all(engine)
        for name in sa.inspect(engine).get_table_names():
            if name.startswith(table_prefix):
                sa.Table(name, sa.MetaData()).drop(engine)
        engine.dispose()
