"""The class-data-sharing archive of a small run's JVM: written once under a temporary name,
named only when complete, mapped by later starts, and never a reason to fail."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from outbox.reconcile import classcache

JAVA = sys.executable  # any existing file: the key only reads its size and time
OPTIONS = ("-XX:TieredStopAtLevel=1",)


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """What would run at the process's exit (not run: the test calls it)."""
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(classcache.atexit, "register", lambda fn, *a: calls.append((fn, *a)))
    # as in a process that has not started its JVM yet (the package's session may run)
    monkeypatch.setattr(classcache, "_jvm_running", lambda: False)
    return calls


def test_no_archive_option_once_the_jvm_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exits: list[tuple[Any, ...]]
) -> None:
    monkeypatch.setattr(classcache, "_jvm_running", lambda: True)
    env = {classcache.CDS_DIR_ENV: str(tmp_path)}
    assert classcache.archive_options(JAVA, [], OPTIONS, env) == ()
    assert exits == []


def test_the_directory_comes_from_the_environment(
    tmp_path: Path, exits: list[tuple[Any, ...]]
) -> None:
    env = {classcache.CDS_DIR_ENV: str(tmp_path)}
    assert classcache.cache_dir(env) == tmp_path
    assert classcache.cache_dir({classcache.CDS_DIR_ENV: ""}) is None  # off
    assert classcache.cache_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/reliable/reconcile-cds")
    assert classcache.archive_options(JAVA, [], OPTIONS, {classcache.CDS_DIR_ENV: ""}) == ()


def test_the_first_start_writes_under_a_temporary_name_later_ones_map_it(
    tmp_path: Path, exits: list[tuple[Any, ...]]
) -> None:
    env = {classcache.CDS_DIR_ENV: str(tmp_path / "cds")}
    first = classcache.archive_options(JAVA, [], OPTIONS, env)
    write = [o for o in first if o.startswith("-XX:ArchiveClassesAtExit=")]
    assert len(write) == 1 and set(classcache.QUIET_CDS) <= set(first)
    tmp = Path(write[0].split("=", 1)[1])
    assert tmp.name.endswith(".tmp") and tmp.parent == tmp_path / "cds"
    ((_, tmp_arg, archive, claim),) = exits
    assert tmp_arg == tmp and archive.name.endswith(".jsa") and claim.exists()
    claim.unlink()  # as the first process's exit does
    # a half-written or foreign file under the final name is not mapped: written anew
    archive.write_bytes(b"\0" * 64)
    again = classcache.archive_options(JAVA, [], OPTIONS, env)
    assert any(o.startswith("-XX:ArchiveClassesAtExit=") for o in again)
    exits[-1][3].unlink()
    archive.write_bytes(classcache.DYNAMIC_MAGIC + b"\0" * 64)
    mapped = classcache.archive_options(JAVA, [], OPTIONS, env)
    assert mapped == (f"-XX:SharedArchiveFile={archive}", *classcache.QUIET_CDS)
    # another configuration (other JVM options, other jars) names another archive
    other = classcache.archive_options(JAVA, [], ("-Xss4m",), env)
    assert any(o.startswith("-XX:ArchiveClassesAtExit=") for o in other)
    assert classcache.archive_key(JAVA, [], OPTIONS) != classcache.archive_key(
        JAVA, [JAVA], OPTIONS
    )


class _Gateway:
    def __init__(self, code: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"import sys; sys.stdin.read(); sys.exit({code})"],
            stdin=subprocess.PIPE,
        )


@pytest.mark.parametrize(
    ("content", "code", "named"),
    [
        pytest.param(classcache.DYNAMIC_MAGIC + b"rest", 0, True, id="complete"),
        pytest.param(b"\0\0\0\0rest", 0, False, id="no-header"),
        pytest.param(classcache.DYNAMIC_MAGIC + b"rest", 1, False, id="jvm-failed"),
    ],
)
def test_the_archive_is_named_only_after_a_clean_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes, code: int, named: bool
) -> None:
    from pyspark import SparkContext

    monkeypatch.setattr(SparkContext, "_gateway", _Gateway(code))
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    tmp, archive = tmp_path / "a.jsa.1.tmp", tmp_path / "a.jsa"
    tmp.write_bytes(content)
    claim = tmp_path / "a.jsa.writing"
    claim.write_text("1")
    classcache._finish(tmp, archive, claim)  # closes the "JVM"'s stdin and waits for it
    assert not tmp.exists() and not claim.exists()
    assert archive.exists() == named


