"""Spark reconciliation of message stubs against confirmations and the consumption log.

    from outbox.reconcile import ReconcileOptions, reconcile
    result = reconcile(ReconcileOptions(db_url="postgresql+psycopg2://app@db/app"))
    print(result.summary.certificate.clean)

Nothing here imports pyspark until a job runs.
"""

from outbox.reconcile.bounds import QueueBoundsLike, parse_json, read_bounds
from outbox.reconcile.certificate import Certificate, IdDigest, Oldest, QueueFigures, Summary
from outbox.reconcile.classes import LogClass, RepairAction, StubClass
from outbox.reconcile.classify import Classified, Inputs, Window, classify
from outbox.reconcile.drivers import JdbcTarget, driver_jars, jdbc_target
from outbox.reconcile.errors import (
    DriverNotFound,
    InvalidBounds,
    InvalidOptions,
    JavaNotFound,
    JobFailed,
    ReconcileError,
    RepairFailed,
    ReportWriteFailed,
    SourceUnavailable,
)
from outbox.reconcile.job import ReconcileOptions, ReconcileResult, reconcile
from outbox.reconcile.repair import RepairOptions, RepairReport, audit_table
from outbox.reconcile.report import as_json, as_text
from outbox.reconcile.session import spark_session
from outbox.reconcile.sources import JdbcSource, ParquetSource, PartitionPolicy, TableNames

__all__ = [  # noqa: RUF022 - grouped by purpose
    # running a job
    "ReconcileOptions",
    "ReconcileResult",
    "RepairOptions",
    "RepairReport",
    "reconcile",
    "PartitionPolicy",
    "Window",
    "spark_session",
    # verdicts and figures
    "Certificate",
    "IdDigest",
    "LogClass",
    "Oldest",
    "QueueFigures",
    "RepairAction",
    "StubClass",
    "Summary",
    "as_json",
    "as_text",
    # building blocks
    "Classified",
    "Inputs",
    "JdbcSource",
    "JdbcTarget",
    "ParquetSource",
    "TableNames",
    "QueueBoundsLike",
    "audit_table",
    "classify",
    "driver_jars",
    "jdbc_target",
    "parse_json",
    "read_bounds",
    # errors
    "DriverNotFound",
    "InvalidBounds",
    "InvalidOptions",
    "JavaNotFound",
    "JobFailed",
    "ReconcileError",
    "RepairFailed",
    "ReportWriteFailed",
    "SourceUnavailable",
]
