"""One local SparkSession for the whole package (starting a SparkContext is the expensive
part; every test leaves the session as it found it: the job gives back the settings it
changes, and unpersists what it cached). Under pytest-xdist the package is one unit of
work (tests/conftest.py), run on one worker, so one JVM serves it all."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from outbox.reconcile import spark_session
from outbox.reconcile.classcache import archive_path, is_archive, mapping_options
from outbox.reconcile.job import SMALL_INPUT_JAVA_OPTIONS, session_jars
from outbox.reconcile.preflight import find_java

# no shuffle partition setting: the job sizes them from the data (here: 2, the default
# parallelism of local[2])
TEST_CONF = {
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "1g",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
}


def small_jvm_options() -> tuple[str, ...]:
    """The options of the JVM a small run starts (every data set here is small: C1 only),
    with the class archive `make test` writes before the suite (`write_archive`) mapped
    when it is there: about 3.5 s of CPU off each JVM's start. Never one written here (a
    worker would wait for it at its exit). Spark's daemons, spark-submit's drivers and the
    executors have the same classpath (Spark's jars); a JVM that cannot use the archive
    starts without it."""
    archive = archive_path(find_java(), session_jars("sqlite"), SMALL_INPUT_JAVA_OPTIONS)
    if archive is None or not is_archive(archive):
        return SMALL_INPUT_JAVA_OPTIONS
    return (*SMALL_INPUT_JAVA_OPTIONS, *mapping_options(archive))


@pytest.fixture(scope="package")
def spark() -> Iterator[object]:
    # every installed driver, in the order a small run's own session has them (the
    # archive's key)
    session = spark_session(
        "local[2]",
        session_jars("sqlite"),
        TEST_CONF,
        app_name="reconcile-tests",
        java_options=small_jvm_options(),
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
