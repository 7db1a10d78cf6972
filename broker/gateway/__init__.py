"""The gateway: the RocketMQ 5 gRPC front end of `reliable broker start`, in Go (docs/gateway.md).

The Go sources beside this module (`main.go`, `wire.go`, `codec.go`) serve gRPC and pass
each call to the broker over its native wire. `binary()` returns the built program: built
the first time from these sources with the `go` command (which downloads grpc-go from the
Go module proxy) into `<cache>/gateway/<hash of the sources>/reliable-gateway` (`<cache>`:
`$RELIABLE_CACHE_DIR`, else `$XDG_CACHE_HOME/reliable`, else `~/.cache/reliable`), and
reused while the sources are unchanged. Two processes asking at once build it once (a file
lock). Nothing is written beside the sources.

    path = binary()                       # GatewayUnavailable when it cannot be built
    subprocess.Popen([str(path), "--broker", "127.0.0.1:8081", "--listen", "0.0.0.0:9876"])
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

SOURCES = Path(__file__).resolve().parent
PROGRAM = "reliable-gateway"
BUILD_FILES = ("go.mod", "go.sum")


class GatewayUnavailable(RuntimeError):
    """The gateway could not be built: no Go toolchain, or the build failed (its output)."""


def cache_dir() -> Path:
    explicit = os.environ.get("RELIABLE_CACHE_DIR")
    if explicit:
        return Path(explicit) / "gateway"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "reliable" / "gateway"


def source_files() -> list[Path]:
    return sorted(
        p for p in SOURCES.iterdir() if p.is_file() and (p.suffix == ".go" or p.name in BUILD_FILES)
    )


def source_hash() -> str:
    """16 hex digits naming the Go sources' names and contents."""
    h = hashlib.sha256()
    for path in source_files():
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def binary(*, quiet: bool = False) -> Path:
    """The built gateway, built now if these sources never were (a first build downloads
    grpc-go and compiles it: about a minute; it says so on stderr unless `quiet`)."""
    home = cache_dir() / source_hash()
    done = home / PROGRAM
    if done.exists():
        return done
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait
        if not done.exists():
            _build(home, quiet)
    return done


def _build(home: Path, quiet: bool) -> None:
    go = shutil.which("go")
    if go is None:
        raise GatewayUnavailable(
            "the gateway is built with Go 1.26 or later, and `go` is not on the PATH"
        )
    partial = home / f"{PROGRAM}.partial"
    if not quiet:
        print(f"reliable gateway: building {home / PROGRAM} with {go}", file=sys.stderr)
    started = time.monotonic()
    proc = subprocess.run(
        [go, "build", "-mod=readonly", "-trimpath", "-o", str(partial), "."],
        cwd=SOURCES,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-30:])
        raise GatewayUnavailable(f"go build failed (exit {proc.returncode}):\n{tail}")
    partial.rename(home / PROGRAM)
    if not quiet:
        print(f"reliable gateway: built in {time.monotonic() - started:.0f} s", file=sys.stderr)


__all__ = ["PROGRAM", "SOURCES", "GatewayUnavailable", "binary", "cache_dir", "source_hash"]
