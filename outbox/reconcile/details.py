"""The detail rows: one per stub and per log row, appended to a report table or Parquet.

Without `report_all`, CONFIRMED and VOID stubs are left out. Every run's rows share one
schema, so a report table or Parquet directory accumulates runs side by side:

    run_id, kind ('stub' | 'log'), message_id, consumer_group (log row's group, or a
    stub's missing groups comma-separated), topic, queue_id, queue_offset, class, reason,
    created_at, in_window, send_count, max_sends
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.reconcile.classes import StubClass
from outbox.reconcile.errors import ReportWriteFailed
from outbox.reconcile.sources import _first_line

if TYPE_CHECKING:
    import sqlalchemy as sa
    from pyspark.sql import DataFrame

    from outbox.reconcile.classify import Classified
    from outbox.reconcile.drivers import JdbcTarget


def detail_rows(c: Classified, run_id: str, include_all: bool = False) -> DataFrame:
    from pyspark.sql import functions as F

    stubs = c.stubs()
    if not include_all:
        stubs = stubs.where(~F.col("class").isin(StubClass.CONFIRMED.value, StubClass.VOID.value))
    rows = stubs.unionByName(c.logs())
    return rows.select(F.lit(run_id).alias("run_id"), *rows.columns)


def write_parquet(rows: DataFrame, path: str) -> None:
    try:
        rows.write.mode("append").parquet(path)
    except Exception as exc:
        raise ReportWriteFailed(path, _cause(exc)) from None


def report_table(metadata: sa.MetaData, name: str, schema: str | None = None) -> sa.Table:
    """The detail-row table (created through SQLAlchemy before Spark appends to it, so its
    types are the same on every database)."""
    import sqlalchemy as sa

    return sa.Table(
        name,
        metadata,
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("message_id", sa.String(64), nullable=False),
        sa.Column("consumer_group", sa.Text, nullable=True),
        sa.Column("topic", sa.String(128), nullable=True),
        sa.Column("queue_id", sa.Integer, nullable=True),
        sa.Column("queue_offset", sa.BigInteger, nullable=True),
        sa.Column("class", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=False), nullable=True),
        sa.Column("in_window", sa.Boolean, nullable=True),
        sa.Column("send_count", sa.Integer, nullable=True),
        sa.Column("max_sends", sa.Integer, nullable=True),
        sa.Index(f"ix_{name}_run", "run_id"),
        schema=schema,
    )


def write_table(rows: DataFrame, target: JdbcTarget, table: str, schema: str | None = None) -> None:
    import sqlalchemy as sa

    from outbox.database import DatabaseUrlError, create_engine

    try:
        engine = create_engine(target.sqlalchemy_url)
    except DatabaseUrlError as exc:
        raise ReportWriteFailed(f"table {table}", exc.reason) from None
    try:
        report_table(sa.MetaData(), table, schema).create(engine, checkfirst=True)
    except sa.exc.SQLAlchemyError as exc:
        raise ReportWriteFailed(f"table {table}", str(exc).splitlines()[0]) from None
    finally:
        engine.dispose()
    if schema:
        table = f"{schema}.{table}"
    if target.dialect == "sqlite":
        rows = sqlite_compatible(rows).coalesce(1)  # one writer: SQLite locks the file
    try:
        writer = (
            rows.write.format("jdbc")
            .mode("append")
            .option("url", target.url)
            .option("dbtable", table)
        )
        for key, value in target.properties.items():
            writer = writer.option(key, value)
        writer.save()
    except Exception as exc:
        raise ReportWriteFailed(f"table {table}", _cause(exc)) from None


# SQLAlchemy's text format for a SQLite DATETIME (what the outbox's own tables hold)
SQLITE_DATETIME = "yyyy-MM-dd HH:mm:ss.SSSSSS"


def sqlite_compatible(rows: DataFrame) -> DataFrame:
    """Timestamps as SQLAlchemy writes them to SQLite (ISO text). SQLite's JDBC driver
    stores a timestamp as epoch milliseconds, which SQLAlchemy cannot read back from a
    DATETIME column; text keeps the report table's types the same on every database."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampNTZType, TimestampType

    return rows.select(
        *[
            F.date_format(F.col(f.name), SQLITE_DATETIME).alias(f.name)
            if isinstance(f.dataType, TimestampType | TimestampNTZType)
            else F.col(f.name)
            for f in rows.schema.fields
        ]
    )


def _cause(exc: BaseException) -> str:
    """The Java exception line of a Py4J error (its first line only says which call)."""
    return _first_line(exc)


__all__ = ["detail_rows", "report_table", "write_parquet", "write_table"]
