"""Apache RocketMQ's jars, resolved from Maven Central once per version into a cache.

`apache_rocketmq/pom.xml` names the release (`rocketmq.version`) and the artifacts: the
name server, the broker, the proxy and the admin tools. `ensure_lib()` runs Maven's
`dependency:copy-dependencies` into `<cache>/rocketmq/<version>/lib` the first time and
returns that directory; later calls (and later runs, and other processes) find it ready.

The cache is `$RELIABLE_CACHE_DIR`, else `$XDG_CACHE_HOME/reliable`, else
`~/.cache/reliable`. A download is done under an exclusive file lock in the version's
directory, into `lib.partial`, renamed to `lib` when complete: two test workers starting
together download once, and an interrupted download is never taken for a finished one.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

POM = Path(__file__).with_name("pom.xml")
# named in full, so that a machine without it says which download failed, and every
# machine copies the same way
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"
_MAVEN_NS = "{http://maven.apache.org/POM/4.0.0}"


class RuntimeUnavailable(RuntimeError):
    """Apache RocketMQ's jars could not be had (no Maven, no Java, or the download failed)."""


def pinned_version() -> str:
    """The release the pom names: `<properties><rocketmq.version>`."""
    node = ET.parse(POM).getroot().find(f"{_MAVEN_NS}properties/{_MAVEN_NS}rocketmq.version")
    if node is None or not (node.text or "").strip():
        raise RuntimeUnavailable(f"{POM} names no rocketmq.version")
    return (node.text or "").strip()


def cache_root() -> Path:
    explicit = os.environ.get("RELIABLE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "reliable"


def _say(text: str) -> None:
    print(f"rocketmq: {text}", file=sys.stderr, flush=True)


def ensure_lib(version: str | None = None) -> Path:
    """The directory of jars for `version` (default: the pinned one), downloaded if absent."""
    version = version or pinned_version()
    home = cache_root() / "rocketmq" / version
    lib = home / "lib"
    if (lib / ".complete").exists():
        return lib
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be downloading: wait for it
        if not (lib / ".complete").exists():
            _download(version, home, lib)
    return lib


def _download(version: str, home: Path, lib: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeUnavailable(
            "Maven (mvn) is not installed: apt-get install maven (scripts/ensure-system.sh does)"
        )
    partial = home / "lib.partial"
    shutil.rmtree(partial, ignore_errors=True)
    _say(f"resolving Apache RocketMQ {version} from Maven Central into {lib} (once)")
    started = time.monotonic()
    cmd = [
        mvn,
        "-B",
        "-f",
        str(POM),
        f"-Drocketmq.version={version}",
        f"{DEPENDENCY_PLUGIN}:copy-dependencies",
        f"-DoutputDirectory={partial}",
    ]
    # Maven logs each file it downloads (pom, jar) and each jar it copies; a line every 100
    # keeps a first run visibly alive without printing hundreds of lines.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    errors: list[str] = []
    downloaded = copied = 0
    for line in proc.stdout:
        if line.startswith("[ERROR]"):
            errors.append(line[len("[ERROR]") :].strip())
        elif "Downloaded from" in line:
            downloaded += 1
            if downloaded % 100 == 0:
                _say(f"  {downloaded} files downloaded ...")
        elif "Copying " in line:
            copied += 1
    code = proc.wait()
    if code != 0:
        first = next((e for e in errors if e), f"mvn exited with {code}")
        raise RuntimeUnavailable(
            f"cannot resolve Apache RocketMQ {version} from Maven Central "
            f"(is it reachable from here?): {first[:400]}"
        )
    (partial / ".complete").write_text(version + "\n")
    shutil.rmtree(lib, ignore_errors=True)
    partial.rename(lib)
    _say(f"{copied} jars ({downloaded} files downloaded) in {time.monotonic() - started:.0f} s")
