"""Errors of the reconciliation job: narrow subclasses carrying what fixes them.

`ReconcileError` is the job's branch of the outbox's one root, `outbox.errors.OutboxError`.
"""

from __future__ import annotations

from outbox.errors import OutboxError


class ReconcileError(OutboxError):
    """Root of every error the reconciliation job raises (an `OutboxError`)."""


class InvalidOptions(ReconcileError):
    """The options do not describe a job that can run (bad URL, window, number)."""


class DriverNotFound(ReconcileError):
    """The JDBC driver for a database is neither installed nor configured."""

    def __init__(self, dialect: str, driver_class: str, package: str, searched: list[str]) -> None:
        self.dialect = dialect
        self.driver_class = driver_class
        self.package = package
        self.searched = searched
        where = ", ".join(searched) if searched else "nowhere"
        super().__init__(
            f"no JDBC driver for {dialect} ({driver_class}); searched {where}. "
            f"Install the Debian package `{package}` (apt-get install {package}), or point "
            f"--jdbc-jar (RELIABLE_JDBC_JARS) at the driver's jar"
        )


class JavaNotFound(ReconcileError):
    """No Java runtime for Spark: neither JAVA_HOME nor `java` on the PATH."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(
            f"Spark needs a Java runtime (17 or later): {detail}. Install one "
            "(apt-get install openjdk-17-jre-headless) or set JAVA_HOME to it"
        )


class SourceUnavailable(ReconcileError):
    """A table could not be read (database down, table missing, Parquet path missing)."""

    def __init__(self, what: str, detail: str) -> None:
        self.what = what
        self.detail = detail
        super().__init__(f"cannot read {what}: {detail}")


class InvalidBounds(ReconcileError):
    """A queue-bounds input is malformed (not JSON, a missing or non-integer offset, min
    above max): the job refuses to run rather than guess which copies are gone."""

    def __init__(self, where: str, detail: str) -> None:
        self.where = where
        self.detail = detail
        super().__init__(f"bad {where}: {detail}")


class JobFailed(ReconcileError):
    """Spark failed while classifying (bad data in a column, an executor lost, ...)."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"the reconciliation job failed: {detail}")


class ReportWriteFailed(ReconcileError):
    """The detail rows could not be written to the report table or Parquet path."""

    def __init__(self, target: str, detail: str) -> None:
        self.target = target
        self.detail = detail
        super().__init__(f"cannot write the report to {target}: {detail}")


class RepairFailed(ReconcileError):
    """A repair batch failed; batches committed before it stay committed (and audited)."""

    def __init__(self, done: int, detail: str) -> None:
        self.done = done
        self.detail = detail
        super().__init__(f"repair stopped after {done} changes: {detail}")
