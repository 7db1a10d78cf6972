"""A class-data-sharing archive for the driver JVM the job starts for a small input.

Most of the JVM's start, and much of the first run after it, is loading and verifying
Spark's classes. Java 17 can write the classes a JVM loaded to an archive when it exits
(`-XX:ArchiveClassesAtExit`) and map them from it at a later start
(`-XX:SharedArchiveFile`): the first small run in a cache directory writes it, the later
ones start from it.

Safe when missing, stale or half written:

- the archive's name is a digest of what it depends on (the java executable, Spark's jars,
  the job's jars, the JVM options), so another installation or another set of jars names
  another archive;
- a JVM writes it to a temporary name, and it takes its final name (an atomic rename) only
  after that JVM exited cleanly and the file starts with the archive's magic number: a JVM
  never maps a file that is still being written;
- a JVM that cannot use an archive (the jars changed under the same name, another JDK
  build) starts without it; `-Xlog:cds=off` keeps its warnings (and the thousands the
  writing JVM prints about classes it cannot archive) off stdout, where `--json` writes;
- an archive no start mapped for 30 days is removed (each takes about 190 MB), as is a
  temporary one left by a JVM that died.

`RELIABLE_RECONCILE_CDS_DIR` names the cache directory (default
`$XDG_CACHE_HOME/reliable/reconcile-cds`, else `~/.cache/reliable/reconcile-cds`); set it
empty for no archive.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger("outbox.reconcile")

CDS_DIR_ENV = "RELIABLE_RECONCILE_CDS_DIR"
# what a JVM that maps (or writes) an archive is also given: no CDS log lines on stdout
QUIET_CDS = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")
# the first four bytes of a dynamic archive (JDK 17, little-endian 0xf00baba8)
DYNAMIC_MAGIC = bytes.fromhex("a8ab0bf0")
# how long the process waits at exit for its JVM to write the archive
WRITE_TIMEOUT_S = 180.0
# a temporary archive untouched this long belongs to a JVM that died: removed
STALE_TMP_S = 3600.0
# an archive no start mapped for this long (another installation's, older jars'): removed
UNUSED_ARCHIVE_S = 30 * 86400.0


def cache_dir(env: dict[str, str] | None = None) -> Path | None:
    """The archive directory, or None when archives are off (the variable set empty)."""
    env = dict(os.environ) if env is None else env
    if CDS_DIR_ENV in env:
        value = env[CDS_DIR_ENV].strip()
        return Path(value) if value else None
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "reliable" / "reconcile-cds"


def _stamp(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return f"{path}:-"
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def _spark_jars_dir() -> str:
    home = os.environ.get("SPARK_HOME")
    if home:
        return os.path.join(home, "jars")
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "jars")


def archive_key(java: str, jars: Iterable[str], java_options: Iterable[str]) -> str:
    """A digest of what an archive depends on: the JVM, Spark's jars, the job's jars and
    the JVM options."""
    parts = [_stamp(os.path.realpath(java)), " ".join(java_options)]
    spark_jars = _spark_jars_dir()
    try:
        names = sorted(os.listdir(spark_jars))
    except OSError:
        names = []
    parts.append(spark_jars)
    parts.extend(_stamp(os.path.join(spark_jars, n)) for n in names)
    parts.extend(_stamp(j) if "://" not in j else j for j in jars)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def archive_options(
    java: str, jars: Iterable[str], java_options: Iterable[str], env: dict[str, str] | None = None
) -> tuple[str, ...]:
    """The JVM options that map this configuration's archive, or, when there is none yet,
    that write it at the JVM's exit (this process then waits for it at its own exit and
    gives it its final name). Empty when archives are off or the directory is unusable."""
    archive = archive_path(java, jars, java_options, env)
    if archive is None or _jvm_running():
        return ()  # off, or this process's JVM runs already (its options are fixed)
    directory = archive.parent
    mapped = is_archive(archive)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if mapped:
            os.utime(archive)  # its time says when it was last mapped
        _remove_stale(directory)
    except OSError as exc:
        log.debug("no class archive: %s", exc)
        return ()
    if mapped:
        return mapping_options(archive)
    claim = _claim(archive)
    if claim is None:
        log.info("another process is writing the class archive; starting without it")
        return ()
    tmp = directory / f"{archive.name}.{os.getpid()}.{time.time_ns()}.tmp"
    atexit.register(_finish, tmp, archive, claim)
    log.info("writing a class archive for later starts at exit: %s", archive)
    return (f"-XX:ArchiveClassesAtExit={tmp}", *QUIET_CDS)


def mapping_options(archive: Path) -> tuple[str, ...]:
    """The JVM options that map the complete archive at `archive` (`is_archive`)."""
    return (f"-XX:SharedArchiveFile={archive}", *QUIET_CDS)


def archive_path(
    java: str,
    jars: Iterable[str],
    java_options: Iterable[str],
    env: dict[str, str] | None = None,
) -> Path | None:
    """Where this configuration's archive is (or would be) kept; None when archives are
    off."""
    directory = cache_dir(env)
    if directory is None:
        return None
    return directory / f"spark-{archive_key(java, list(jars), list(java_options))}.jsa"


def _claim(archive: Path) -> Path | None:
    """The right to write `archive`, one process at a time: a file created only if absent
    (a claim older than `STALE_TMP_S` belongs to a process that died, and is taken over).
    Writing an archive costs its JVM a slower run and a dump of about 190 MB at exit;
    two processes starting together would both pay it for one file."""
    claim = archive.with_name(f"{archive.name}.writing")
    for _ in range(2):
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                if time.time() - claim.stat().st_mtime <= STALE_TMP_S:
                    return None
                claim.unlink()
            except FileNotFoundError:
                pass  # released meanwhile: try again
            continue
        except OSError as exc:
            log.debug("no class archive: %s", exc)
            return None
        with os.fdopen(fd, "w") as fh:
            fh.write(str(os.getpid()))
        return claim
    return None


def _jvm_running() -> bool:
    from pyspark import SparkContext

    return SparkContext._gateway is not None


def is_archive(path: Path) -> bool:
    """A complete archive (what a start would map): it starts with the magic number."""
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == DYNAMIC_MAGIC
    except OSError:
        return False


def _remove_stale(directory: Path) -> None:
    """Temporary archives of JVMs that died, and archives no start has mapped for a month
    (each is about 190 MB)."""
    now = time.time()
    for pattern, age in (
        ("*.tmp", STALE_TMP_S),
        ("*.writing", STALE_TMP_S),
        ("spark-*.jsa", UNUSED_ARCHIVE_S),
    ):
        for path in directory.glob(pattern):
            try:
                if now - path.stat().st_mtime > age:
                    path.unlink()
            except OSError:
                continue


def _finish(tmp: Path, archive: Path, claim: Path) -> None:
    """At this process's exit: let the JVM exit (its stdin closes: PySpark's gateway then
    exits), wait for it to write the archive, give the archive its name, and release the
    claim."""
    try:
        if _wait_for_jvm() and is_archive(tmp):
            os.replace(tmp, archive)
    except Exception as exc:  # never fail the process's exit over a cache
        log.debug("class archive not written: %s", exc)
    finally:
        for path in (tmp, claim):
            with contextlib.suppress(OSError):
                path.unlink()


def _wait_for_jvm() -> bool:
    """Stop this process's JVM and wait for its exit: True when it exited cleanly."""
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    if proc is None:
        return False
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    if proc.stdin is not None:
        proc.stdin.close()
    return bool(proc.wait(timeout=WRITE_TIMEOUT_S) == 0)
