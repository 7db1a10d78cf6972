"""A free TCP port for a server to be started on this machine, from outside the ephemeral range.

    port = free_port()                  # then: start a server that binds it
    ports = {free_port(taken) for _ in range(3)}   # several, all different

Binding port 0 finds a free port, but one from the kernel's ephemeral range
(`net.ipv4.ip_local_port_range`, 32768-60999 by default), which the kernel also hands to
every outgoing connection and to every other bind to port 0. Between the pick and the
server's own bind (a JVM takes seconds to start) another process may take it, and the
server fails with "Address already in use": on a machine running a test suite in parallel
workers, each opening connections, that happened. A port below the ephemeral range (and
above the well-known services' ports) is never handed out by the kernel; only another
pick like this one can take it, and picks are random over about 12,000 ports.

Two processes picking at once (the workers of a parallel test suite, a bench run beside
it) could still draw the same port. Each pick therefore takes an exclusive `flock` on a
file named after the port (`<tmp>/reliable-ports/<port>.lock`) and holds it for as long as
the process lives (the newest `HELD` of them): another process skips a port whose lock it
cannot take. The kernel drops the locks of a process that exits, killed or not, so no
reservation outlives its owner.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

FLOOR = 20_000  # the lowest port picked: below are the usual services' (PostgreSQL, Redis, ...)
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DEFAULT_RANGE = (32768, 60999)
_MIN_POOL = 1_000  # fewer ports than this below the ephemeral range: bind port 0 instead
_TRIES = 200
# a generator of its own: a test that seeds the module's `random` must not make two
# processes pick the same sequence of ports
_rng = random.Random()
# every port handed out in this process: two servers started side by side (two Apache
# RocketMQ clusters, each picking before either binds) never get the same one
_given: set[int] = set()
_given_lock = threading.Lock()
HELD = 512  # reservations a process keeps: a port picked that long ago is bound or let go
_held: OrderedDict[int, int] = OrderedDict()  # port -> the descriptor holding its lock


def _lock_dir() -> Path:
    return Path(tempfile.gettempdir()) / "reliable-ports"


def _reserve(port: int) -> bool:
    """Take the machine-wide lock on `port` for this process; False when another process
    holds it. A directory that cannot be written reserves nothing (and refuses nothing)."""
    directory = _lock_dir()
    try:
        directory.mkdir(mode=0o1777, exist_ok=True)
        fd = os.open(directory / f"{port}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _held[port] = fd
    while len(_held) > HELD:
        _port, old = _held.popitem(last=False)
        with contextlib.suppress(OSError):
            os.close(old)
    return True


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (low, high); Linux's default when unreadable."""
    try:
        low, high = (int(part) for part in _RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return _DEFAULT_RANGE
    return low, high


def bindable(port: int) -> bool:
    """Whether a listener could bind `port` now, on every address (a server binding
    0.0.0.0 fails when another holds the port on one address only)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


def free_port(taken: set[int] | None = None) -> int:
    """A port no one listens on, below the ephemeral range, never handed out before in this
    process nor held by another process's pick, and not in `taken` (which gets it added).
    Where that range leaves too few ports, a port the kernel picks."""
    taken = taken if taken is not None else set()
    low, _high = ephemeral_range()
    with _given_lock:
        if low - FLOOR >= _MIN_POOL:
            for _ in range(_TRIES):
                port = _rng.randint(FLOOR, low - 1)
                if port not in taken and port not in _given and bindable(port) and _reserve(port):
                    break
            else:
                port = _kernel_port(taken)
        else:
            port = _kernel_port(taken)
        _given.add(port)
    taken.add(port)
    return port


def _kernel_port(taken: set[int]) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in taken and port not in _given:
            return port
