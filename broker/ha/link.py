"""TLS on the replication link.

A master whose broker has a certificate (`--tls-cert`/`--tls-key`, the client port's)
serves its HA port over TLS with it; a slave given a CA (`--ha-tls-ca`) dials over TLS and
verifies the master's certificate against that CA and the master's host name or address.

The master reads a slave's reports on one thread while it streams on another, and an
OpenSSL connection must not be read and written from two threads at once. So the TLS
state is an `ssl.SSLObject` over memory buffers, guarded by a lock: the threads block on
the plain socket outside it, and only encrypt or decrypt under it (`TlsLink`).
"""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path
from typing import Any, cast

from broker.ha.protocol import HaProtocolError

_READ = 64 << 10


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """The master's side: its certificate chain and key (TLS 1.2 or later)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


def client_context(ca: Path) -> ssl.SSLContext:
    """The slave's side: the master's certificate must chain to `ca` and name the host
    the slave dials (`--master`)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


class TlsLink:
    """A TLS connection over a blocking socket that one thread may read while another
    writes (see the module docstring). Offers what the replication code uses of a socket."""

    def __init__(
        self,
        sock: socket.socket,
        ctx: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None = None,
    ) -> None:
        self.sock = sock
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._tls = ctx.wrap_bio(
            self._in, self._out, server_side=server_side, server_hostname=server_hostname
        )
        self._lock = threading.Lock()  # the TLS state
        self._send_lock = threading.Lock()  # records leave in the order they were made

    def handshake(self) -> None:
        """Complete the TLS handshake (within the socket's timeout). ssl.SSLError when
        it fails (a certificate that does not verify, a peer that does not speak TLS)."""
        while True:
            with self._lock:
                try:
                    self._tls.do_handshake()
                    done = True
                except ssl.SSLWantReadError:
                    done = False
                out = self._out.read()
            if out:
                self.sock.sendall(out)
            if done:
                return
            data = self.sock.recv(_READ)
            if not data:
                raise HaProtocolError("the peer closed the connection during the TLS handshake")
            with self._lock:
                self._in.write(data)

    def sendall(self, data: bytes, /) -> None:
        with self._send_lock:
            with self._lock:
                self._tls.write(data)
                out = self._out.read()
            self.sock.sendall(out)

    def _flush(self) -> None:
        with self._send_lock:
            with self._lock:
                out = self._out.read()
            if out:
                self.sock.sendall(out)

    def recv_into(self, buffer: memoryview, nbytes: int = 0) -> int:
        n = nbytes or len(buffer)
        while True:
            with self._lock:
                try:
                    got: int | None = int(cast(Any, self._tls).read(n, buffer))
                except ssl.SSLWantReadError:
                    got = None
                except ssl.SSLZeroReturnError:  # the peer closed the TLS session
                    got = 0
                pending = self._out.pending
            if pending:  # what reading produced (a post-handshake message's answer)
                self._flush()
            if got is not None:
                return got
            data = self.sock.recv(_READ)
            if not data:
                return 0
            with self._lock:
                self._in.write(data)

    def recv(self, n: int) -> bytes:
        buf = bytearray(n)
        got = self.recv_into(memoryview(buf), n)
        return bytes(buf[:got])

    def settimeout(self, value: float | None, /) -> None:
        self.sock.settimeout(value)

    def shutdown(self, how: int, /) -> None:
        self.sock.shutdown(how)

    def close(self) -> None:
        self.sock.close()
