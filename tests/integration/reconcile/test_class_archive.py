"""The class-data-sharing archive of a small run's JVM: written once under a temporary name,
named only when complete, mapped by later starts, and never a reason to fail."""

from __future__ import annotations

import subprocess
import sys
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
    ((_, tmp_arg, archive),) = exits
    assert tmp_arg == tmp and archive.name.endswith(".jsa")
    # a half-written or foreign file under the final name is not mapped: written anew
    archive.write_bytes(b"\0" * 64)
    again = classcache.archive_options(JAVA, [], OPTIONS, env)
    assert any(o.startswith("-XX:ArchiveClassesAtExit=") for o in again)
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
    classcache._finish(tmp, archive)  # closes the "JVM"'s stdin and waits for it
    assert not tmp.exists()
    assert archive.exists() == named


def test_leftovers_are_removed(tmp_path: Path, exits: list[tuple[Any, ...]]) -> None:
    """A temporary archive of a JVM that died (an hour old) and an archive no start mapped
    for a month are removed; a mapped archive's time says when it was last used."""
    import os
    import time

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
