"""Durable file writes: a file replaced atomically, and a directory entry made durable.

`write_atomically(path, data)` never leaves a half-written file under `path`, even across a
power cut:

1. the data goes to a temporary file in the same directory, `<name>.tmp.<pid>.<thread>`,
   which is fsynced;
2. the temporary file is renamed over `<name>` (atomic on POSIX);
3. the directory is fsynced (`fsync_directory`) so the rename itself survives a power cut.

A writer killed before the rename leaves its temporary file behind;
`remove_stale_temp_files(path)` deletes those of writer processes that no longer exist.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

TEMP_SUFFIX = ".tmp"


def fsync_directory(directory: Path) -> None:
    """Make a rename or a create in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data`: temp file -> fsync -> rename -> fsync directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}{TEMP_SUFFIX}.{os.getpid()}.{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_directory(path.parent)


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temp_files(path: Path) -> None:
    """Delete `write_atomically(path, ...)` temp files left by writer processes that no
    longer exist (a live writer's, this process's included, are kept)."""
    parent = path.parent
    if not parent.is_dir():
        return
    for stale in parent.glob(f"{path.name}{TEMP_SUFFIX}.*"):
        pid = stale.name[len(path.name) + len(TEMP_SUFFIX) + 1 :].partition(".")[0]
        if pid.isdigit() and not _process_alive(int(pid)):
            stale.unlink(missing_ok=True)
