"""The SparkSession: `local[*]` by default, whatever `spark-submit` chose when run under it.

Importing this module does not import pyspark; `spark_session` does, and raises an
`ImportError` with the install hint when it is missing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from outbox.reconcile.drivers import JdbcDriver
from outbox.reconcile.errors import DriverNotFound

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"

# Settings the job relies on (timestamps are read and compared as UTC wall-clock values).
# Partitions are sized from the data: adaptive execution coalesces small shuffle
# partitions (the job also sets spark.sql.shuffle.partitions from the row counts).
BASE_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    # a cached plan (the classified rows, when a report or repair is asked) may be
    # coalesced too
    "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true",
    # PySpark 4 records the Python call site of every DataFrame and function call (for
    # the query context of error messages): five JVM round trips per call, read once per
    # process. Off, building the classification's DataFrames takes 40% less time (0.9 s
    # -> 0.55 s per run; 3.0 s -> 1.3 s in a fresh JVM); errors still name the failing
    # expression, without the Python line
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}
# Under spark-submit the job cannot choose log4j's file (the JVM already runs), but it can
# set the level before the SparkContext starts logging (`spark.log.level`): WARN, so a run
# prints warnings, not thousands of INFO lines. `--conf spark.log.level=INFO` restores it.
SUBMIT_LOG_LEVEL = "WARN"
# A local master binds the driver to loopback (no warning about a non-loopback address,
# no port open to the network); a cluster's driver address is the cluster's business
# (set SPARK_LOCAL_IP or spark.driver.host there).
LOCAL_IP = "127.0.0.1"

# A quiet local session: no web UI (no port taken), no stage progress bars, and log4j at
# ERROR (no WARN lines at start-up); the job reports its own progress instead. Any of them
# can be overridden with --conf; under spark-submit the cluster's settings stand.
QUIET_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}
LOG4J2_PROPERTIES = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
"""


def quiet_log4j2() -> str:
    """The path of a log4j2 configuration that logs errors only (written once)."""
    import hashlib
    import tempfile

    digest = hashlib.sha256(LOG4J2_PROPERTIES.encode()).hexdigest()[:12]
    path = os.path.join(tempfile.gettempdir(), f"reliable-reconcile-log4j2-{digest}.properties")
    if not os.path.isfile(path):
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(LOG4J2_PROPERTIES)
        os.replace(tmp, path)
    return path


def _pyspark() -> Any:
    try:
        import pyspark
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(
            "the reconciliation job needs PySpark: pip install 'reliable[spark]'"
        ) from exc
    return pyspark


def under_spark_submit() -> bool:
    """True when this process was started by `spark-submit` (the JVM already exists)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def submitted_conf() -> dict[str, str]:
    """The settings `spark-submit` gave this driver (`--jars`, `--conf`, ...): empty when
    not under spark-submit. Reading them connects to spark-submit's JVM."""
    if not under_spark_submit():
        return {}
    _pyspark()
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    return dict(SparkConf().getAll())


def split_jars(value: str | None) -> list[str]:
    """The entries of a `spark.jars` value (comma separated)."""
    return [j.strip() for j in (value or "").split(",") if j.strip()]


def merge_jars(*lists: Iterable[str]) -> list[str]:
    """Jar lists merged in order, each jar once: what spark-submit set is kept, never
    replaced."""
    return list(dict.fromkeys(j for jars in lists for j in jars if j))


def spark_session(
    master: str | None = None,
    jars: Iterable[str] = (),
    conf: Mapping[str, str] | None = None,
    app_name: str = "reliable-reconcile",
    java_options: Iterable[str] = (),
) -> SparkSession:
    """Get or create the session. `master=None` means `local[*]`, unless `spark-submit`
    started us (its `--master` stands). `jars` are added to `spark.jars`: after those
    spark-submit set (`--jars`) and those in `conf`, never instead of them. `java_options`
    are added to the driver JVM's options (after the caller's `spark.driver.
    extraJavaOptions`) when this call starts the JVM; under spark-submit, or with a JVM
    already running, they have no effect."""
    _pyspark()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    submitted = submitted_conf()
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    elif not under_spark_submit():
        builder = builder.master(DEFAULT_MASTER)
    # spark-submit's --conf stands over the job's defaults; the caller's conf over both
    settings = {
        **BASE_CONF,
        **{k: v for k, v in submitted.items() if k in BASE_CONF},
        **(conf or {}),
    }
    if under_spark_submit():
        if "spark.log.level" not in submitted:
            settings.setdefault("spark.log.level", SUBMIT_LOG_LEVEL)
    else:
        quiet = {
            **QUIET_CONF,
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{quiet_log4j2()}",
        }
        settings = {**quiet, **settings}
        extra = [settings.get("spark.driver.extraJavaOptions", ""), *java_options]
        settings["spark.driver.extraJavaOptions"] = " ".join(o for o in extra if o)
        if (master or DEFAULT_MASTER).startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", LOCAL_IP)  # the JVM inherits it
    merged = merge_jars(
        split_jars(submitted.get("spark.jars")), split_jars(settings.get("spark.jars")), jars
    )
    if merged:
        settings["spark.jars"] = ",".join(merged)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = _launch_filtered(builder) if not under_spark_submit() else builder.getOrCreate()
    if not under_spark_submit() and "spark.driver.extraJavaOptions" not in (conf or {}):
        session.sparkContext.setLogLevel("ERROR")
    return session


