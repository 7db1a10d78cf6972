"""The interop scenario programs of the official Java and Go clients, built once and cached.

`java_program()` and `go_program()` return the command line that runs a program
(tests/interop/README.md); the program itself is built the first time, from the sources
under tests/interop/java and tests/interop/go, into
`<cache>/interop/<language>-<hash of the sources>/` (`<cache>` as `apache_rocketmq.cache_root`:
`$RELIABLE_CACHE_DIR`, else `~/.cache/reliable`). Nothing is written into the work tree:
Maven builds in a copy of the sources there, and its jars stay in `~/.m2`; Go's modules and
build cache stay in its own caches. Changed sources build anew; a build is done under a
file lock, so two processes build once.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from apache_rocketmq.runtime import cache_root

HERE = Path(__file__).resolve().parent
JAVA_SOURCES = HERE / "java"
GO_SOURCES = HERE / "go"
JAR_NAME = "reliable-interop.jar"


class ProgramUnavailable(RuntimeError):
    """An interop program could not be built (no toolchain, or a download failed)."""


def say(text: str) -> None:
    print(f"interop: {text}", file=sys.stderr, flush=True)


def source_files(root: Path) -> list[Path]:
    """The files a program is built from: everything under `root` but build outputs."""
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and "target" not in p.relative_to(root).parts and p.name != "interop"
    )


def source_hash(root: Path) -> str:
    """16 hex digits naming the sources' paths and contents."""
    h = hashlib.sha256()
    for path in source_files(root):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _tool(name: str, hint: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ProgramUnavailable(f"{name} is not installed: {hint}")
    return found


def _run(cmd: list[str], cwd: Path, what: str, downloads: Iterable[str]) -> None:
    """Run a build, saying every 50th download on stderr; raise with its last lines."""
    marks = tuple(downloads)
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    tail: list[str] = []
    fetched = 0
    for line in proc.stdout:
        tail = [*tail[-29:], line.rstrip()]
        if any(mark in line for mark in marks):
            fetched += 1
            if fetched % 50 == 0:
                say(f"  {what}: {fetched} files downloaded ...")
    code = proc.wait()
    if code != 0:
        raise ProgramUnavailable(f"{what} failed (exit {code}):\n" + "\n".join(tail))
    say(f"{what}: done in {time.monotonic() - started:.0f} s ({fetched} downloads)")


def _build_once(kind: str, sources: Path, product: str, build: Callable[[Path], None]) -> Path:
    """`<cache>/interop/<kind>-<hash>/<product>`, made by `build(dir)` the first time."""
    home = cache_root() / "interop" / f"{kind}-{source_hash(sources)}"
    done = home / product
    if done.exists():
        return done
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait
        if not done.exists():
            build(home)
    return done


def _build_java(home: Path) -> None:
    mvn = _tool("mvn", "apt-get install maven (scripts/ensure-system.sh does)")
    _tool("java", "apt-get install openjdk-17-jre-headless")
    work = home / "build"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(JAVA_SOURCES, work, ignore=shutil.ignore_patterns("target"))
    say(f"building the Java program with Maven in {work} (the first run downloads the client)")
    _run([mvn, "-B", "package"], work, "Java program", ["Downloaded from"])
    partial = home / f"{JAR_NAME}.partial"
    shutil.copyfile(work / "target" / JAR_NAME, partial)
    partial.rename(home / JAR_NAME)
    shutil.rmtree(work, ignore_errors=True)


def _build_go(home: Path) -> None:
    go = _tool(
        "go", "install Go 1.25 or later from https://go.dev/dl (Debian 12 packages an older one)"
    )
    say(f"building the Go program into {home} (the first run downloads and compiles the client)")
    partial = home / "interop.partial"
    _run(
        [go, "build", "-mod=readonly", "-o", str(partial), "."],
        GO_SOURCES,
        "Go program",
        ["go: downloading"],
    )
    partial.rename(home / "interop")


def java_program(log_dir: Path) -> list[str]:
    """The command running the Java program; the client logs under `log_dir`."""
    jar = _build_once("java", JAVA_SOURCES, JAR_NAME, _build_java)
    return ["java", f"-Drocketmq.log.root={log_dir}", "-jar", str(jar)]


def go_program() -> list[str]:
    """The command running the Go program (its client logs where the environment
    variable `rocketmq.client.logRoot` says)."""
    return [str(_build_once("go", GO_SOURCES, "interop", _build_go))]
