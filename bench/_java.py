"""The bench's Java program (bench/java: the official RocketMQ 5 Java client's cases), built
once and cached.

`bench_jar()` returns the runnable jar, built the first time from the sources under
bench/java into `<cache>/bench/java-<hash of the sources>/` (`<cache>` as
`apache_rocketmq.runtime.cache_root`: `$RELIABLE_CACHE_DIR`, else `~/.cache/reliable`).
Nothing is written into the work tree: Maven builds in a copy of the sources there, and
its jars stay in `~/.m2`. Changed sources build anew; a build is done under a file lock,
so two processes build once.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import time
from pathlib import Path

from apache_rocketmq.runtime import cache_root
from bench._common import progress

SOURCES = Path(__file__).resolve().parent / "java"
JAR_NAME = "reliable-bench.jar"


class ProgramUnavailable(RuntimeError):
    """The Java program could not be built (no Maven or Java, or a download failed)."""


def source_hash(root: Path = SOURCES) -> str:
    """16 hex digits naming the sources' paths and contents (build outputs left out)."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if "target" in path.relative_to(root).parts:
            continue
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _tool(name: str, hint: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ProgramUnavailable(f"{name} is not installed: {hint}")
    return found


def java() -> str:
    return _tool("java", "apt-get install openjdk-17-jre-headless")


def bench_jar() -> Path:
    """The jar, built the first time (minutes when Maven downloads the client)."""
    home = cache_root() / "bench" / f"java-{source_hash()}"
    jar = home / JAR_NAME
    if jar.exists():
        return jar
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait
        if not jar.exists():
            _build(home)
    return jar


def _build(home: Path) -> None:
    mvn = _tool("mvn", "apt-get install maven (scripts/ensure-system.sh does)")
    java()
    work = home / "build"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(SOURCES, work, ignore=shutil.ignore_patterns("target"))
    progress(f"building the Java bench program with Maven in {work} (once)")
    started = time.monotonic()
    proc = subprocess.run(
        [mvn, "-B", "-q", "package"], cwd=work, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        raise ProgramUnavailable(f"building the Java bench program failed:\n{tail}")
    partial = home / f"{JAR_NAME}.partial"
    shutil.copyfile(work / "target" / JAR_NAME, partial)
    partial.rename(home / JAR_NAME)
    shutil.rmtree(work, ignore_errors=True)
    progress(f"Java bench program built in {time.monotonic() - started:.0f} s")
