"""The SparkSession: `local[*]` by default, whatever `spark-submit` chose when run under it.

Importing this module does not import pyspark; `spark_session` does, and raises an
`ImportError` with the install hint when it is missing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from outbox.reconcile.drivers import JdbcDriver
from outbox.reconcile.errors import DriverNotFound

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"

# Settings the job relies on (timestamps are read and compared as UTC wall-clock values).
BASE_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
}


def _pyspark() -> Any:
    try:
        import pyspark
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(
            "the reconciliation job needs PySpark: pip install 'reliable[spark]'") from exc
    return pyspark


def under_spark_submit() -> bool:
    """True when this process was started by `spark-submit` (the JVM already exists)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def spark_session(master: str | None = None, jars: Iterable[str] = (),
                  conf: Mapping[str, str] | None = None,
                  app_name: str = "reliable-reconcile") -> SparkSession:
    """Get or create the session. `master=None` means `local[*]`, unless `spark-submit`
    started us (its `--master` stands). `jars` are added to `spark.jars`."""
    _pyspark()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    elif not under_spark_submit():
        builder = builder.master(DEFAULT_MASTER)
    settings = {**BASE_CONF, **(conf or {})}
    jar_list = [j for j in jars if j]
    if jar_list:
        existing = settings.get("spark.jars", "")
        settings["spark.jars"] = ",".join([*filter(None, existing.split(",")), *jar_list])
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def require_driver(spark: SparkSession, driver: JdbcDriver) -> None:
    """Fail now, with the fix, when the driver class cannot be loaded in this session."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    from py4j.protocol import Py4JJavaError

    try:
        loader = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
        jvm.java.lang.Class.forName(driver.driver_class, True, loader)
    except Py4JJavaError as exc:
        java_class = exc.java_exception.getClass().getName()
        if java_class != "java.lang.ClassNotFoundException":
            raise
        jars = spark.sparkContext.getConf().get("spark.jars", "") or ""
        raise DriverNotFound(driver.dialect, driver.driver_class, driver.package,
                             [j for j in jars.split(",") if j]) from None