def test_one_process_writes_an_archive_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exits: list[tuple[Any, ...]]
) -> None:
    """A second start while the first writes runs without an archive (no second dump of
    the same file); once the first finished, or its claim is an hour old (it died), the
    next start writes."""
    env = {classcache.CDS_DIR_ENV: str(tmp_path)}
    first = classcache.archive_options(JAVA, [], OPTIONS, env)
    assert any(o.startswith("-XX:ArchiveClassesAtExit=") for o in first)
    assert classcache.archive_options(JAVA, [], OPTIONS, env) == ()
    assert len(exits) == 1
    ((fn, tmp, archive, claim),) = exits
    monkeypatch.setattr(classcache, "_wait_for_jvm", lambda: False)  # its JVM failed
    fn(tmp, archive, claim)  # its exit: nothing named, the claim released
    assert not claim.exists() and not archive.exists()
    second = classcache.archive_options(JAVA, [], OPTIONS, env)
    assert any(o.startswith("-XX:ArchiveClassesAtExit=") for o in second)
    old = time.time() - classcache.STALE_TMP_S - 60
    os.utime(exits[-1][3], (old, old))  # the second died holding it
    third = classcache.archive_options(JAVA, [], OPTIONS, env)
    assert any(o.startswith("-XX:ArchiveClassesAtExit=") for o in third)
    assert len(exits) == 3


def test_leftovers_are_removed(tmp_path: Path, exits: list[tuple[Any, ...]]) -> None:
    """A temporary archive of a JVM that died (an hour old) and an archive no start mapped
    for a month are removed; a mapped archive's time says when it was last used."""
    env = {classcache.CDS_DIR_ENV: str(tmp_path)}
    old = time.time() - 40 * 86400
    dead, unused, fresh = tmp_path / "x.jsa.1.tmp", tmp_path / "spark-0.jsa", tmp_path / "y.tmp"
    for path in (dead, unused, fresh):
        path.write_bytes(classcache.DYNAMIC_MAGIC)
    os.utime(dead, (old, old))
    os.utime(unused, (old, old))
    classcache.archive_options(JAVA, [], OPTIONS, env)
    assert not dead.exists() and not unused.exists() and fresh.exists()
    archive = tmp_path / f"spark-{classcache.archive_key(JAVA, [], OPTIONS)}.jsa"
    archive.write_bytes(classcache.DYNAMIC_MAGIC)
    os.utime(archive, (old + 86400, old + 86400))  # 39 days: removed unless it is mapped
    assert classcache.archive_options(JAVA, [], OPTIONS, env)[0].startswith("-XX:Shared")
    assert time.time() - archive.stat().st_mtime < 60


def _write_archive(env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    import json

    done = subprocess.run(
        [sys.executable, "-m", "outbox.reconcile.write_archive", "--json"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def test_write_archive_says_present_or_off_without_starting_a_jvm(tmp_path: Path) -> None:
    """The command's cheap answers (writing one is what `make test` runs before the suite:
    its line is in every run's output)."""
    from outbox.reconcile.job import SMALL_INPUT_JAVA_OPTIONS, session_jars
    from outbox.reconcile.preflight import find_java

    env = {classcache.CDS_DIR_ENV: str(tmp_path)}
    archive = classcache.archive_path(
        find_java(), session_jars("sqlite"), SMALL_INPUT_JAVA_OPTIONS, env
    )
    assert archive is not None
    archive.write_bytes(classcache.DYNAMIC_MAGIC + b"\0" * 64)
    code, out = _write_archive(env)
    assert (code, out["state"], out["archive"]) == (0, "present", str(archive))
    code, out = _write_archive({classcache.CDS_DIR_ENV: ""})
    assert (code, out["state"], out["archive"]) == (0, "off", None)


def test_every_database_names_the_same_archive_and_a_configured_jar_comes_first(
    tmp_path: Path,
) -> None:
    from outbox.reconcile.job import session_jars

    lists = {d: session_jars(d) for d in ("sqlite", "postgresql", "mysql")}
    assert len({tuple(v) for v in lists.values()}) == 1, lists
    keys = {classcache.archive_key(JAVA, v, OPTIONS) for v in lists.values()}
    assert len(keys) == 1
    mine = tmp_path / "postgresql-42.jar"
    mine.write_bytes(b"PK")
    jars = session_jars("postgresql", (str(mine),))
    assert jars[0] == str(mine) and set(lists["sqlite"]) <= set(jars)
