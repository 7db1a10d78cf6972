"""One local SparkSession for the whole package (starting a SparkContext is the expensive
part; every test leaves the session as it found it: the job gives back the settings it
changes, and unpersists what it cached). Under pytest-xdist the package is one unit of
work (tests/conftest.py), run on one worker, so one JVM serves it all."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from outbox.reconcile import driver_jars, spark_session
from outbox.reconcile.job import SMALL_INPUT_JAVA_OPTIONS

# no shuffle partition setting: the job sizes them from the data (here: 2, the default
# parallelism of local[2])
TEST_CONF = {
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "1g",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
}


@pytest.fixture(scope="package")
def spark() -> Iterator[object]:
    jars = [*driver_jars("sqlite"), *driver_jars("postgresql"), *driver_jars("mysql")]
    # every data set here is small: the JVM the job starts for a small database (C1 only)
    session = spark_session(
        "local[2]",
        jars,
        TEST_CONF,
        app_name="reconcile-tests",
        java_options=SMALL_INPUT_JAVA_OPTIONS,
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]
ALL_BACKENDS = [*BACKENDS, pytest.param("mariadb", id="mariadb", marks=pytest.mark.mariadb)]


@pytest.fixture
def engine(db_url: str, table_prefix: str) -> Iterator[object]:
    """An engine on the test database; every table with the test's prefix is dropped after."""
    import sqlalchemy as sa

    eng = sa.create_engine(db_url)
    yield eng
    inspector = sa.inspect(eng)
    md = sa.MetaData()
    for name in inspector.get_table_names():
        if name.startswith(table_prefix):
            sa.Table(name, md)
    md.drop_all(eng)
    eng.dispose()