def add_to_driver(spark: SparkSession, jars: Iterable[str]) -> None:
    """Put local jars on the running driver's class path. Under spark-submit the driver
    JVM started before the job could name its jars (`--jdbc-jar`): `spark.jars` ships
    them to the executors, and this makes the driver load them too (spark-submit's own
    class loader takes more URLs)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    if loader is None or "MutableURLClassLoader" not in loader.getClass().getName():
        return  # not spark-submit's loader: the driver check says what is missing
    for jar in jars:
        if "://" in jar or not os.path.isfile(jar):
            continue
        loader.addURL(jvm.java.io.File(jar).toURI().toURL())


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
        raise DriverNotFound(
            driver.dialect, driver.driver_class, driver.package, [j for j in jars.split(",") if j]
        ) from None


# What the JVM prints on stderr at start whatever log4j says (Spark 4 adds an incubator
# module; a PySpark driver announces the shell's log level): dropped from a local
# session's stderr; every other line passes.
_JVM_NOISE = (
    b"WARNING: Using incubator modules",
    b"Setting default log level to",
    b"To adjust logging level use sc.setLogLevel",
)


def _launch_filtered(builder: Any) -> SparkSession:
    """`builder.getOrCreate()`, with the JVM it launches writing its stderr through a
    filter that drops the JVM's own start-up warnings (log4j cannot silence them)."""
    import threading

    from pyspark import SparkContext

    if SparkContext._gateway is not None:  # the JVM already runs: nothing to filter
        return builder.getOrCreate()  # type: ignore[no-any-return]
    read_fd, write_fd = os.pipe()
    original = os.dup(2)
    os.dup2(write_fd, 2)  # the JVM inherits this end as its stderr
    os.close(write_fd)
    try:
        session = builder.getOrCreate()
    finally:
        os.dup2(original, 2)  # our own stderr back; the pipe now holds the JVM's alone

    def forward() -> None:
        with os.fdopen(read_fd, "rb", buffering=0) as src:
            pending = b""
            while chunk := src.read(65536):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                out = b"".join(line + b"\n" for line in lines if not line.startswith(_JVM_NOISE))
                if out:
                    os.write(original, out)
            if pending:
                os.write(original, pending)

    threading.Thread(target=forward, name="spark-stderr", daemon=True).start()
    return session  # type: ignore[no-any-return]


def spark_errors() -> tuple[type[BaseException], ...]:
    """What Spark raises when a job fails (a JVM exception, or PySpark's own errors)."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    return (Py4JJavaError, PySparkException)


# The local properties that make a thread's job group (SparkContext.setJobGroup).
JOB_GROUP_KEYS = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")


class BorrowedSettings:
    """A session's settings changed for one run: each key's value from before its first
    change is kept, and `restore` puts them all back (unsetting a key that was unset)."""

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark
        self._conf: dict[str, str | None] = {}
        self._local: dict[str, str | None] = {}

    def set(self, key: str, value: str) -> None:
        """Set a setting of the session for the run."""
        if key not in self._conf:
            try:
                self._conf[key] = self._spark.conf.get(key)
            except spark_errors():  # neither set nor a setting with a default
                self._conf[key] = None
        self._spark.conf.set(key, value)

    def job_group(self, group_id: str, description: str) -> None:
        """Run this thread's jobs in a job group (to count their tasks afterwards)."""
        sc = self._spark.sparkContext
        for key in JOB_GROUP_KEYS:
            if key not in self._local:
                self._local[key] = sc.getLocalProperty(key)
        sc.setJobGroup(group_id, description, interruptOnCancel=False)

    def restore(self) -> None:
        for key, previous in self._conf.items():
            if previous is None:
                self._spark.conf.unset(key)
            else:
                self._spark.conf.set(key, previous)
        sc = self._spark.sparkContext
        for key, value in self._local.items():
            sc.setLocalProperty(key, value)  # type: ignore[arg-type]  # None: unset
        self._conf.clear()
        self._local.clear()


@contextmanager
def borrowed_settings(spark: SparkSession) -> Iterator[BorrowedSettings]:
    """The session's settings as the block leaves them are given back afterwards: a
    caller's session comes out of a run as it went in, whether the run failed or not."""
    settings = BorrowedSettings(spark)
    try:
        yield settings
    finally:
        settings.restore()
